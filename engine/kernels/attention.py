"""Attention over a KV cache, and the masks that make left-padded batches exact.

Slots are positions in the padded batch: row b's real tokens occupy slots [pad_b, end). A query may attend to
a key when the key is a real token, is not in the future, and (with a sliding window) lies within the window.
Each query may always attend to its own slot, so a padding query never sees an all-masked row (NaN)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ScoreRule:
    """What a model does to attention scores beyond the scale and the mask: a soft cap, cap * tanh(a / cap)
    (Gemma 2), and per-head sink logits [NH] (gpt-oss) that join each softmax's denominator and weigh no value.
    The own attention kernels know neither: a model with a rule attends through PyTorch."""

    softcap: float | None = None
    sinks: torch.Tensor | None = None

    def cap(self, a: torch.Tensor) -> torch.Tensor:
        """Scores a soft-capped in place (as they are without a cap)."""
        return a if self.softcap is None else a.div_(self.softcap).tanh_().mul_(self.softcap)

    def sink_rows(self, kv_heads: int, positions: int) -> torch.Tensor | None:
        """The sinks per query row of a GQA group, [KVH, g * positions, 1] float32 (row j * positions + s: head j of
        the group, position s), or None without sinks."""
        if self.sinks is None:
            return None
        return self.sinks.float().view(kv_heads, -1, 1).repeat_interleave(positions, dim=1)


def cap_scores(a: torch.Tensor, rule: ScoreRule | None) -> torch.Tensor:
    return a if rule is None else rule.cap(a)


def fold_sinks(state, sinks: torch.Tensor | None):
    """An online-softmax state (running max, sum of exponentials, weighted values; [B, KVH, n, 1 | D]) with a sink
    logit per query row [KVH, n, 1] folded in: it adds e^sink to the sum and nothing to the values."""
    if sinks is None:
        return state
    m, denom, o = state
    m_new = torch.maximum(m, sinks)
    alpha = torch.exp(m - m_new)
    return m_new, denom * alpha + torch.exp(sinks - m_new), o * alpha


def prefill_mask(key_valid: torch.Tensor, sliding_window: int | None = None) -> torch.Tensor:
    """key_valid [B, S] bool -> mask [B, 1, S, S] bool (True = may attend)."""
    B, S = key_valid.shape
    q_idx = torch.arange(S).view(S, 1)
    k_idx = torch.arange(S).view(1, S)
    allowed = k_idx <= q_idx
    if sliding_window is not None:
        allowed = allowed & (q_idx - k_idx < sliding_window)
    mask = allowed.view(1, 1, S, S) & key_valid.view(B, 1, 1, S)
    return mask | torch.eye(S, dtype=torch.bool).view(1, 1, S, S)


def decode_mask(key_valid: torch.Tensor, end: int, sliding_window: int | None = None) -> torch.Tensor:
    """key_valid [B, T] bool, one query at slot end-1 -> mask [B, 1, 1, end] bool."""
    B = key_valid.shape[0]
    mask = key_valid[:, :end].clone()
    if sliding_window is not None and end > sliding_window:
        mask[:, : end - sliding_window] = False
    mask[:, end - 1] = True
    return mask.view(B, 1, 1, end)


def window_mask(mask: torch.Tensor, window: int) -> torch.Tensor:
    """mask [B, 1, S, T] (query s at slot T - S + s, key t at slot t: a prefill over its own keys, or one decode
    query after them) with the keys `window` or more slots before their query dropped (each query keeps its own)."""
    S, T = mask.shape[-2:]
    q_slot = torch.arange(T - S, T, device=mask.device).view(S, 1)
    k_slot = torch.arange(T, device=mask.device).view(1, T)
    return mask & (q_slot - k_slot < window)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None = None,
           rule: ScoreRule | None = None):
    """q [B, NH, S, D], k/v [B, KVH, T, D] (KVH divides NH), mask [B, 1, S, T] -> [B, NH, S, D]. A prefill
    whose mask is plain causal (no row padded, no window) runs as SDPA's causal case, which skips the blocks
    above the diagonal instead of computing and masking them (the output is bit-equal). With a score `rule`, the
    scores are computed here (`ruled_attention`)."""
    if rule is not None:
        return ruled_attention(q, k, v, mask, scale, rule)
    gqa = q.shape[1] != k.shape[1]
    if q.shape[2] == k.shape[2] > 1 and is_causal(mask):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def ruled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None,
                    rule: ScoreRule) -> torch.Tensor:
    """`attend` under a score rule, in float32 (SDPA has neither cap nor sinks): softmax over the rule's scores of
    scale q.k (masked) and each head's sink, times the values: q [B, NH, S, D], k/v [B, KVH, T, D], mask [B, 1, S, T]
    -> [B, NH, S, D] in q's dtype."""
    B, NH, S, D = q.shape
    KVH, T = k.shape[1], k.shape[2]
    scale = D**-0.5 if scale is None else scale
    qg = q.float().reshape(B, KVH, NH // KVH * S, D)  # the g query heads of a KV head, S positions each
    a = torch.matmul(qg, k.float().mT).mul_(scale).view(B, NH, S, T)
    a = rule.cap(a).masked_fill_(~mask, -math.inf)
    if rule.sinks is not None:  # one more logit per head, whose weight is dropped
        a = torch.cat([a, rule.sinks.float().view(1, NH, 1, 1).expand(B, NH, S, 1)], dim=-1)
    p = torch.softmax(a, dim=-1)[..., :T].reshape(B, KVH, NH // KVH * S, T)
    return torch.matmul(p, v.float()).view(B, NH, S, D).to(q.dtype)


def is_causal(mask: torch.Tensor) -> bool:
    """Whether mask [B, 1, S, S] lets each query see exactly the keys at or before it (a cheap pass over
    B * S * S booleans next to the attention's B * S * S * D multiply-adds)."""
    S = mask.shape[-1]
    return torch.equal(mask, torch.ones(S, S, dtype=torch.bool, device=mask.device).tril_().expand_as(mask))
