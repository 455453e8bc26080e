"""Which kernel runs a prefill's attention (queries over their own new K/V), by measured rate: PyTorch's SDPA
(`engine/kernels/attention.py` `attend`) or the project's own blocked kernel (`engine/kernels/own_attention.py`,
bf16 only, AVX-512 and AVX2). Both are exact attention up to rounding (the own kernel on AVX-512 rounds the
probabilities to bf16 before the product with V, as flash attention does; on AVX2 it keeps them in float32;
SDPA's bf16 path rounds more).

The choice is measured once per dtype and head shape, for the batch rounded up to a power of two (up to 8: the
rate per query hardly changes beyond), on causal prompts of a few lengths (both kernels timed interleaved,
fewest seconds), and cached beside the decode choice (`engine/kernels/rates.py`)."""

from __future__ import annotations

import torch

from engine.kernels import own_attention
from engine.kernels.attention import attend, prefill_mask
from engine.kernels.rates import cached, entry_key, fewest_seconds
from engine.memory.room import memory_room

KERNELS = ("sdpa", "own")
LENGTHS = (256, 1024)  # prompt lengths measured (those whose q, k, v fit MAX_BYTES, at least the first)
MEASURE = "p1"
MAX_BYTES = 64 << 20


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            scale: float | None = None) -> torch.Tensor:
    """Prefill attention by the kernel measured faster: q [B, NH, S, D], k/v [B, KVH, T, D], mask [B, 1, S, T]
    -> [B, NH, S, D]; SDPA off the CPU and wherever the own kernel does not apply."""
    B, NH, _, D = q.shape
    if own_attention.supports_prefill(q, k) and prefill_kernel(q.dtype, B, NH, k.shape[1], D) == "own":
        return own_attention.prefill_attention(q, k, v, mask, scale)
    return attend(q, k, v, mask, scale)


def prefill_kernel(dtype: torch.dtype, batch: int, heads: int, kv_heads: int, head_dim: int) -> str:
    """"sdpa" or "own" for this dtype and shape, from the cache or measured now."""
    rows = min(8, 1 << max(0, batch - 1).bit_length())
    key = entry_key("prefill-attention", dtype, f"{rows}x{heads}x{kv_heads}x{head_dim}", MEASURE)
    return cached(key, lambda: measure(dtype, rows, heads, kv_heads, head_dim))["kernel"]


def qkv_bytes(batch: int, heads: int, kv_heads: int, length: int, head_dim: int) -> int:
    return batch * (heads + 2 * kv_heads) * length * head_dim * 2


def measure(dtype: torch.dtype, batch: int, heads: int, kv_heads: int, head_dim: int, repeats: int = 3) -> dict:
    """Both kernels on causal prompts of each length of LENGTHS whose q, k, v fit the measuring budget (MAX_BYTES,
    or a sixteenth of the memory this process may still fill if less; at least the first length, with fewer rows
    where needed); the faster over all."""
    room = memory_room().available_bytes
    limit = MAX_BYTES if room is None else min(MAX_BYTES, int(room // 16))
    while batch > 1 and qkv_bytes(batch, heads, kv_heads, LENGTHS[0], head_dim) > limit:
        batch //= 2
    timings = []
    with torch.inference_mode():
        for length in LENGTHS:
            if timings and qkv_bytes(batch, heads, kv_heads, length, head_dim) > limit:
                break
            q = torch.randn(batch, heads, length, head_dim).to(dtype)
            k, v = (torch.randn(batch, kv_heads, length, head_dim).to(dtype) for _ in range(2))
            mask = prefill_mask(torch.ones(batch, length, dtype=torch.bool))
            paths = [lambda: attend(q, k, v, mask), lambda: own_attention.prefill_attention(q, k, v, mask)]  # noqa: B023
            sdpa_s, own_s = fewest_seconds(paths, repeats)
            timings.append({"rows": length, "sdpa_s": sdpa_s, "own_s": own_s})
    faster = sum(t["own_s"] for t in timings) < sum(t["sdpa_s"] for t in timings)
    return {"kernel": "own" if faster else "sdpa", "timings": timings, "batch_measured": batch}
