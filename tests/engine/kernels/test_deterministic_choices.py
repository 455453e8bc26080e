"""The kernels a run takes are a function of the machine class, the dtype and the shape, never of the load or of
timings taken in the moment: the same rows give the same bytes when the engine runs again with the kernel rates
cleared and the machine busy, as on a resume or on another node of the same CPU kind."""

from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine.kernels import decode_choice, gemm_choice, prefill_choice, rates
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.engine.reference import PROMPTS


def timings(order: str):
    """A stand-in for rates.fewest_seconds: the first path fastest ("first") or the last ("last"), whatever runs."""

    def fewest_seconds(fns, repeats):
        seconds = [1e-3 * (i + 1) for i in range(len(fns))]
        return seconds if order == "first" else seconds[::-1]

    return fewest_seconds


def machine(monkeypatch, tmp_path, order: str, load: float) -> None:
    """The kernel rates cleared, and every timing and the load average as given."""
    monkeypatch.setattr(rates, "DEFAULT_PATH", tmp_path / "kernel_rates.json")
    (tmp_path / "kernel_rates.json").unlink(missing_ok=True)
    rates._memo.clear()
    for module in (rates, decode_choice, prefill_choice):
        monkeypatch.setattr(module, "fewest_seconds", timings(order), raising=False)
    monkeypatch.setattr(rates.os, "getloadavg", lambda: (load, load, load))


def completions(model_dir, policy: Policy) -> list:
    engine = Engine.load(model_dir, dtype="bfloat16", policy=policy)
    params = SamplingParams(max_new_tokens=8, logprobs=True)
    done = engine.generate([Request(str(i), p, params) for i, p in enumerate(PROMPTS)])
    return [(c.id, c.text, c.token_ids, c.logprobs) for c in done]


@pytest.mark.parametrize(("weight_format", "compress_cache"), [("int4", False), ("int8", True)])
def test_a_rerun_with_the_rates_cleared_on_a_busy_machine_gives_the_same_bytes(checkpoint, monkeypatch, tmp_path,
                                                                               weight_format, compress_cache):
    monkeypatch.undo()  # the suite's pins of every kernel choice: the engine's own choices are under test
    model_dir = checkpoint("llama_gqa_llama3")
    policy = Policy(gbs=4, num_gb=1, compress_weight=True, weight_format=weight_format,
                    compress_cache=compress_cache)
    machine(monkeypatch, tmp_path, "first", load=0.1)
    first = completions(model_dir, policy)
    machine(monkeypatch, tmp_path, "last", load=64.0)
    again = completions(model_dir, policy)
    rates._memo.clear()
    assert again == first


def test_each_choice_is_made_without_timing_anything(monkeypatch, tmp_path):
    monkeypatch.undo()

    def no_timing(*args, **kwargs):
        raise AssertionError("a kernel choice timed a kernel")

    monkeypatch.setattr(rates, "DEFAULT_PATH", tmp_path / "kernel_rates.json")
    rates._memo.clear()
    monkeypatch.setattr(rates, "measure_max_rows", no_timing)
    for module in (rates, decode_choice, prefill_choice):
        monkeypatch.setattr(module, "fewest_seconds", no_timing, raising=False)
    for fmt, dtype in [("int4", torch.bfloat16), ("int8", torch.bfloat16), ("int4", torch.float32)]:
        assert gemm_choice.max_rows(fmt, 1024, 1024, dtype) in (0, *rates.ROWS)
    assert gemm_choice.packs_dense(torch.empty(2048, 1024)) == gemm_choice.reorders(torch.float32)
    assert not gemm_choice.packs_dense(torch.empty(64, 64))
    for kind in ("plain", "4bit"):
        assert decode_choice.decode_kernel(kind, torch.bfloat16, 8, 8, 2, 64) in decode_choice.KERNELS
    assert prefill_choice.prefill_kernel(torch.bfloat16, 8, 8, 2, 64) in prefill_choice.KERNELS
    assert not (tmp_path / "kernel_rates.json").exists()  # nothing measured, nothing written
