"""Score rules (engine/kernels/attention.py ScoreRule): Gemma 2's soft cap and gpt-oss's sinks give the reference
formula's output (the checkpoints' own eager attention: scores, cap, mask, a sink logit per head in the softmax, its
weight dropped) on every path that takes them: the explicit prefill, the chunked decode over plain and 4-bit caches,
and the shared-prefix merge."""

import math

import pytest
import torch

from engine.compression.int4 import dequantize, quantize
from engine.kernels.attention import ScoreRule, attend, decode_mask, prefill_mask
from engine.kernels.cpu_attention import decode_attention
from engine.kernels.shared_attention import shared_prefix_attention

B, NH, KVH, D = 2, 4, 2, 16


def reference(q, k, v, mask, rule: ScoreRule) -> torch.Tensor:
    k, v = (x.repeat_interleave(NH // KVH, dim=1) for x in (k, v))
    a = q @ k.mT / math.sqrt(D)
    if rule.softcap is not None:
        a = torch.tanh(a / rule.softcap) * rule.softcap
    a = a.masked_fill(~mask, -math.inf)
    if rule.sinks is not None:
        a = torch.cat([a, rule.sinks.view(1, NH, 1, 1).expand(*a.shape[:3], 1)], dim=-1)
    return torch.softmax(a, dim=-1)[..., : k.shape[2]] @ v


RULES = [ScoreRule(softcap=0.7), ScoreRule(sinks=torch.tensor([0.5, -1.0, 2.0, 0.0])),
         ScoreRule(softcap=1.5, sinks=torch.tensor([3.0, 1.0, -2.0, 0.5]))]


def _qkv(S, T, g):
    return (torch.randn(B, NH, S, D, generator=g), torch.randn(B, KVH, T, D, generator=g),
            torch.randn(B, KVH, T, D, generator=g))


@pytest.mark.parametrize("rule", RULES, ids=["cap", "sinks", "both"])
def test_prefill_and_decode_give_the_reference(rule):
    g = torch.Generator().manual_seed(0)
    valid = torch.ones(B, 9, dtype=torch.bool)
    valid[1, :3] = False  # a left-padded row
    q, k, v = _qkv(9, 9, g)
    mask = prefill_mask(valid)
    assert torch.allclose(attend(q, k, v, mask, rule=rule), reference(q, k, v, mask, rule), atol=1e-5)
    q1 = q[:, :, -1:]
    dmask = decode_mask(valid, 9)
    want = reference(q1, k, v, dmask, rule)
    assert torch.allclose(decode_attention(q1, k, v, dmask, chunk=4, rule=rule), want, atol=1e-5)
    qk, qv = quantize(k), quantize(v)
    want4 = reference(q1, dequantize(qk, dtype=torch.float32), dequantize(qv, dtype=torch.float32), dmask, rule)
    assert torch.allclose(decode_attention(q1, qk, qv, dmask, chunk=4, rule=rule), want4, atol=1e-5)


@pytest.mark.parametrize("rule", RULES, ids=["cap", "sinks", "both"])
def test_a_shared_prefix_merges_to_the_reference(rule):
    g = torch.Generator().manual_seed(1)
    P, S = 6, 5
    pk, pv = torch.randn(1, KVH, P, D, generator=g), torch.randn(1, KVH, P, D, generator=g)
    q, k, v = _qkv(S, S, g)
    mask = prefill_mask(torch.ones(B, S, dtype=torch.bool))
    full_k, full_v = torch.cat([pk.expand(B, -1, -1, -1), k], 2), torch.cat([pv.expand(B, -1, -1, -1), v], 2)
    full_mask = torch.cat([torch.ones(B, 1, S, P, dtype=torch.bool), mask], -1)
    got = shared_prefix_attention(q, k, v, mask, (pk, pv), rule=rule)
    assert torch.allclose(got, reference(q, full_k, full_v, full_mask, rule), atol=1e-5)
