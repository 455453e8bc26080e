"""The `ipex` kernel backend (engine/kernels/ipex.py) against the native kernels.

Tests marked `ipex` need intel-extension-for-pytorch, which needs torch 2.8 (scripts/setup_ipex_venv.sh makes
such an environment); they are skipped without it. The backend-selection tests run everywhere.

Agreement rate of a run with a reference run over the same prompts: the mean, over prompts, of the fraction of
the reference's greedy tokens that the run reproduces before its first different token (after a difference the
two continue from different contexts, so later tokens say nothing)."""

import dataclasses

import pyarrow.parquet as pq
import pytest
import torch

from engine.compression.int4 import QuantConfig, dequantize, quantize
from engine.engine import Engine
from engine.errors import InvalidParamsError
from engine.kernels.attention import attend, prefill_mask
from engine.kernels.backend import load_kernels
from engine.kernels.native import NativeKernels
from engine.kernels.rope import inv_frequencies
from engine.options import OptionError
from engine.policy import Policy
from engine.request import Request, SamplingParams
from engine.spec import RopeSpec
from tests.conftest import DEMO_PROMPTS
from tests.engine.reference import PROMPTS, hf_greedy, hf_model
from tests.ipex_check import ipex_missing

VARIANTS = ("llama_gqa_llama3", "qwen2", "mistral_window", "opt", "opt350m")
POLICIES = {"resident": Policy(gbs=2), "half on disk": Policy(gbs=3, num_gb=2, weight_cpu=0.5),
            "4-bit cache": Policy(gbs=2, compress_cache=True)}


def _tokens(engine, prompts, n=12):
    return [c.token_ids for c in engine.generate([Request(str(i), p, SamplingParams(max_new_tokens=n))
                                                  for i, p in enumerate(prompts)])]


def agreement(runs: list[list[int]], reference: list[list[int]]) -> float:
    """The agreement rate (see the module docstring)."""
    total = 0.0
    for run, ref in zip(runs, reference, strict=True):
        same = next((n for n, (a, b) in enumerate(zip(run, ref)) if a != b), min(len(run), len(ref)))
        total += same / max(1, len(ref))
    return total / len(reference)


def test_agreement_counts_the_common_prefix():
    assert agreement([[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]]) == pytest.approx((2 / 4 + 1) / 2)


# ---- selection (everywhere) ------------------------------------------------------------------------------

def test_an_unknown_backend_is_refused():
    with pytest.raises(OptionError, match="^backend='cuda' is invalid: expected one of native, aten, ipex, auto$"):
        load_kernels("cuda")


def test_native_is_the_default(tiny_llama_dir):
    assert Engine.load(tiny_llama_dir, dtype="float32").backend == "native"


@pytest.mark.skipif(ipex_missing() is None, reason="IPEX is available here")
def test_without_ipex_auto_is_native_and_ipex_says_how_to_get_it(tiny_llama_dir):
    assert load_kernels("auto").name == "native"
    with pytest.raises(InvalidParamsError, match="backend='ipex' cannot be used: .*setup_ipex_venv.sh"):
        Engine.load(tiny_llama_dir, dtype="float32", backend="ipex")


# ---- the kernels (with IPEX) -----------------------------------------------------------------------------

@pytest.mark.ipex
def test_auto_picks_ipex():
    assert load_kernels("auto").name == "ipex"


@pytest.mark.ipex
@pytest.mark.parametrize("shape", [(48, 64), (40, 130), (33, 129), (64, 256)])
@pytest.mark.parametrize("group", [32, 64])
def test_int4_linear_equals_dequantized_weights(shape, group):
    from engine.kernels.ipex import pack_int4, packed_linear

    torch.manual_seed(0)
    w = torch.randn(shape)
    w[0, :group] = 0.25  # a constant group: scale 0
    qt = quantize(w, QuantConfig(group_size=group))
    x, b = torch.randn(5, shape[1]), torch.randn(shape[0])
    y = packed_linear(x, pack_int4(qt), b)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, dequantize(qt).float(), b), rtol=1e-5, atol=1e-5)


@pytest.mark.ipex
def test_rope_equals_native():
    ipex, native = load_kernels("ipex"), NativeKernels()
    torch.manual_seed(0)
    B, S, NH, KVH, D = 3, 7, 4, 2, 16
    q, k = torch.randn(B, S, NH, D).transpose(1, 2), torch.randn(B, S, KVH, D).transpose(1, 2)
    positions = (torch.arange(S).view(1, S) - torch.tensor([[0], [2], [5]])).clamp(min=0)  # left padding
    inv_freq = inv_frequencies(RopeSpec(), D)
    got = ipex.rope(q, k, ipex.rope_tables(inv_freq, positions, torch.float32))
    want = native.rope(q, k, native.rope_tables(inv_freq, positions, torch.float32))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.ipex
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_prefill_attention_equals_sdpa(kv_heads):
    ipex = load_kernels("ipex")
    torch.manual_seed(0)
    B, NH, S, D = 3, 4, 9, 16
    q, k, v = torch.randn(B, NH, S, D), torch.randn(B, kv_heads, S, D), torch.randn(B, kv_heads, S, D)
    valid = torch.ones(B, S, dtype=torch.bool)
    valid[1, :3] = valid[2, :6] = False
    mask = prefill_mask(valid, sliding_window=4)
    torch.testing.assert_close(ipex.prefill_attention(q, k, v, mask), attend(q, k, v, mask), rtol=1e-5, atol=1e-5)


# ---- generation (with IPEX) ------------------------------------------------------------------------------

@pytest.mark.ipex
@pytest.mark.parametrize("variant", VARIANTS)
def test_fp32_greedy_tokens_equal_transformers(checkpoint, variant):
    """As tests/engine/test_parity.py for the native kernels (importing IPEX moves float32 ATen results by
    ~1e-6, so the native run in this process is no exact stand-in for one without IPEX)."""
    src = checkpoint(variant)
    engine = Engine.load(src, dtype="float32", backend="ipex")
    ref = hf_model(src)
    expected = [hf_greedy(ref, engine.tokenizer, p, 12, engine.eos_ids) for p in PROMPTS]
    assert _tokens(engine, PROMPTS) == expected


@pytest.mark.ipex
@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("variant", VARIANTS)
def test_fp32_greedy_tokens_equal_native(checkpoint, tmp_path, variant, policy):
    from engine.kernels.ipex import PackedLinear

    src = checkpoint(variant)
    native = Engine.load(src, dtype="float32", policy=policy, offload_dir=tmp_path)
    ipex = Engine.load(src, dtype="float32", policy=policy, offload_dir=tmp_path, backend="ipex")
    assert ipex.backend == "ipex"
    resident = next(iter(ipex.weights.resident.values()))
    assert any(isinstance(w, PackedLinear) for w in resident.values())  # the IPEX kernels did run
    assert _tokens(ipex, PROMPTS) == _tokens(native, PROMPTS)


@pytest.fixture(params=[True, False], ids=["int4 gemm", "int4 dequantized"])
def int4(request, monkeypatch):
    """Run 4-bit weights through IPEX's int4 GEMM (as on CPUs where IPEX has its optimized kernel, forced
    elsewhere) or dequantized as natively (as on the others)."""
    import engine.kernels.ipex

    monkeypatch.setattr(engine.kernels.ipex, "int4_gemm_available", lambda: request.param)
    return request.param


@pytest.mark.ipex
@pytest.mark.parametrize("where", ["resident", "on disk"])
def test_fp32_compressed_tokens_equal_native(checkpoint, tmp_path, where, int4):
    policy = Policy(gbs=2, compress_weight=True, weight_cpu=1.0 if where == "resident" else 0.0)
    runs = [_tokens(Engine.load(checkpoint("qwen2"), dtype="float32", policy=policy, offload_dir=tmp_path,
                                backend=backend), PROMPTS) for backend in ("native", "ipex")]
    assert runs[0] == runs[1]


@pytest.mark.ipex
def test_fp32_tokens_equal_native_under_every_placement(checkpoint, tmp_path, int4):
    """4-bit weights and cache placed over the tiers (the gpu tier simulated by a CPU pool): layers the
    policy computes on the gpu keep the native kernels, the others take IPEX's."""
    from tests.engine.test_policies import POLICIES, VARIANT

    for name, policy in POLICIES.items():
        policy = dataclasses.replace(policy, compress_weight=True, compress_cache=True)
        runs = [_tokens(Engine.load(checkpoint(VARIANT), dtype="float32", policy=policy, simulate_gpu=True,
                                    offload_dir=tmp_path, backend=backend), PROMPTS * 2, n=6)
                for backend in ("native", "ipex")]
        assert runs[0] == runs[1], name


@pytest.mark.ipex
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compressed_runs_agree_with_the_reference_at_the_native_rate(demo_model_dir, dtype, int4):
    """4-bit weights, on the trained demo model: each backend's agreement with the uncompressed float32 run."""
    prompts = pq.read_table(DEMO_PROMPTS, columns=["prompt"]).column("prompt").to_pylist()
    reference = _tokens(Engine.load(demo_model_dir, dtype="float32"), prompts, n=24)
    policy = Policy(gbs=8, compress_weight=True)
    rates = {backend: agreement(_tokens(Engine.load(demo_model_dir, dtype=dtype, policy=policy, backend=backend),
                                        prompts, n=24), reference) for backend in ("native", "ipex")}
    assert rates["native"] > 0.3, rates  # 4-bit weights do change this small model's tokens
    assert abs(rates["ipex"] - rates["native"]) <= 0.1, rates
