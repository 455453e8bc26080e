"""What killed builds, conversions and measurements leave behind is removed at the next start
(engine/atomic_files.py), and a kept record of the wrong shape is built again, never a traceback
(engine/kept_files.py)."""

import json
import os
import socket
import subprocess

import pytest

from engine import atomic_files


@pytest.fixture
def dead_pid():
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def _leftover(folder, name, pid, host=None):
    path = folder / f".{name}.{pid}@{host or socket.gethostname()}~1a2b3c4d.tmp"
    path.write_bytes(b"half a file")
    return path


def test_a_killed_conversion_leaves_nothing_for_good(tmp_path, dead_pid):
    """A conversion killed between writing a layer's temporary and its rename: the next run's layer folder drops it,
    and keeps what live writers (another process converting the same model now) are writing."""
    from engine.memory.converted import layer_folder

    identity = {"model": "m" * 64, "format": "plain", "dtype": "float32"}
    folder = layer_folder(identity, tmp_path)
    dead = _leftover(folder, "layer_0003.safetensors", dead_pid)
    alive = _leftover(folder, "layer_0004.safetensors", os.getppid())
    other_host = _leftover(folder, "layer_0005.safetensors", dead_pid, "another-host")
    atomic_files._swept.clear()  # as in the next process
    assert layer_folder(identity, tmp_path) == folder
    assert not dead.exists() and alive.exists() and other_host.exists()
    os.utime(other_host, (0, 0))  # a day old: a dead writer's, whatever its host
    atomic_files._swept.clear()
    layer_folder(identity, tmp_path)
    assert not other_host.exists()


def test_the_temporaries_of_killed_measurements_are_removed_at_the_next_start(tmp_path, dead_pid, monkeypatch):
    """The hardware profile's folder (its disk probes, a profile or kernel rates killed while written)."""
    from planner import profiler
    from tests.planner.specs import cpu_machine

    probe = _leftover(tmp_path, "flexbatch-disk-probe.safetensors", dead_pid)
    rates = _leftover(tmp_path, "kernel_rates.json", dead_pid)
    monkeypatch.setattr(profiler, "profile_this_machine", cpu_machine)
    profiler.load_or_profile(tmp_path / "hardware.json")
    assert not probe.exists() and not rates.exists()


def test_a_killed_kernel_build_is_removed_at_the_next_load(tmp_path, dead_pid, monkeypatch):
    """Before, only a process that had to build swept; one that found the library built never did."""
    from engine.kernels import compiled

    home = tmp_path / "kernels"
    dead = home / f"0123456789abcdef.tmp{dead_pid}@{socket.gethostname()}"
    dead.mkdir(parents=True)
    monkeypatch.setattr(compiled, "build_dir", lambda: home / "0123456789abcdef")
    monkeypatch.delitem(compiled.sys.modules, compiled.NAME, raising=False)
    monkeypatch.setattr(compiled, "build", lambda: "built")
    assert compiled.load(build_if_missing=True) == "built"
    assert not dead.exists()


@pytest.mark.parametrize("record", ["[]", "null", '{"bytes": "12", "sha256": 5}'])
def test_a_converted_layer_whose_record_has_the_wrong_shape_is_rebuilt(tmp_path, record):
    import torch

    from engine.memory.offload import stored_layer, write_layer

    write_layer(tmp_path, 0, {"w": torch.zeros(2)}, {"format": "plain"}, {"model": "m"})
    assert stored_layer(tmp_path, 0, {"model": "m"}) == {"format": "plain"}
    (tmp_path / "layer_0000.json").write_text(record)
    assert stored_layer(tmp_path, 0, {"model": "m"}) is None


def test_weight_digests_of_the_wrong_shape_are_set_aside_and_hashed_again(tmp_path):
    from engine.memory.fingerprint import file_digests

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights")
    table = tmp_path / "fingerprints.json"
    first = file_digests([weights], table)
    table.write_text(json.dumps({str(weights.resolve()): {"stat": "now", "sha256": 1}}))
    assert file_digests([weights], table) == first
    assert (tmp_path / "fingerprints.json.wrong").exists() and json.loads(table.read_text())
