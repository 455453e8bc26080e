"""Dense weights reordered for oneDNN (engine/kernels/onednn_dense.py): with every weight packed, greedy fp32 tokens
equal transformers' for Llama and OPT layers; the choice is a fixed rule (large float32 and bf16 weights, where the CPU
reorders the dtype), measured nowhere; small weights and layers that also compute on a GPU stay plain."""

from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine.kernels import gemm_choice, onednn_dense, rates
from engine.kernels.onednn_dense import OnednnWeight
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.engine.reference import PROMPTS, hf_greedy, hf_model


@pytest.fixture
def pack_everything(monkeypatch):
    monkeypatch.setattr("engine.kernels.native.packs_dense", lambda w: w.dim() == 2 and w.dtype == torch.float32)


@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "opt"])
def test_packed_layers_give_transformers_greedy_tokens(checkpoint, pack_everything, variant):
    model_dir = checkpoint(variant)
    engine = Engine.load(model_dir, dtype="float32", policy=Policy(gbs=3, num_gb=2))
    kept = [w for layer in engine.weights.resident.values() for w in layer.values()]
    assert sum(isinstance(w, OnednnWeight) for w in kept) >= 4 * engine.spec.num_layers // 2
    ref = hf_model(model_dir)
    requests = [Request(str(i), p, SamplingParams(max_new_tokens=10)) for i, p in enumerate(PROMPTS)]
    got = [c.token_ids for c in engine.generate(requests)]
    assert got == [hf_greedy(ref, engine.tokenizer, p, 10, engine.eos_ids) for p in PROMPTS]


def test_the_packed_linear_equals_the_plain_one():
    w, b = torch.randn(96, 64), torch.randn(96)
    packed = onednn_dense.pack(w)
    for x in (torch.randn(1, 64), torch.randn(3, 5, 64), torch.randn(300, 64)):
        torch.testing.assert_close(onednn_dense.linear(x, packed, b), torch.nn.functional.linear(x, w, b))
    assert packed.nbytes == w.numel() * 4 and packed.out_features == 96


def test_large_weights_are_reordered_by_rule_and_small_ones_never(monkeypatch):
    def no_timing(*args, **kwargs):
        raise AssertionError("the choice timed a kernel")

    monkeypatch.setattr(rates, "measure_max_rows", no_timing)
    for dtype in (torch.float32, torch.bfloat16):
        assert gemm_choice.packs_dense(torch.empty(2048, 1024, dtype=dtype)) == gemm_choice.reorders(dtype)
        assert not gemm_choice.packs_dense(torch.empty(64, 64, dtype=dtype))  # below MIN_PACK_PARAMS
    assert not gemm_choice.packs_dense(torch.empty(2048, 1024, dtype=torch.float16))
    assert gemm_choice.reorders(torch.float32)  # every x86 CPU oneDNN runs on


def test_layers_that_also_compute_on_a_gpu_stay_plain(checkpoint, pack_everything):
    engine = Engine.load(checkpoint("llama_gqa_llama3"), dtype="float32", simulate_gpu=True,
                         policy=Policy(gbs=2, num_gb=1, prefill_device="gpu"))
    kept = [w for layer in engine.weights.resident.values() for w in layer.values()]
    assert kept and not any(isinstance(w, OnednnWeight) for w in kept)


def test_the_aten_backend_keeps_every_dense_weight_as_loaded(checkpoint, pack_everything):
    model_dir = checkpoint("llama_gqa_llama3")
    native = Engine.load(model_dir, dtype="float32", policy=Policy(gbs=3, num_gb=1))
    aten = Engine.load(model_dir, dtype="float32", policy=Policy(gbs=3, num_gb=1), backend="aten")
    assert aten.kernels.name == "aten"
    assert any(isinstance(w, OnednnWeight) for layer in native.weights.resident.values() for w in layer.values())
    kept = [w for layer in aten.weights.resident.values() for w in layer.values()]
    assert kept and not any(isinstance(w, OnednnWeight) for w in kept)
    requests = [Request(str(i), p, SamplingParams(max_new_tokens=8)) for i, p in enumerate(PROMPTS)]
    assert [c.token_ids for c in aten.generate(requests)] == [c.token_ids for c in native.generate(requests)]


def test_an_untied_head_is_reordered_and_a_tied_one_stays_plain(checkpoint, pack_everything):
    untied = Engine.load(checkpoint("llama_gqa_llama3"), dtype="float32", policy=Policy(gbs=3, num_gb=1))
    assert isinstance(untied.gw["lm_head.weight"], OnednnWeight)
    ref = hf_model(checkpoint("llama_gqa_llama3"))
    requests = [Request(str(i), p, SamplingParams(max_new_tokens=8)) for i, p in enumerate(PROMPTS)]
    assert [c.token_ids for c in untied.generate(requests)] == [
        hf_greedy(ref, untied.tokenizer, p, 8, untied.eos_ids) for p in PROMPTS]
    tied = Engine.load(checkpoint("llama_tied"), dtype="float32", policy=Policy(gbs=3, num_gb=1))
    assert not any(isinstance(w, OnednnWeight) for w in tied.gw.values())
    aten = Engine.load(checkpoint("llama_gqa_llama3"), dtype="float32", policy=Policy(gbs=3, num_gb=1),
                       backend="aten")
    assert not isinstance(aten.gw["lm_head.weight"], OnednnWeight)
