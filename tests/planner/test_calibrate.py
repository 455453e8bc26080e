import dataclasses

import pytest
import torch

from engine.policy import Policy
from planner import calibrate
from planner.errors import HardwareSpecError
from planner.hardware import HardwareSpec
from planner.predict import predict
from planner.workload import Workload
from tests.planner.specs import SMALL, cpu_machine


def test_the_run_scale_multiplies_cpu_time_and_nothing_else():
    hw, work, policy = cpu_machine(), Workload(16, 4, 8), Policy(gbs=8, num_gb=1)
    base = predict(SMALL, hw, work, policy)
    scaled = predict(SMALL, dataclasses.replace(hw, cpu_run_scale=1.5), work, policy)
    assert scaled.total_s == pytest.approx(1.5 * base.total_s)
    assert scaled.peak_bytes == base.peak_bytes


def test_the_run_scale_prices_compute_and_not_the_bytes_read_from_disk():
    """The calibration block computes with every weight in memory: its scale says nothing of the disk, so a step
    bound by reading weights costs what the disk takes, whatever the scale."""
    fast = cpu_machine()
    hw = dataclasses.replace(fast, disk_read_bytes_per_s=fast.disk_read_bytes_per_s / 100,
                             page_cache_bytes_per_s=fast.page_cache_bytes_per_s / 100)  # a slow disk
    work = Workload(16, 4, 8)
    policy = Policy(gbs=8, num_gb=1, weight_gpu=0.0, weight_cpu=0.0)  # every layer read from the disk at each step
    base = predict(SMALL, hw, work, policy).decode
    scaled = predict(SMALL, dataclasses.replace(hw, cpu_run_scale=1.5), work, policy).decode
    assert scaled.channels_s["cpu"]["disk_read"] == base.channels_s["cpu"]["disk_read"] > 0
    assert scaled.channels_s["cpu"]["compute"] == pytest.approx(1.5 * base.channels_s["cpu"]["compute"])
    disk = base.layers["cpu"] * base.channels_s["cpu"]["disk_read"]
    assert base.bound_s == pytest.approx(disk) and scaled.bound_s == pytest.approx(disk)  # disk-bound either way
    assert scaled.step_s < 1.5 * base.step_s


def test_a_hand_written_spec_has_no_scale_and_a_bad_one_is_refused():
    assert cpu_machine().cpu_run_scale == 1.0
    with pytest.raises(HardwareSpecError, match="cpu_run_scale"):
        HardwareSpec.from_dict({**cpu_machine().to_dict(), "cpu_run_scale": 0.0})


@pytest.mark.parametrize(("measured", "scale"), [(0.3, 1.5), (10.0, calibrate.SCALE_RANGE[1]),
                                                 (0.0001, calibrate.SCALE_RANGE[0])])
def test_the_scale_is_measured_over_predicted_within_its_range(monkeypatch, measured, scale):
    hw = cpu_machine()
    monkeypatch.setattr(calibrate, "block_seconds", lambda *a, **k: measured)
    monkeypatch.setattr(calibrate, "predict", lambda *a, **k: type("P", (), {"total_s": 0.2})())
    assert calibrate.cpu_run_scale(hw, torch.float32) == pytest.approx(scale)
