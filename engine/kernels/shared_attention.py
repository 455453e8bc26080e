"""Attention over a prefix that every row of a block shares, plus each row's own cache (cascade attention, as in
Hydragen): the shared keys are seen by every query, so the queries of all rows meet them in one matrix product
per KV head instead of one small product per row, and the shared K/V exist once instead of once per row. The two
parts are merged exactly by their log-sum-exp: the prefix's (max, sum of exponentials, weighted values) is the
starting state of the online softmax that then folds in the row's own slots (engine/kernels/cpu_attention.py, or
the project's own kernels, engine/kernels/own_attention.py, where they were measured fastest for the shape: the
prefill kernel starts its query rows from the prefix's state, the decode kernel folds the slots into it).

Shapes: q [B, NH, S, D] (S = 1 at decode), the row's own K/V [B, KVH, T, D] (tensors or 4-bit QTensors) under
mask [B, 1, S, T], the shared K/V [1, KVH, P, D], visible to every query. GQA: the g = NH / KVH query heads of a
KV head and the S positions are one group of g * S query rows."""

from __future__ import annotations

import math

import torch

from engine.compression.int4 import QTensor
from engine.kernels import decode_choice, own_attention, prefill_choice
from engine.kernels.attention import ScoreRule, cap_scores, fold_sinks
from engine.kernels.cpu_attention import fold_cache

SCORE_BYTES = 64 << 20  # float32 scores of the shared part computed at once (rows are taken in groups to fit)


def shared_state(qg: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor, rule: ScoreRule | None = None):
    """Online-softmax state of scaled queries qg [B, KVH, n, D] over the shared K/V [1, KVH, P, D]: running max
    [B, KVH, n, 1], sum of exponentials [B, KVH, n, 1] and weighted values [B, KVH, n, D], float32. Every row's
    queries of a KV head form one [B * n, D] x [D, P] product."""
    B, KVH, n, D = qg.shape
    kT, v = pk[0].float().mT, pv[0].float()  # [KVH, D, P], [KVH, P, D]
    rows = max(1, SCORE_BYTES // (KVH * n * kT.shape[-1] * 4))
    parts = []
    for b0 in range(0, B, rows):
        q = qg[b0 : b0 + rows]
        r = q.shape[0]
        a = cap_scores(torch.matmul(q.transpose(0, 1).reshape(KVH, r * n, D), kT), rule)  # [KVH, r n, P]
        m = a.amax(-1, keepdim=True)
        p = a.sub_(m).exp_()
        parts.append([x.view(KVH, r, n, -1).transpose(0, 1) for x in (m, p.sum(-1, keepdim=True), torch.matmul(p, v))])
    return tuple(torch.cat(xs) if len(xs) > 1 else xs[0] for xs in zip(*parts))


def shared_prefix_attention(q: torch.Tensor, k, v, mask: torch.Tensor, shared: tuple[torch.Tensor, torch.Tensor],
                            scale: float | None = None, chunk: int | None = None,
                            rule: ScoreRule | None = None) -> torch.Tensor:
    """softmax over [shared keys ; the row's own keys (masked)] of scale * q k (under the score `rule` where given:
    the own kernels know none), times the values -> [B, NH, S, D] in q's dtype. `shared` is (K, V) [1, KVH, P, D];
    the own part is walked in chunks of slots (None: auto)."""
    B, NH, S, D = q.shape
    KVH, T = shared[0].shape[1], k.shape[2]
    g = NH // KVH
    scale = 1 / math.sqrt(D) if scale is None else scale
    qg = q.reshape(B, KVH, g * S, D).float() * scale  # query row j * S + s: head j of the group, position s
    state = shared_state(qg, *shared, rule)
    own = rule is None  # the own kernels know no score rule
    if rule is not None:
        state = fold_sinks(state, rule.sink_rows(KVH, S))
    if own and S > 1 and own_prefill(q, k):
        m, denom, o = state
        return own_attention.prefill_attention(q, k, v, mask, scale, (m.squeeze(-1), denom.squeeze(-1), o))
    if own and S == 1 and own_decode(q, k):
        _, denom, o = fold_own(state, qg, k, v, mask.reshape(B, T))
    else:
        allowed = mask.unsqueeze(2).expand(B, 1, g, S, T).reshape(B, 1, g * S, T)
        _, denom, o = fold_cache(state, qg, k, v, allowed, chunk, rule=rule)
    return (o / denom).reshape(B, NH, S, D).to(q.dtype)


def own_decode(q: torch.Tensor, k) -> bool:
    """Whether a decode folds the row's own slots with the own kernel: the one measured fastest for the shape."""
    B, NH, _, D = q.shape
    kind = "4bit" if isinstance(k, QTensor) else "plain"
    return (q.device.type == "cpu" and own_attention.supports(q, k)
            and decode_choice.decode_kernel(kind, q.dtype, B, NH, k.shape[1], D) == "own")


def own_prefill(q: torch.Tensor, k) -> bool:
    """Whether a prefill attends over the row's own tokens with the own kernel (bf16, by engine/kernels/prefill_choice.py's rule)."""
    B, NH, _, D = q.shape
    return (own_attention.supports_prefill(q, k)
            and prefill_choice.prefill_kernel(q.dtype, B, NH, k.shape[1], D) == "own")


def fold_own(state, qg: torch.Tensor, k, v, mask: torch.Tensor):
    """fold_cache by the own kernel: the state of scaled queries qg [B, KVH, n, D] ([B, KVH, n, 1] max and
    denominator) with the slots of k, v [B, KVH, T, D] that mask [B, T] allows, in one pass over each."""
    m, denom, o = (x.contiguous() for x in state)
    own_attention.fold((m.squeeze(-1), denom.squeeze(-1), o), qg, k, v, mask, 1.0)
    return m, denom, o
