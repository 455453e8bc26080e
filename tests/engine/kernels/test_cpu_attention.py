"""Chunked decode attention on the CPU: equal to SDPA over the same cache, plain or 4-bit, never cache-sized."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from engine.compression.int4 import QTensor, dequantize, quantize
from engine.kernels.attention import decode_mask
from engine.kernels.cpu_attention import attention, decode_attention
from engine.memory.kv_cache import KVCache, QuantKVCache

pytestmark = pytest.mark.usefixtures("one_thread")


def sdpa(q, k, v, mask):
    """The reference: SDPA with an explicit mask (never is_causal, which with 1 query sees key 0 only)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def make_case(B=3, NH=8, KVH=2, T=1000, D=64, pads=(0, 300, 700), window=None, seed=0):
    """q [B, NH, 1, D], k/v [B, KVH, T, D], and a decode mask for left padding (and a sliding window)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, NH, 1, D, generator=g)
    k, v = torch.randn(B, KVH, T, D, generator=g), torch.randn(B, KVH, T, D, generator=g)
    valid = torch.arange(T).view(1, T) >= torch.tensor(pads).view(B, 1)
    return q, k, v, decode_mask(valid, T, window)


@pytest.mark.parametrize("NH,KVH", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("chunk", [256, 333, 4096, None])
def test_plain_cache_equals_sdpa(NH, KVH, chunk):
    q, k, v, mask = make_case(NH=NH, KVH=KVH)
    out = decode_attention(q, k, v, mask, chunk=chunk)
    torch.testing.assert_close(out, sdpa(q, k, v, mask), rtol=0, atol=1e-5)


def test_sliding_window_and_fully_masked_first_chunks():
    q, k, v, mask = make_case(T=900, pads=(0, 600, 850), window=128)
    out = decode_attention(q, k, v, mask, chunk=100)  # row 2 sees nothing in its first 8 chunks
    torch.testing.assert_close(out, sdpa(q, k, v, mask), rtol=0, atol=1e-5)


def test_scale_argument():
    q, k, v, mask = make_case(T=300)
    out = decode_attention(q, k, v, mask, scale=0.3, chunk=128)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("D", [64, 48])
def test_4bit_cache_equals_sdpa_over_the_dequantized_cache(D):
    q, k, v, mask = make_case(D=D, T=777)
    qk, qv = quantize(k), quantize(v)
    out = decode_attention(q, qk, qv, mask, chunk=256)
    ref = sdpa(q, dequantize(qk, dtype=torch.float32), dequantize(qv, dtype=torch.float32), mask)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    exact = sdpa(q, k, v, mask)
    assert F.cosine_similarity(out.flatten(), exact.flatten(), dim=0) > 0.99  # near the uncompressed result


def test_bfloat16_cache_accumulates_in_float32():
    q, k, v, mask = make_case(T=600)
    kb, vb = k.bfloat16(), v.bfloat16()
    out = decode_attention(q.bfloat16(), kb, vb, mask, chunk=256)
    assert out.dtype == torch.bfloat16
    ref = sdpa(q.bfloat16().float(), kb.float(), vb.float(), mask)
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=1e-2)


def test_quant_kv_cache_prefill_then_decode():
    B, NH, KVH, D, S, steps = 2, 4, 2, 64, 37, 5
    cache = QuantKVCache(num_layers=1, batch=B, kv_heads=KVH, max_len=S + steps, head_dim=D, dtype=torch.float32)
    plain = KVCache(1, B, KVH, S + steps, D, torch.float32)
    torch.manual_seed(4)
    ks, vs = torch.randn(B, KVH, S + steps, D), torch.randn(B, KVH, S + steps, D)
    cache.update(0, ks[:, :, :S], vs[:, :, :S], 0)
    for t in range(S, S + steps):
        k, v = cache.update(0, ks[:, :, t : t + 1], vs[:, :, t : t + 1], t)
        assert isinstance(k, QTensor) and k.shape == (B, KVH, t + 1, D)
        q, mask = torch.randn(B, NH, 1, D), torch.ones(B, 1, 1, t + 1, dtype=torch.bool)
        k_full, v_full = cache.dequantized(0, t + 1, torch.float32)
        torch.testing.assert_close(attention(q, k, v, mask), sdpa(q, k_full, v_full, mask), rtol=0, atol=1e-5)
    # slots quantized one at a time equal the whole prefix quantized at once (groups lie along D)
    assert torch.equal(cache.dequantized(0, S + steps)[0], dequantize(quantize(ks)))
    assert cache.nbytes() * 3 < plain.nbytes()


def test_prefill_over_a_4bit_cache_dequantizes_then_uses_sdpa():
    q, k, v, mask = make_case(T=40)
    q = torch.randn(3, 8, 40, 64)
    mask = mask.expand(3, 1, 40, 40) & torch.ones(40, 40, dtype=torch.bool).tril()
    qk, qv = quantize(k), quantize(v)
    ref = sdpa(q, dequantize(qk), dequantize(qv), mask)
    torch.testing.assert_close(attention(q, qk, qv, mask), ref, rtol=0, atol=1e-6)


class LargestNewStorage(TorchDispatchMode):
    """Records the largest storage that any op creates (outputs aliasing an op's inputs are views, not copies)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def test_chunked_path_never_makes_a_cache_sized_float32_copy():
    q, k, v, mask = make_case(B=2, NH=4, KVH=2, T=4096, pads=(0, 100))
    qk, qv = quantize(k), quantize(v)
    full_fp32 = k.numel() * 4
    with LargestNewStorage() as naive:
        dequantize(qk, dtype=torch.float32)
    assert naive.largest >= full_fp32  # the probe sees a full expansion when there is one
    for cache in ((qk, qv), (k.bfloat16(), v.bfloat16()), (k, v)):
        with LargestNewStorage() as chunked:
            decode_attention(q, *cache, mask, chunk=512)
        assert chunked.largest <= full_fp32 // 8  # one 512-slot chunk buffer of 4096 slots
