"""Decode attention on the CPU where the KV cache lives (FlexGen's delegation), over a plain or 4-bit cache.

Only q, the new k/v and the output cross tiers. The cache is walked in chunks of T: each chunk is dequantized
(or widened) to float32 into reused buffers and folded into an online softmax, so no full-precision copy of the
cache is ever made. For one query row and keys t, with scores a_t = scale * q . k_t (masked: -inf):

    m' = max(m, max_t a_t)        l' = l * e^(m - m') + sum_t e^(a_t - m')
    o' = o * e^(m - m') + sum_t e^(a_t - m') v_t          and at the end   out = o / l.

GQA: q [B, NH, 1, D] is viewed as [B, KVH, g, D] (NH = g * KVH), so each K/V head serves its g query heads
without copies."""

from __future__ import annotations

import math

import torch

from engine.compression.int4 import QTensor, dequantize, dequantize_transposed
from engine.kernels.attention import ScoreRule, attend, cap_scores, fold_sinks

CacheTensor = torch.Tensor | QTensor
CHUNK_BYTES = 4 << 20  # float32 bytes per chunk buffer: fastest here at B = 1 and B = 8 (64-1024 slots)


def auto_chunk(batch: int, kv_heads: int, padded_head_dim: int) -> int:
    """Slots per chunk so that one float32 chunk buffer holds about CHUNK_BYTES, within [64, 1024]."""
    per_slot = batch * kv_heads * padded_head_dim * 4
    return max(64, min(1024, CHUNK_BYTES // per_slot))


class ChunkBuffers:
    """Reused float32 K^T / V^T chunk buffers and a uint8 scratch, grown on demand, never cache-sized."""

    def __init__(self):
        self.k = self.v = self.scratch = None

    def _grow(self, buf, n: int, dtype, device) -> torch.Tensor:
        fits = buf is not None and buf.numel() >= n and buf.device == device
        return buf if fits else torch.empty(n, dtype=dtype, device=device)

    def reserve(self, n: int, device: torch.device | None = None) -> None:
        device = device or torch.device("cpu")
        self.k = self._grow(self.k, n, torch.float32, device)
        self.v = self._grow(self.v, n, torch.float32, device)
        self.scratch = self._grow(self.scratch, n, torch.uint8, device)


def chunk_t(x: CacheTensor, t0: int, t1: int, buf: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """Slots [t0, t1) of a cache [B, KVH, T, D] -> float32 X^T [B, KVH, D, t1 - t0] (in buf, or a view of x)."""
    if isinstance(x, QTensor):
        xt = dequantize_transposed(x.row_slice(t0, t1), out=buf, scratch=scratch)  # [B, KVH, Dp, Tc]
        return xt[:, :, : x.cols]
    chunk = x[:, :, t0:t1]  # [B, KVH, Tc, D]
    if chunk.dtype != torch.float32:  # widen in the cache's own layout: a streaming copy, not a transposing one
        chunk = buf[: chunk.numel()].view(chunk.shape).copy_(chunk)
    return chunk.mT  # [B, KVH, D, Tc]


def fold_chunk(state, qg, kt, vt, allowed, rule=None):
    """One online-softmax step. qg [B, KVH, g, D] (scaled), kt/vt [B, KVH, D, Tc], allowed [B, 1, 1, Tc]; scores
    soft-capped where the score `rule` says."""
    run_max, denom, o = state  # [B, KVH, g, 1], [B, KVH, g, 1], [B, KVH, g, D]
    a = cap_scores(torch.matmul(qg, kt), rule)  # [B, KVH, g, Tc]
    a.masked_fill_(~allowed, -math.inf)
    m_new = torch.maximum(run_max, a.amax(-1, keepdim=True))
    shift = torch.where(torch.isinf(m_new), 0.0, m_new)  # all masked so far: keep exp() finite
    alpha = torch.exp(run_max - shift)
    p = torch.exp(a - shift)  # [B, KVH, g, Tc]
    denom = denom * alpha + p.sum(-1, keepdim=True)
    o = o * alpha + torch.matmul(p, vt.mT)  # [B, KVH, g, D]
    return m_new, denom, o


def decode_attention(q: torch.Tensor, k: CacheTensor, v: CacheTensor, mask: torch.Tensor,
                     scale: float | None = None, chunk: int | None = None, buffers: ChunkBuffers | None = None,
                     rule: ScoreRule | None = None):
    """softmax(scale * q K^T, masked) V for one query per row, chunk by chunk along T, in float32.

    q [B, NH, 1, D]; k, v [B, KVH, T, D] tensors or QTensors (grouped along D); mask [B, 1, 1, T] bool
    (True = may attend) -> [B, NH, 1, D] in q's dtype. chunk: slots per step (None: auto_chunk)."""
    B, NH, S, D = q.shape
    KVH, T = k.shape[1], k.shape[2]
    assert S == 1 and NH % KVH == 0 and mask.shape[-1] == T, (q.shape, k.shape, mask.shape)
    scale = 1 / math.sqrt(D) if scale is None else scale
    qg = q.reshape(B, KVH, NH // KVH, D).float() * scale  # [B, KVH, g, D]
    state = (qg.new_full((*qg.shape[:3], 1), -math.inf), qg.new_zeros((*qg.shape[:3], 1)), torch.zeros_like(qg))
    state = fold_sinks(state, rule.sink_rows(KVH, 1) if rule is not None else None)
    _, denom, o = fold_cache(state, qg, k, v, mask, chunk, buffers, rule)
    return (o / denom).reshape(B, NH, 1, D).to(q.dtype)


def fold_cache(state, qg: torch.Tensor, k: CacheTensor, v: CacheTensor, allowed: torch.Tensor,
               chunk: int | None = None, buffers: ChunkBuffers | None = None, rule: ScoreRule | None = None):
    """Fold every slot of k, v [B, KVH, T, D] (tensors or QTensors) into the online-softmax state of scaled
    queries qg [B, KVH, n, D], chunk by chunk (None: auto_chunk); allowed [B, 1, n or 1, T] bool; scores
    soft-capped where the score `rule` says (its sinks are folded by the caller, once)."""
    B, KVH, _, D = qg.shape
    T = k.shape[2]
    buffers = buffers or ChunkBuffers()
    d_pad = k.buffer_shape[-2] if isinstance(k, QTensor) else D
    chunk = chunk or auto_chunk(B, KVH, d_pad)
    buffers.reserve(B * KVH * d_pad * min(chunk, T), qg.device)
    for t0 in range(0, T, chunk):
        t1 = min(t0 + chunk, T)
        kt = chunk_t(k, t0, t1, buffers.k, buffers.scratch)
        vt = chunk_t(v, t0, t1, buffers.v, buffers.scratch)
        state = fold_chunk(state, qg, kt, vt, allowed[..., t0:t1], rule)
    return state


def attention(q: torch.Tensor, k: CacheTensor, v: CacheTensor, mask: torch.Tensor, scale=None, chunk=None,
              rule: ScoreRule | None = None):
    """Dispatch: one query -> chunked decode_attention; a prefill over a QTensor cache -> dequantize, then SDPA
    (under the score `rule` where given)."""
    if q.shape[2] == 1:
        return decode_attention(q, k, v, mask, scale, chunk, rule=rule)
    if isinstance(k, QTensor):
        k, v = dequantize(k, dtype=q.dtype), dequantize(v, dtype=q.dtype)
    return attend(q, k, v, mask, scale, rule)
