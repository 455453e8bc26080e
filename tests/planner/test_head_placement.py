"""The embeddings and the LM head placed like a layer: on the gpu tier when decode's last layer computes on the
GPU. The planner counts their bytes on that tier, prices them on that device, and `flexbatch plan` shows where
they live."""

import pytest
from click.testing import CliRunner

from engine.memory import footprint as fp
from engine.policy import Policy
from jobs import cli
from planner import cost_model as cm
from planner import memory_model as mm
from planner.hardware import save_hardware
from planner.predict import memory_need
from tests.planner.specs import SMALL, llama
from tests.planner.test_cost_model import WORK, gpu_machine

GLOBALS = (100 * 64 + 64) * 2  # SMALL's tied embeddings and final norm in bf16
ON_GPU = Policy(gbs=2, num_gb=2, prefill_device="gpu", decode_device="gpu")
PHASE_SWITCH = Policy(gbs=2, num_gb=2, prefill_device="gpu")  # decode on the CPU


def test_gpu_bytes_include_the_head_and_embeddings_where_they_are_placed():
    hw = gpu_machine()
    on_gpu, switch = (memory_need(SMALL, hw, WORK, p, rows=4)["prefill"] for p in (ON_GPU, PHASE_SWITCH))
    assert on_gpu["gpu"] - switch["gpu"] == GLOBALS  # the same prefill on the GPU: only the globals differ
    assert switch["cpu"] - on_gpu["cpu"] == GLOBALS
    home = mm.home_bytes(SMALL, WORK, ON_GPU, rows=4)
    assert home["gpu"].const == GLOBALS and home["cpu"].const == 0


def test_head_is_priced_on_its_device_with_the_logits_crossing_back():
    """2 GPU batches of 2 rows: 2 * V * H FLOPs per row at the GPU's 1 TFLOP/s, plus V float32 logits per row
    over d2h at 1 GB/s, plus the CPU's step call (token choice stays on the host)."""
    hw = gpu_machine()
    gemm, logits, call = 2 * 100 * 64 / 1e12, 4 * 100 / 1e9, 2e-4
    assert cm.head_s(cm.Block(SMALL, hw, WORK, ON_GPU, rows=4)) == pytest.approx(2 * (2 * (gemm + logits) + call))
    on_cpu = cm.head_s(cm.Block(SMALL, hw, WORK, PHASE_SWITCH, rows=4))
    assert on_cpu == pytest.approx(2 * (2 * 2 * 100 * 64 / 1e11 + call))


def test_plan_shows_where_the_head_and_embeddings_live(tmp_path, tiny_llama_dir):
    hw = save_hardware(gpu_machine(), tmp_path / "hw.json")
    for device, column in (("gpu", 0), ("cpu", 1)):
        result = CliRunner().invoke(cli.main, ["plan", "--model", str(tiny_llama_dir), "--prompt-len", "16",
                                               "--gen-len", "4", "--num-prompts", "8", "--hardware", str(hw),
                                               "--decode-device", device])
        assert result.exit_code == 0, result.output
        row = next(line for line in result.output.splitlines() if line.strip().startswith("embed+head"))
        cells = row.split()[3:]  # label, size, unit, then one bar per tier (gpu, cpu, disk)
        assert cells[column] == "#" * len(cells[column]) and all(set(c) == {"."} for i, c in enumerate(cells)
                                                                 if i != column), row


def test_the_fitting_split_leaves_room_for_the_head_and_embeddings():
    """The search's split where the layers that fit 80 % of the GPU sit there counts the embeddings and head,
    which such a split keeps on the GPU. 8 layers, embeddings of 1.7 layers, room for 3.5 layers beside them:
    the split puts 3 layers on the GPU (at layer 5), besides the splits at a quarter, half and three quarters
    (without the globals counted it would put 5 there, at layer 3)."""
    from planner.search import SPLIT_FIT_SHARE, modes

    model = llama(layers=8, vocab=1000)
    capacity = (fp.global_bytes(model, 2) + 3.5 * fp.layer_bytes(model, 2, False)) / SPLIT_FIT_SHARE
    splits = {m["decode_split_layer"] for m in modes(model, gpu_machine(), {}, False, capacity, 2)
              if m["decode_device"] == "split"}
    assert splits == {2, 4, 5, 6}
