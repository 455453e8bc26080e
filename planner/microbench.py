"""Microbenchmarks that pick the matmul path per phase: bf16 GEMM, 4-bit dequant (+ GEMM), aten int4pack.

Each figure is the median of `repeats` timed calls after a warm-up, measured side by side in one process;
GFLOP/s counts 2 * rows * N * K flops per call (the dequant time included where the path needs it)."""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from engine.compression.int4 import (
    DEFAULT_CONFIG,
    QuantConfig,
    dequantize,
    dequantize_transposed,
    int4_linear,
    pack_int4,
    quantize,
)
from engine.kernels.cpu_attention import ChunkBuffers, decode_attention


def timed_call(fn):
    """fn()'s result and its wall time in seconds: the one timer of the profiler, the probes and the benchmarks
    (the calls below repeat it; a benchmark that also needs what fn returns calls it directly)."""
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def timings(fn, repeats: int = 5, warmup: int = 1) -> list[float]:
    """Wall times of `repeats` calls of fn(), after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    return [timed_call(fn)[1] for _ in range(repeats)]


def median_seconds(fn, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of fn() over `repeats` calls, after `warmup` untimed calls."""
    return statistics.median(timings(fn, repeats, warmup))


def best_seconds(fn, repeats: int = 5, warmup: int = 1) -> float:
    """The fastest of `repeats` timed calls of fn(), after `warmup` untimed ones."""
    return min(timings(fn, repeats, warmup))


def gflops(rows: int, n: int, k: int, seconds: float) -> float:
    """2 * rows * n * k / seconds, in GFLOP/s."""
    return 2 * rows * n * k / seconds / 1e9


def naive_dequantize(qt, dtype: torch.dtype) -> torch.Tensor:
    """The straightforward eager baseline: unpack into [N, ng, G] and broadcast m, s along the row-major groups."""
    data = qt.data.movedim(-1, 0)  # [N, ng, G/2]
    q = torch.cat([data & 15, data >> 4], dim=-1).to(dtype)  # [N, ng, G]
    w = q * qt.scales.T.to(dtype).unsqueeze(-1) + qt.mins.T.to(dtype).unsqueeze(-1)
    return w.reshape(data.shape[0], -1)[:, : qt.cols]


def dequant_timings(qt, dtype: torch.dtype, repeats: int) -> dict:
    """ms to dequantize qt: ours with reused buffers, ours allocating, and the naive baseline."""
    out = torch.empty(qt.buffer_shape, dtype=dtype)
    scratch = torch.empty(qt.buffer_shape, dtype=torch.uint8)
    ours = median_seconds(lambda: dequantize_transposed(qt, out, scratch), repeats)
    fresh = median_seconds(lambda: dequantize_transposed(qt, dtype=dtype), repeats)
    naive = median_seconds(lambda: naive_dequantize(qt, dtype), repeats)
    return {"dequant_ms": ours * 1e3, "dequant_alloc_ms": fresh * 1e3, "naive_dequant_ms": naive * 1e3,
            "naive_over_ours": naive / ours}


def row_timings(qt, w: torch.Tensor, rows: int, dequant_s: float, repeats: int) -> dict:
    """For one row count: bf16 GEMM, dequant + bf16 GEMM (on the transposed buffer), int4pack_mm."""
    n, k = w.shape
    x = torch.randn(rows, k, dtype=w.dtype)
    wt = dequantize(qt, dtype=w.dtype)  # a [N, K] view of W^T contiguous, as the dequant path leaves it
    packed = pack_int4(qt, w.dtype)
    gemm = median_seconds(lambda: F.linear(x, w), repeats)
    gemm_t = median_seconds(lambda: F.linear(x, wt), repeats)
    int4 = median_seconds(lambda: int4_linear(x, packed), repeats)
    return {"rows": rows, "gemm_gflops": gflops(rows, n, k, gemm),
            "gemm_transposed_gflops": gflops(rows, n, k, gemm_t),
            "dequant_gemm_gflops": gflops(rows, n, k, gemm_t + dequant_s),
            "int4pack_gflops": gflops(rows, n, k, int4), "gemm_ms": gemm * 1e3, "int4pack_ms": int4 * 1e3}


def layer_report(n: int = 4096, k: int = 4096, rows=(1, 16, 256), dtype=torch.bfloat16,
                 cfg: QuantConfig = DEFAULT_CONFIG, repeats: int = 5) -> dict:
    """All paths for one [n, k] Linear layer; dequant + GEMM counts one dequant per GEMM call
    (a zig-zag block reuses one dequant over num_gb GEMMs, so that figure is a lower bound)."""
    torch.manual_seed(0)
    w = (torch.randn(n, k) * 0.02).to(dtype)
    qt = quantize(w, cfg)
    deq = dequant_timings(qt, dtype, repeats)
    per_rows = [row_timings(qt, w, r, deq["dequant_ms"] / 1e3, repeats) for r in rows]
    return {"n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "group_size": cfg.group_size,
            "threads": torch.get_num_threads(), "weight_bytes": w.numel() * w.element_size(),
            "packed_bytes": qt.nbytes, **deq, "by_rows": per_rows}


def attention_report(batch: int = 8, heads: int = 32, kv_heads: int = 8, slots: int = 2048, head_dim: int = 128,
                     chunk: int | None = None, repeats: int = 5) -> dict:
    """Decode attention (1 query per row): SDPA vs our chunked path over bf16 and float32 caches, and the chunked
    path over a 4-bit cache. GB/s counts the cache bytes each path reads per call (2 or 4 bytes per value; 4-bit:
    QTensor.nbytes)."""
    torch.manual_seed(0)
    q = torch.randn(batch, heads, 1, head_dim, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, kv_heads, slots, head_dim, dtype=torch.bfloat16) for _ in range(2))
    qk, qv = quantize(k), quantize(v)
    mask = torch.ones(batch, 1, 1, slots, dtype=torch.bool)
    bufs = ChunkBuffers()
    sdpa = median_seconds(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), repeats)
    plain = median_seconds(lambda: decode_attention(q, k, v, mask, chunk=chunk, buffers=bufs), repeats)
    quant = median_seconds(lambda: decode_attention(q, qk, qv, mask, chunk=chunk, buffers=bufs), repeats)
    q32, k32, v32 = q.float(), k.float(), v.float()
    sdpa32 = median_seconds(lambda: F.scaled_dot_product_attention(q32, k32, v32, attn_mask=mask, enable_gqa=True),
                            repeats)
    plain32 = median_seconds(lambda: decode_attention(q32, k32, v32, mask, chunk=chunk, buffers=bufs), repeats)
    bf16_bytes, q4_bytes = 2 * k.numel() * k.element_size(), qk.nbytes + qv.nbytes
    return {"sdpa_f32_gb_s": 2 * bf16_bytes / sdpa32 / 1e9, "chunked_f32_gb_s": 2 * bf16_bytes / plain32 / 1e9,
            "sdpa_bf16_gb_s": bf16_bytes / sdpa / 1e9, "chunked_bf16_gb_s": bf16_bytes / plain / 1e9,
            "chunked_4bit_gb_s": q4_bytes / quant / 1e9, "sdpa_bf16_ms": sdpa * 1e3,
            "chunked_bf16_ms": plain * 1e3, "chunked_4bit_ms": quant * 1e3, "threads": torch.get_num_threads()}
