"""Decode attention by the project's own kernel (engine/kernels/csrc/attn_*.cpp): one query per row over the KV
cache as it is stored (float32, bfloat16 or the 4-bit QTensor), read once, with no widened copy of any chunk.

Each (row, KV head) is one work item: its g query heads (GQA) are scored against every slot in one pass over K,
and the probabilities weight the values in one pass over V, both in float32 (bf16 caches through AVX512-BF16 dot
products, whose bf16 x bf16 products are exact; float32 queries are split into two bf16 halves there, so that
their precision is kept). The result is the online-softmax state of `engine/kernels/cpu_attention.py`, left
unnormalized:

    m = max_t a_t        l = sum_t e^(a_t - m)        o = sum_t e^(a_t - m) v_t          out = o / l,

so that a second source (a block's shared prefix, engine/kernels/shared_attention.py) folds in before or after.
Masked slots are skipped (left padding costs no reads of V); a slot no query may see is read by nobody.

Shapes: q [B, KVH, n, D] (n query rows per KV head), K/V [B, KVH, T, D] (strided views of a longer cache are read
in place: rows must be contiguous), mask [B, T] bool shared by the n rows; state m, l [B, KVH, n], o [B, KVH, n, D]
float32. D must be a multiple of 16 up to 256 (`supports`); elsewhere the caller keeps the PyTorch path.

Prefill attention (`prefill_attention`, bf16 only) runs as flash attention does: blocks of 64 query rows (the g
heads of a KV head at 64 / g positions) against blocks of 64 keys, the online softmax in float32 between the two
products. On AVX512-BF16 (attn_prefill_avx512.cpp) K and V are packed once per (row, KV head) into the pairs
vdpbf16ps multiplies and the probabilities are rounded to bf16 before the product with V; on AVX2
(attn_prefill_avx2.cpp) they are widened to float32 once and both products are float32 FMAs."""

from __future__ import annotations

import math

import torch

from engine.compression.int4 import QTensor
from engine.kernels import compiled
from engine.kernels.attention import is_causal

MAX_HEAD_DIM = 256


def available() -> bool:
    mod = compiled.ops()
    return mod is not None and mod.isa() != "none"


def supports(q: torch.Tensor, k) -> bool:
    """Whether the kernel takes this query and cache: on the CPU, float32 or bfloat16 queries, a head size that
    is a multiple of 16 up to 256, and a float32/bf16 cache with contiguous rows or a 4-bit one grouped along D."""
    D = q.shape[-1]
    if q.device.type != "cpu" or q.dtype not in (torch.float32, torch.bfloat16) or D % 16 or D > MAX_HEAD_DIM:
        return False
    if isinstance(k, QTensor):
        ok = k.dim == len(k.shape) - 1 and k.data.device.type == "cpu" and k.config.group_size % 2 == 0
    else:
        ok = k.device.type == "cpu" and k.dtype in (torch.float32, torch.bfloat16) and k.stride(-1) == 1
    return ok and available()


def new_state(B: int, KVH: int, n: int, D: int):
    """The state of nothing seen yet: m = -inf, l = 0, o = 0."""
    return (torch.full((B, KVH, n), -math.inf), torch.zeros(B, KVH, n), torch.zeros(B, KVH, n, D))


def fold(state, q: torch.Tensor, k, v, mask: torch.Tensor | None, scale: float):
    """Fold every slot of k, v [B, KVH, T, D] (tensors or QTensors) into `state` (updated in place and returned)
    for queries q [B, KVH, n, D], scores scale * q . k; mask [B, T] bool or None (every slot)."""
    m, denom, o = state
    mask = torch.empty(0, dtype=torch.bool) if mask is None else mask
    mod = compiled.ops()
    with compiled.profiled("attention fold"):
        if isinstance(k, QTensor):
            mod.attn_fold_int4(q, k.data, k.mins, k.scales, v.data, v.mins, v.scales, k.config.group_size, mask,
                               scale, m, denom, o)
        else:
            mod.attn_fold(q, k, v, mask, scale, m, denom, o)
    return state


def decode_attention(q: torch.Tensor, k, v, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """softmax(scale * q K^T, masked) V for one query per row: q [B, NH, 1, D], k/v [B, KVH, T, D] tensors or
    QTensors, mask [B, 1, 1, T] bool (True = may attend) -> [B, NH, 1, D] in q's dtype."""
    B, NH, S, D = q.shape
    KVH, T = k.shape[1], k.shape[2]
    assert S == 1 and NH % KVH == 0 and mask.shape[-1] == T, (q.shape, k.shape, mask.shape)
    scale = 1 / math.sqrt(D) if scale is None else scale
    qg = q.reshape(B, KVH, NH // KVH, D)
    _, denom, o = fold(new_state(B, KVH, NH // KVH, D), qg, k, v, mask.reshape(B, T), scale)
    return (o / denom.unsqueeze(-1)).reshape(B, NH, 1, D).to(q.dtype)


def supports_prefill(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the prefill kernel takes this query and K/V: bf16 on the CPU (float32 keeps SDPA), rows
    contiguous, a head size that is a multiple of 16 up to 256, and a kernel for the chosen instruction set
    (AVX-512 or AVX2)."""
    D = q.shape[-1]
    if not isinstance(k, torch.Tensor) or q.device.type != "cpu" or D % 16 or D > MAX_HEAD_DIM:
        return False
    if q.dtype != torch.bfloat16 or k.dtype != torch.bfloat16 or q.stride(-1) != 1 or k.stride(-1) != 1:
        return False
    return available() and compiled.ops().has_prefill()


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float | None = None, state=None) -> torch.Tensor:
    """softmax(scale * q K^T, masked) V for a prefill, blocked as flash attention is (64 query rows x 64 keys,
    float32 online softmax): q [B, NH, S, D], k/v [B, KVH, T, D] bf16, mask [B, 1, S, T] bool ->
    [B, NH, S, D] bf16. A plain causal mask (S = T, no padding) is not read: the blocks above the diagonal are
    skipped. `state`: the (m, l, o) each query row starts from (another source's, e.g. a shared prefix: float32
    [B, KVH, g S], [B, KVH, g S], [B, KVH, g S, D], row j S + s for head j of the group at position s)."""
    B, NH, S, D = q.shape
    scale = 1 / math.sqrt(D) if scale is None else scale
    state = [] if state is None else [x.contiguous() for x in state]
    causal = S == k.shape[2] and is_causal(mask)
    mask = torch.empty(0, dtype=torch.bool) if causal else mask.expand(B, 1, S, k.shape[2])[:, 0]
    with compiled.profiled("attention prefill"):
        return compiled.ops().attn_prefill(q, k, v, mask, causal, scale, state)
