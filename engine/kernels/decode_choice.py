"""Which kernel runs decode attention (one query per row) over a KV cache, by measured rate: the chunked
online softmax (`engine/kernels/cpu_attention.py`: float32, chunk by chunk, never a full-precision copy of a 4-bit
cache), PyTorch's SDPA (over the cache as stored, or over a dequantized copy of a 4-bit cache), or the project's
own kernel (`engine/kernels/own_attention.py`: the cache read once as stored), where it is built and takes the
shape; the chunked path and SDPA remain wherever it is not.

All are exact attention; they differ in rounding only (SDPA computes in the cache's dtype, the chunked path and
the own kernel in float32), and greedy float32 tokens equal transformers' with each
(tests/engine/kernels/test_decode_choice.py, test_own_attention.py). The
choice is measured once per cache kind ("plain" or "4bit"), dtype and head shape, for the batch rounded up to a
power of two, at a few cache lengths (both kernels timed interleaved, fewest seconds), and cached beside the GEMM
crossovers (`engine/kernels/rates.py`: keyed by machine, measured again when stale or implausible)."""

from __future__ import annotations

import torch

from engine.compression.int4 import DEFAULT_CONFIG, QTensor, QuantConfig, dequantize, quantize
from engine.kernels import own_attention
from engine.kernels.attention import attend
from engine.kernels.cpu_attention import decode_attention
from engine.kernels.rates import cached, entry_key, fewest_seconds
from engine.memory.room import memory_room

KERNELS = ("chunked", "sdpa", "own")
# cache lengths measured (those whose K and V fit MAX_BYTES): a decode's lengths fall anywhere, so each lies
# half a chunk past a multiple of the chunked path's 64-slot chunks (at 64 exactly, one chunk flattered it)
SLOTS = (96, 288, 1056)
MEASURE = "m3"  # of the lengths measured, in the entries' key: entries measured at other lengths are measured again
MAX_BYTES = 64 << 20
KV_CONFIG = QuantConfig(DEFAULT_CONFIG.bits, DEFAULT_CONFIG.group_size, dim=-1)  # as engine.compression.codecs.KVCodec


def decode(q: torch.Tensor, k, v, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Decode attention by the kernel measured faster: q [B, NH, 1, D], k/v [B, KVH, T, D] tensors or QTensors,
    mask [B, 1, 1, T] -> [B, NH, 1, D]."""
    B, NH, _, D = q.shape
    kind = "4bit" if isinstance(k, QTensor) else "plain"
    if q.device.type != "cpu":  # measured on the CPU only; elsewhere the chunked path, as before
        return decode_attention(q, k, v, mask, scale)
    kernel = decode_kernel(kind, q.dtype, B, NH, k.shape[1], D)
    if kernel == "own" and own_attention.supports(q, k):
        return own_attention.decode_attention(q, k, v, mask, scale)
    if kernel == "sdpa":
        return sdpa(q, k, v, mask, scale)
    return decode_attention(q, k, v, mask, scale)


def sdpa(q: torch.Tensor, k, v, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    if isinstance(k, QTensor):
        k, v = dequantize(k, dtype=q.dtype), dequantize(v, dtype=q.dtype)
    return attend(q, k, v, mask, scale)


def decode_kernel(kind: str, dtype: torch.dtype, batch: int, heads: int, kv_heads: int, head_dim: int) -> str:
    """"chunked", "sdpa" or "own" for this cache kind, dtype and shape, from the cache or measured now."""
    rows = 1 << max(0, batch - 1).bit_length()
    key = entry_key("decode-attention", kind, dtype, f"{rows}x{heads}x{kv_heads}x{head_dim}", MEASURE)
    return cached(key, lambda: measure(kind, dtype, rows, heads, kv_heads, head_dim))["kernel"]


def kv_bytes(batch: int, kv_heads: int, slots: int, head_dim: int) -> int:
    """Float32 K and V of a measuring cache."""
    return 2 * batch * kv_heads * slots * head_dim * 4


def measure(kind: str, dtype: torch.dtype, batch: int, heads: int, kv_heads: int, head_dim: int,
            repeats: int = 5) -> dict:
    """Each kernel (the own one where it is built and takes the shape) at each length of SLOTS whose float32 K
    and V fit the measuring budget (at least the first); the fastest over all. The budget is MAX_BYTES, or a
    sixteenth of the memory this process may still fill if less (the measurement runs inside a job, beside its
    budgeted tensors); where even the first length does not fit it, fewer rows are measured (every kernel's time
    is linear in the rows)."""
    room = memory_room().available_bytes
    limit = MAX_BYTES if room is None else min(MAX_BYTES, int(room // 16))
    while batch > 1 and kv_bytes(batch, kv_heads, SLOTS[0], head_dim) > limit:
        batch //= 2
    timings = []
    with torch.inference_mode():
        for slots in SLOTS:
            if timings and kv_bytes(batch, kv_heads, slots, head_dim) > limit:
                break
            q = torch.randn(batch, heads, 1, head_dim).to(dtype)
            k, v = (torch.randn(batch, kv_heads, slots, head_dim).to(dtype) for _ in range(2))
            if kind == "4bit":
                k, v = quantize(k, KV_CONFIG), quantize(v, KV_CONFIG)
            mask = torch.ones(batch, 1, 1, slots, dtype=torch.bool)
            timings.append({"rows": slots} | time_kernels(q, k, v, mask, repeats))
    totals = {name: sum(t[f"{name}_s"] for t in timings) for name in KERNELS if f"{name}_s" in timings[0]}
    return {"kernel": min(totals, key=totals.get), "timings": timings, "batch_measured": batch}


def time_kernels(q: torch.Tensor, k, v, mask: torch.Tensor, repeats: int) -> dict:
    """{"<kernel>_s": fewest seconds} of each kernel that takes this query and cache, timed interleaved."""
    paths = {"chunked": lambda: decode_attention(q, k, v, mask), "sdpa": lambda: sdpa(q, k, v, mask)}
    if own_attention.supports(q, k):
        paths["own"] = lambda: own_attention.decode_attention(q, k, v, mask)
    return {f"{name}_s": s for name, s in zip(paths, fewest_seconds(list(paths.values()), repeats))}
