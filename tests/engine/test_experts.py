"""Mixtures of experts (Mixtral, Qwen3-MoE, Qwen2-MoE with its shared expert, gpt-oss with its sinks, biases,
clamped SwiGLU and YaRN, and gpt-oss's MXFP4 checkpoints): token-exact with transformers as every family is
(tests/engine/test_families.py runs its greedy, teacher-forced and disk / shared-prefix checks on them too);
4-bit and int8 experts (routers kept as they are) within the Llama family's tolerance for those formats; each
expert runs once per call, over the rows of the tokens that chose it."""

import pytest
import torch
from safetensors.torch import load_file

from engine.engine import Engine
from engine.models.experts import mixture, route
from engine.policy import Policy
from engine.request import Request, SamplingParams
from engine.spec import spec_from_config
from tests.checkpoints import MOE_VARIANTS
from tests.engine.loop.test_shared_prefix import ROWS
from tests.engine.reference import PROMPTS, hf_greedy
from tests.engine.teacher_forcing import continuation_logprobs

MAX_NEW = 12


def _reqs(prompts, max_new=MAX_NEW):
    return [Request(str(i), p, SamplingParams(max_new_tokens=max_new)) for i, p in enumerate(prompts)]


def _format_error(checkpoint, variant: str, fmt: str) -> float:
    """Mean |teacher-forced log-probability change| per token with `fmt` weights, against float32 weights."""
    model_dir = checkpoint(variant)
    texts = [p for p in ROWS if len(p) > 70]
    plain = continuation_logprobs(Engine.load(model_dir, dtype="float32"), texts)
    packed = continuation_logprobs(Engine.load(model_dir, dtype="float32",
                                               policy=Policy(compress_weight=True, weight_format=fmt)), texts)
    diffs = [abs(a - b) for row_a, row_b in zip(plain, packed) for a, b in zip(row_a, row_b)]
    return sum(diffs) / len(diffs)


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("variant", MOE_VARIANTS)
def test_compressed_experts_stay_within_the_llama_familys_tolerance(checkpoint, variant, fmt):
    """docs/MODELS.md's tolerance for compressed weights: a mixture's mean teacher-forced log-probability change
    at most 1.5x the Llama family's over the same texts (a router choice flipped by rounding is part of it)."""
    baseline, error = _format_error(checkpoint, "llama_gqa_llama3", fmt), _format_error(checkpoint, variant, fmt)
    assert 0 < error <= 1.5 * baseline, (error, baseline)


@pytest.mark.parametrize("variant", MOE_VARIANTS)
def test_experts_are_stored_compressed_and_routers_are_not(checkpoint, variant, tmp_path):
    engine = Engine.load(checkpoint(variant), dtype="float32", policy=Policy(weight_cpu=0.0, compress_weight=True),
                         offload_dir=tmp_path)
    stored = load_file(next(tmp_path.rglob("layer_0000.safetensors")))
    p = engine.spec.moe_prefix
    assert f"{p}experts.0.gate_up_proj.weight.data" in stored and f"{p}{engine.spec.router_name}.weight" in stored
    engine.weights.close()


def test_each_expert_runs_once_over_the_tokens_that_chose_it():
    spec = spec_from_config(dict(model_type="qwen3_moe", hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, vocab_size=10, max_position_embeddings=16, num_experts=6,
                                 num_experts_per_tok=3, moe_intermediate_size=4, norm_topk_prob=True))
    g = torch.Generator().manual_seed(0)
    x, logits, scale = torch.randn(20, 8, generator=g), torch.randn(20, 6, generator=g), torch.randn(6, 8, generator=g)
    weights, chosen = route(logits, spec)
    assert torch.allclose(weights.sum(-1), torch.ones(20)) and chosen.shape == (20, 3)
    calls = []

    def expert(e, rows):
        calls.append((e, rows.shape[0]))
        return rows * scale[e]

    got = mixture(x, weights, chosen, expert)
    want = torch.stack([sum(weights[t, j] * x[t] * scale[chosen[t, j]] for j in range(3)) for t in range(20)])
    assert torch.allclose(got, want, atol=1e-6)
    assert [e for e, _ in calls] == sorted(set(chosen.flatten().tolist()))  # each chosen expert once, ascending
    assert sum(n for _, n in calls) == 20 * 3  # every (token, choice) once


def test_an_mxfp4_gpt_oss_checkpoint_matches_transformers_dequantizing_loader(tmp_path):
    """gpt-oss's experts as published in MXFP4 (e2m1 blocks of 32, e8m0 scales): dequantized one layer at a time,
    the values transformers' own MXFP4 loader gives (dequantize=True, its CPU path), and its greedy tokens."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, Mxfp4Config

    from engine.quantized.mxfp4 import dense
    from tests.quantized_checkpoints import make_mxfp4_gpt_oss

    model_dir = make_mxfp4_gpt_oss(tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=Mxfp4Config(dequantize=True),
                                               dtype=torch.float32).eval()
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        ours = dense(f.get_tensor("model.layers.0.mlp.experts.gate_up_proj_blocks"),
                     f.get_tensor("model.layers.0.mlp.experts.gate_up_proj_scales"), torch.float32, "gate_up_proj")
    assert torch.equal(ours, ref.model.layers[0].mlp.experts.gate_up_proj.data)
    engine = Engine.load(model_dir, dtype="float32")
    assert engine.spec.quantization.method == "mxfp4"
    expected = [hf_greedy(ref, engine.tokenizer, p, MAX_NEW, engine.eos_ids) for p in PROMPTS]
    assert [c.token_ids for c in engine.generate(_reqs(PROMPTS))] == expected
