"""Cascade attention over a shared prefix plus each row's own slots equals plain attention over the prefix
concatenated before every row's keys: for a prefill of left-padded rows and for decode over a 4-bit own cache,
with GQA, in chunks smaller than the cache."""

import torch

from engine.compression.int4 import dequantize, quantize
from engine.kernels.attention import attend, prefill_mask
from engine.kernels.decode_choice import KV_CONFIG
from engine.kernels.shared_attention import shared_prefix_attention

B, NH, KVH, S, P, D = 3, 8, 2, 5, 7, 16


def _concat(pk, pv, k, v, mask):
    K, V = (torch.cat([p.expand(B, -1, -1, -1), x], 2) for p, x in ((pk, k), (pv, v)))
    seen = torch.ones(B, 1, mask.shape[2], P, dtype=torch.bool)
    return K, V, torch.cat([seen, mask], -1)


def test_a_padded_prefill_equals_attention_over_the_prefix_and_the_row():
    torch.manual_seed(0)
    q, k, v = torch.randn(B, NH, S, D), torch.randn(B, KVH, S, D), torch.randn(B, KVH, S, D)
    pk, pv = torch.randn(1, KVH, P, D), torch.randn(1, KVH, P, D)
    valid = torch.ones(B, S, dtype=torch.bool)
    valid[0, :2] = False  # row 0 is left-padded
    mask = prefill_mask(valid)
    got = shared_prefix_attention(q, k, v, mask, (pk, pv))
    assert torch.allclose(got, attend(q, *_concat(pk, pv, k, v, mask)), atol=1e-5)


def test_decode_over_a_4bit_own_cache_in_small_chunks():
    torch.manual_seed(1)
    q, k, v = torch.randn(B, NH, 1, D), torch.randn(B, KVH, S, D), torch.randn(B, KVH, S, D)
    pk, pv = torch.randn(1, KVH, P, D), torch.randn(1, KVH, P, D)
    mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
    mask[1, ..., :3] = False
    kq, vq = quantize(k, KV_CONFIG), quantize(v, KV_CONFIG)
    got = shared_prefix_attention(q, kq, vq, mask, (pk, pv), chunk=2)
    want = attend(q, *_concat(pk, pv, dequantize(kq), dequantize(vq), mask))
    assert torch.allclose(got, want, atol=1e-5)
