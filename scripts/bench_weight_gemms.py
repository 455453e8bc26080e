"""Decode GEMMs of each weight form on this machine against a plain memory read timed in the same rounds: a model's
worth of distinct layers (the 100m preset's fused shapes by default: qkv, o, gate_up, down) computed one after
another at R rows, so that every weight comes from memory as in a decode step, not from a cache that one shape's
weight would fit in. Per form and row count: GB/s of the weight bytes as kept, GFLOP/s, and the median over rounds
of its GB/s over the read's (a large tensor's sum) in the same round. Forms: float32 reordered for oneDNN (the
engine's float32 weights), bfloat16 in the bf16 x float32 kernel's tiles (bf16 at rest), 4-bit and int8 in the own
kernels' tiles. One thread's rounds are timed in that thread's CPU time (other processes' share not counted).

    python scripts/bench_weight_gemms.py [--threads 1] [--rows 1,32,96,512] [--repeats 5] [--layers 8]

The AVX2 paths on an AVX-512 CPU, torch's GEMMs held to AVX2 as well:
    FLEXBATCH_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \\
        python scripts/bench_weight_gemms.py"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from engine.compression.int4 import quantize
from engine.compression.int8 import quantize_int8
from engine.dtypes import cpu_info
from engine.kernels import bf16_tiles, compiled, int4_tiles, int8_tiles, onednn_dense

SHAPES = ((1536, 1024), (1024, 1024), (5632, 1024), (1024, 2816))  # fused qkv, o, gate_up, down of the 100m preset
READ_BYTES = 512 << 20
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16")


def forms(layers: int) -> dict[str, tuple[list, Callable]]:
    """Per form: each distinct weight as kept (its `nbytes` what a step reads) and its call y = x W^T."""
    ws = [torch.randn(n, k) * 0.02 for _ in range(layers) for n, k in SHAPES]
    return {"float32 oneDNN": ([onednn_dense.pack(w) for w in ws], onednn_dense.linear),
            "bf16 own": ([bf16_tiles.pack(w.bfloat16()) for w in ws], bf16_tiles.linear),
            "4-bit own": ([int4_tiles.pack(quantize(w)) for w in ws], int4_tiles.linear),
            "int8 own": ([int8_tiles.pack(quantize_int8(w)) for w in ws], int8_tiles.linear)}


def clock():
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def rounds(fns, repeats: int) -> list[list[float]]:
    """Seconds of each of `fns` per round, interleaved after one warm-up call each."""
    for fn in fns:
        fn()
    times, now = [[] for _ in fns], clock()
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = now()
            fn()
            times[i].append(now() - t0)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,32,96,512")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--layers", type=int, default=8)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    flags = set((cpu_info("flags") or "").split())
    print(f"CPU flags: {' '.join(f for f in FLAGS if f in flags)}; kernels {compiled.ops().isa()}; torch "
          f"{torch.backends.cpu.get_cpu_capability()}; threads {args.threads}; load {open('/proc/loadavg').read()[:14]}")
    kept = forms(args.layers)
    big = torch.ones(READ_BYTES // 4)
    print("| rows | form | GB/s of weights | GFLOP/s | / read |")
    print("|---|---|---|---|---|")
    for m in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(m, k) for k in {k for _, k in SHAPES}}
        flops = 2 * m * args.layers * sum(n * k for n, k in SHAPES)

        def step(weights, call, xs=xs):
            return lambda: [call(xs[SHAPES[i % len(SHAPES)][1]], w) for i, w in enumerate(weights)]

        names = list(kept)
        with torch.inference_mode():
            times = rounds([step(*kept[n]) for n in names] + [lambda: big.sum()], args.repeats)
        read = [READ_BYTES / t / 1e9 for t in times[-1]]
        print(f"| {m} | read | {statistics.median(read):.1f} | - | 1.00 |")
        for name, t in zip(names, times):
            nbytes = sum(w.nbytes for w in kept[name][0])
            gbs = [nbytes / s / 1e9 for s in t]
            ratio = statistics.median(g / r for g, r in zip(gbs, read))
            print(f"| {m} | {name} | {statistics.median(gbs):.1f} | {flops / statistics.median(t) / 1e9:.1f} | "
                  f"{ratio:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
