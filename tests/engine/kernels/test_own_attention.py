"""The project's own decode attention kernel (engine/kernels/own_attention.py) against attention in float64, on every
instruction set this CPU runs: float32, bfloat16 and 4-bit caches, GQA and MHA, padded masks, strided views of a
longer cache, lengths that are no multiple of any block, head sizes 16 to 128 (80 included); its state folding
(a shared prefix, then the row's own slots); the fallback where it does not apply; and greedy float32 tokens equal
to transformers' with it in use.

Tolerances: float32 caches 2e-5 (float32 accumulation over values of size ~1); a bfloat16 output 1e-2 (its own
rounding, 2^-9 relative, on values up to ~3, plus bf16 products of bf16 inputs); float32 queries over a bf16 cache
1e-4 (queries and probabilities split into two bf16 halves)."""

import pytest
import torch

from engine.compression.int4 import dequantize, quantize
from engine.engine import Engine
from engine.kernels import compiled, decode_choice, own_attention
from engine.kernels.attention import attend, prefill_mask
from engine.kernels.shared_attention import shared_prefix_attention
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.engine.kernels.own_isas import isas
from tests.engine.reference import PROMPTS

MAX_NEW = 12


def reference(q, k, v, mask, scale=None):
    """Attention in float64 over plain K/V [B, KVH, T, D] (GQA by repeating each K/V head)."""
    g = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(g, 1) for x in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k, v, attn_mask=mask, scale=scale)


def case(B, NH, KVH, T, D, dtype, seed):
    """q, strided K/V views into longer caches (slots [2, T + 2) of T + 7), and a mask with left padding."""
    torch.manual_seed(seed)
    q = torch.randn(B, NH, 1, D).to(dtype)
    k, v = (torch.randn(B, KVH, T + 7, D).to(dtype)[:, :, 2 : T + 2] for _ in range(2))
    mask = torch.rand(B, 1, 1, T) > 0.2
    mask[0, ..., : T // 2] = False  # row 0 left-padded
    mask[..., -1] = True
    return q, k, v, mask


def tolerance(q_dtype, cache_dtype):
    if q_dtype == torch.bfloat16:
        return 1e-2
    return 2e-5 if cache_dtype == torch.float32 else 1e-4


def decode_cases(test):
    """Parametrize a test over every instruction set, dtype, (query heads, KV heads), head size D and length T."""
    for mark in (
        pytest.mark.parametrize("T", [1, 37, 200]),
        pytest.mark.parametrize("D", [16, 64, 80, 128]),
        pytest.mark.parametrize("heads", [(8, 2), (4, 4)]),
        pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16]),
        pytest.mark.parametrize("isa", isas()),
    ):
        test = mark(test)
    return test


@decode_cases
def test_plain_cache_equals_attention_in_float64(pinned, isa, dtype, heads, D, T):
    pinned(isa)
    q, k, v, mask = case(3, *heads, T, D, dtype, seed=D + T)
    assert not k.is_contiguous() and own_attention.supports(q, k)
    got = own_attention.decode_attention(q, k, v, mask)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.double(), reference(q, k, v, mask), atol=tolerance(dtype, dtype), rtol=0)


@decode_cases
def test_4bit_cache_equals_attention_over_its_dequantized_values(pinned, isa, dtype, heads, D, T):
    pinned(isa)
    q, k, v, mask = case(3, *heads, T, D, dtype, seed=D + T + 1)
    big_k, big_v = (quantize(x, decode_choice.KV_CONFIG) for x in (k, v))
    k4, v4 = big_k.row_slice(0, T), big_v.row_slice(0, T)  # views of their own caches
    assert own_attention.supports(q, k4)
    got = own_attention.decode_attention(q, k4, v4, mask, scale=0.3)
    want = reference(q, dequantize(k4, dtype=torch.float64), dequantize(v4, dtype=torch.float64), mask, scale=0.3)
    torch.testing.assert_close(got.double(), want, atol=tolerance(dtype, torch.float32), rtol=0)


@pytest.mark.parametrize("isa", isas())
def test_float32_queries_over_a_bf16_cache_keep_float32_precision(pinned, isa):
    pinned(isa)
    q, k, v, mask = case(2, 8, 2, 300, 64, torch.bfloat16, seed=5)
    got = own_attention.decode_attention(q.float(), k, v, mask)
    torch.testing.assert_close(got.double(), reference(q.float(), k, v, mask), atol=1e-4, rtol=0)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("four_bit", [False, True])
def test_folding_two_sources_equals_attention_over_both(pinned, isa, four_bit):
    """The state after the first part of the slots, folded on with the rest, is attention over all of them."""
    pinned(isa)
    q, k, v, mask = case(2, 8, 2, 90, 64, torch.float32, seed=7)
    if four_bit:
        k, v = (dequantize(quantize(x, decode_choice.KV_CONFIG)) for x in (k, v))
    B, KVH, T, D = k.shape
    qg = q.reshape(B, KVH, 4, D)
    state = own_attention.new_state(B, KVH, 4, D)
    for part in (slice(0, 50), slice(50, T)):
        ks, vs = k[:, :, part], v[:, :, part]
        if four_bit:
            ks, vs = (quantize(x.contiguous(), decode_choice.KV_CONFIG) for x in (ks, vs))
        own_attention.fold(state, qg, ks, vs, mask.reshape(B, T)[:, part].contiguous(), D**-0.5)
    _, denom, o = state
    got = (o / denom.unsqueeze(-1)).reshape(q.shape)
    torch.testing.assert_close(got.double(), reference(q, k, v, mask), atol=2e-5, rtol=0)


def test_shared_prefix_decode_by_the_own_kernel(own_decode):
    torch.manual_seed(3)
    B, NH, KVH, T, P, D = 3, 8, 2, 21, 9, 32
    q, k, v = torch.randn(B, NH, 1, D), torch.randn(B, KVH, T, D), torch.randn(B, KVH, T, D)
    pk, pv = torch.randn(1, KVH, P, D), torch.randn(1, KVH, P, D)
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    mask[1, ..., :4] = False
    kq, vq = quantize(k, decode_choice.KV_CONFIG), quantize(v, decode_choice.KV_CONFIG)
    got = shared_prefix_attention(q, kq, vq, mask, (pk, pv))
    K, V = (torch.cat([p.expand(B, -1, -1, -1), dequantize(x)], 2) for p, x in ((pk, kq), (pv, vq)))
    seen = torch.cat([torch.ones(B, 1, 1, P, dtype=torch.bool), mask], -1)
    torch.testing.assert_close(got, attend(q, K, V, seen), atol=2e-5, rtol=0)


def test_shapes_it_does_not_take_keep_the_pytorch_path(own_decode, monkeypatch):
    """A head size that is no multiple of 16, or kernels that are not built: `decode` runs the chunked path."""
    q, k, v, mask = case(2, 4, 2, 10, 24, torch.float32, seed=9)
    assert not own_attention.supports(q, k)
    torch.testing.assert_close(decode_choice.decode(q, k, v, mask), reference(q, k, v, mask).float())
    q, k, v, mask = case(2, 4, 2, 10, 32, torch.float32, seed=9)
    monkeypatch.setattr(compiled, "ops", lambda: None)
    assert not own_attention.supports(q, k)
    torch.testing.assert_close(decode_choice.decode(q, k, v, mask), reference(q, k, v, mask).float())


@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "opt", "mistral_window"])
@pytest.mark.parametrize("compress_cache", [False, True])
def test_greedy_fp32_with_own_decode_matches_transformers(greedy_fp32_matches_transformers, variant, compress_cache,
                                                          own_decode):
    greedy_fp32_matches_transformers(variant, compress_cache)


def prefill_isas():
    """The instruction sets with the prefill kernel on this CPU (AVX-512 BF16 and AVX2; none where the kernels are
    not built)."""
    return isas()


@pytest.mark.parametrize("isa", prefill_isas())
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (3, 1)])
@pytest.mark.parametrize("D", [16, 64, 80, 128])
@pytest.mark.parametrize("S", [1, 37, 130])
@pytest.mark.parametrize("padded", [False, True])
def test_prefill_equals_attention_in_float64(pinned, isa, heads, D, S, padded):
    """Causal prompts (blocks above the diagonal skipped) and left-padded ones (the mask read), in bf16: within
    1e-2 (the output's bf16 rounding on values up to ~3, and bf16 probabilities)."""
    pinned(isa)
    torch.manual_seed(S + D)
    B, (NH, KVH) = 2, heads
    q = torch.randn(B, S, NH, D).bfloat16().transpose(1, 2)  # a strided view, as the layers make
    k, v = (torch.randn(B, KVH, S + 3, D).bfloat16()[:, :, :S] for _ in range(2))
    valid = torch.ones(B, S, dtype=torch.bool)
    if padded:
        valid[0, : S // 2] = False
    mask = prefill_mask(valid)
    assert own_attention.supports_prefill(q, k)
    got = own_attention.prefill_attention(q, k, v, mask)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    torch.testing.assert_close(got.double(), reference(q, k, v, mask), atol=1e-2, rtol=0)


@pytest.mark.parametrize("isa", prefill_isas())
def test_prefill_over_more_keys_than_queries_reads_the_mask(pinned, isa):
    """Queries at the last S of T positions (a prompt continued over its earlier keys), left padding in one row: the
    mask is read (no causal shortcut), keys in partial blocks of 64, g = 3 query heads per KV head."""
    pinned(isa)
    torch.manual_seed(11)
    B, NH, KVH, S, T, D = 2, 6, 2, 45, 150, 48
    q = torch.randn(B, NH, S, D).bfloat16()
    k, v = (torch.randn(B, KVH, T, D).bfloat16() for _ in range(2))
    mask = (torch.arange(T).view(1, T) <= torch.arange(T - S, T).view(S, 1)).expand(B, 1, S, T).clone()
    mask[1, :, :, :60] = False
    got = own_attention.prefill_attention(q, k, v, mask)
    torch.testing.assert_close(got.double(), reference(q, k, v, mask), atol=1e-2, rtol=0)


def test_prefill_keeps_sdpa_where_the_kernel_does_not_apply(own_prefill):
    """float32 queries (the kernel is bf16 only) and a head size that is no multiple of 16 run SDPA."""
    from engine.kernels import prefill_choice

    mask = prefill_mask(torch.ones(2, 9, dtype=torch.bool))
    for dtype, D in ((torch.float32, 64), (torch.bfloat16, 24)):
        q, k, v = torch.randn(2, 4, 9, D).to(dtype), torch.randn(2, 2, 9, D).to(dtype), torch.randn(2, 2, 9, D).to(dtype)
        assert not own_attention.supports_prefill(q, k)
        torch.testing.assert_close(prefill_choice.prefill(q, k, v, mask), attend(q, k, v, mask))


@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "opt"])
def test_bf16_generation_with_own_prefill_and_decode_is_close_to_sdpa(checkpoint, variant, own_prefill, own_decode):
    """bf16 end to end through the engine: the own kernels' tokens agree with SDPA's on most positions (bf16
    rounds differently in each, and a near tie may flip a greedy token)."""
    from engine.kernels import prefill_choice

    model_dir = checkpoint(variant)
    engine = Engine.load(model_dir, dtype="bfloat16", policy=Policy(gbs=4, num_gb=1))
    requests = [Request(str(i), p, SamplingParams(max_new_tokens=MAX_NEW)) for i, p in enumerate(PROMPTS)]
    got = [c.token_ids for c in engine.generate(requests)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prefill_choice, "prefill_kernel", lambda *a: "sdpa")
        mp.setattr(decode_choice, "decode_kernel", lambda *a: "sdpa")
        want = [c.token_ids for c in engine.generate(requests)]
    first = [a[0] == b[0] for a, b in zip(got, want)]
    assert sum(first) >= len(first) - 1, (got, want)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("isa", prefill_isas())
def test_shared_prefix_prefill_by_the_own_kernel(pinned, own_prefill, isa, padded):
    """The prefill kernel started from the shared prefix's state equals attention over [prefix ; own tokens]."""
    pinned(isa)
    torch.manual_seed(4)
    B, NH, KVH, S, P, D = 3, 8, 2, 70, 9, 32
    q, k, v = (torch.randn(B, h, S, D).bfloat16() for h in (NH, KVH, KVH))
    pk, pv = torch.randn(1, KVH, P, D).bfloat16(), torch.randn(1, KVH, P, D).bfloat16()
    valid = torch.ones(B, S, dtype=torch.bool)
    if padded:
        valid[1, :30] = False
    mask = prefill_mask(valid)
    got = shared_prefix_attention(q, k, v, mask, (pk, pv))
    K, V = (torch.cat([p.expand(B, -1, -1, -1), x], 2) for p, x in ((pk, k), (pv, v)))
    seen = torch.cat([torch.ones(B, 1, S, P, dtype=torch.bool), mask], -1)
    torch.testing.assert_close(got.double(), reference(q, K, V, seen), atol=1e-2, rtol=0)
