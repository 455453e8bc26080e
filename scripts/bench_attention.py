"""Decode and prefill attention figures on this machine, side by side with today's PyTorch paths and the
machine's own ceilings timed in the same rounds: decode as cache GB/s against a plain memory read (a large
tensor's sum), prefill as GFLOP/s against torch.mm (bfloat16 for the AVX-512 kernel, whose products are bf16;
float32 for the AVX2 one, whose products are float32), each timed interleaved with the kernels. `--isas avx512,avx2`
times the own kernels under each instruction set in the same rounds. The machine is shared: every figure is the
median of `--repeats` interleaved rounds, a ratio the median of the rounds' own ratios; on one thread (`--threads
1`) the rounds are timed in the thread's CPU time. The C heap runs under the engine's default policy (engine/memory/heap.py:
freed blocks reused, not faulted in afresh at every call), as the kernels run inside an engine.

    python scripts/bench_attention.py [--threads 2] [--repeats 5] [--heads 32 --kv-heads 8 --head-dim 128]

The AVX2 path on an AVX-512 CPU, with torch's GEMMs held to AVX2 as well (so that the peak is an AVX2 one):
    FLEXBATCH_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
        python scripts/bench_attention.py"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from engine.compression.int4 import quantize
from engine.dtypes import cpu_info
from engine.kernels import compiled, cpu_attention, decode_choice, own_attention
from engine.kernels.attention import attend, prefill_mask
from engine.memory import heap

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")


READ_BYTES = 512 << 20


def clock():
    """The timer: on one thread, the calling thread's CPU time (torch's ops and the kernels then run on it, and the
    time other processes take the core from it is not counted: on a shared machine the figures are those of the
    code, not of the load); else wall time."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def rounds(fns, repeats: int) -> list[list[float]]:
    """Seconds of each of `fns` in each of `repeats` rounds, timed interleaved (after one warm-up call each): a
    round's figures were taken under the same load, so their ratios hold even where the load drifts."""
    for fn in fns:
        fn()
    times, now = [[] for _ in fns], clock()
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = now()
            fn()
            times[i].append(now() - t0)
    return times


def median_ratio(rates_a, rates_b) -> float:
    """The median over rounds of a's rate over b's in the same round."""
    return statistics.median(a / b for a, b in zip(rates_a, rates_b))


def read_path():
    """A plain memory read: the sum of a 512 MiB float32 tensor."""
    x = torch.ones(READ_BYTES // 4)
    return lambda: x.sum()


PEAK_SHAPE = (1024, 4096, 1024)  # the GEMM whose rate is the prefill's peak: [rows x inner] x [inner x cols]
PEAK_DTYPE = {"avx512": torch.bfloat16, "avx2": torch.float32}  # the products each set's prefill kernel makes


def mm_path(dtype: torch.dtype):
    rows, inner, cols = PEAK_SHAPE
    a, b = torch.randn(rows, inner).to(dtype), torch.randn(inner, cols).to(dtype)
    return lambda: torch.mm(a, b)


def with_isa(isa: str, fn):
    """fn run with the own kernels pinned to `isa` (and the previous choice put back)."""
    mod = compiled.ops()

    def run():
        before = mod.isa()
        mod.select_isa(isa)
        try:
            return fn()
        finally:
            mod.select_isa(before if before != "none" else "scalar")

    return run


def cache_bytes(k) -> int:
    return k.nbytes if hasattr(k, "nbytes") and not isinstance(k, torch.Tensor) else k.numel() * k.element_size()


def decode_row(kind: str, B: int, T: int, heads: int, kv_heads: int, D: int, repeats: int, isas,
               baselines: bool) -> dict:
    """Cache GB/s of the own kernel under each set, PyTorch's paths (`baselines`) and the plain read, all timed in
    the same rounds, and each own kernel's share of the read rate."""
    dtype = torch.float32 if kind == "float32" else torch.bfloat16
    q = torch.randn(B, heads, 1, D).to(dtype)
    k, v = (torch.randn(B, kv_heads, T, D).to(dtype) for _ in range(2))
    if kind == "4bit":
        k, v = quantize(k, decode_choice.KV_CONFIG), quantize(v, decode_choice.KV_CONFIG)
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    own = lambda: own_attention.decode_attention(q, k, v, mask)  # noqa: E731
    paths = {f"own {isa}": with_isa(isa, own) for isa in isas}
    if baselines:
        paths |= {"chunked": lambda: cpu_attention.decode_attention(q, k, v, mask),
                  "sdpa": lambda: decode_choice.sdpa(q, k, v, mask)}
    *seconds, read_s = rounds([*paths.values(), read_path()], repeats)
    nbytes = 2 * cache_bytes(k)
    gbs = {name: [nbytes / x / 1e9 for x in s] for name, s in zip(paths, seconds)}
    read = [READ_BYTES / x / 1e9 for x in read_s]
    row = {"cache": kind, "B": B, "T": T, "MB": round(nbytes / 1e6, 1), "read GB/s": round(statistics.median(read), 2)}
    row |= {f"{name} GB/s": round(statistics.median(r), 2) for name, r in gbs.items()}
    return row | {f"own {isa} / read": round(median_ratio(gbs[f"own {isa}"], read), 2) for isa in isas}


def prefill_row(S: int, tokens: int, heads: int, kv_heads: int, D: int, repeats: int, isas) -> dict:
    """Causal bf16 prefill of tokens / S prompts of S tokens: useful GFLOP/s (4 B NH D S (S + 1) / 2 FLOPs, the
    products under the diagonal) of the own kernel under each set, SDPA and each set's GEMM peak (PEAK_DTYPE),
    all timed in the same rounds, and each kernel's share of its peak."""
    B = max(1, tokens // S)
    q = torch.randn(B, heads, S, D).bfloat16()
    k, v = (torch.randn(B, kv_heads, S, D).bfloat16() for _ in range(2))
    mask = prefill_mask(torch.ones(B, S, dtype=torch.bool))
    own = lambda: own_attention.prefill_attention(q, k, v, mask)  # noqa: E731
    dtypes = sorted({PEAK_DTYPE[isa] for isa in isas}, key=str)
    paths = [with_isa(isa, own) for isa in isas] + [lambda: attend(q, k, v, mask)] + [mm_path(d) for d in dtypes]
    seconds = rounds(paths, repeats)
    flops = 4 * B * heads * D * S * (S + 1) / 2
    rows, inner, cols = PEAK_SHAPE
    rate = [[flops / x / 1e9 for x in s] for s in seconds[: len(isas) + 1]]
    peaks = {d: [2 * rows * inner * cols / x / 1e9 for x in s] for d, s in zip(dtypes, seconds[len(isas) + 1:])}
    row = {"S": S, "B": B, "sdpa GFLOP/s": round(statistics.median(rate[len(isas)]))}
    row |= {f"mm {str(d).removeprefix('torch.')} GFLOP/s": round(statistics.median(g)) for d, g in peaks.items()}
    for isa, r in zip(isas, rate):
        row[f"own {isa} GFLOP/s"] = round(statistics.median(r))
        row[f"own {isa} / mm"] = round(median_ratio(r, peaks[PEAK_DTYPE[isa]]), 2)
        row[f"own {isa} / sdpa"] = round(median_ratio(r, rate[len(isas)]), 2)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--prefill-tokens", type=int, default=8192, help="prompts of S tokens: B = this / S")
    p.add_argument("--isas", default=None, help="comma-separated sets to time the own kernels under (default: the "
                   "chosen one)")
    p.add_argument("--lengths", default="128,512,2048", help="decode cache lengths T")
    p.add_argument("--no-baselines", action="store_true", help="decode: time the own kernels and the read only")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--skip-prefill", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    heap_policy = "freed blocks reused" if heap.reuse_freed_blocks() else "the C library's own"
    flags = set((cpu_info("flags") or "").split())
    print(f"CPU: {cpu_info('model name')}; flags: {' '.join(f for f in FLAGS if f in flags)}; "
          f"kernels: {compiled.ops().isa() if compiled.ops() else 'none'}; threads {args.threads}; heap: {heap_policy}")
    isas = args.isas.split(",") if args.isas else [compiled.ops().isa()]
    rows, prefill = [], []
    with torch.inference_mode():
        for kind in ("bfloat16", "float32", "4bit") if not args.skip_decode else ():
            for T in map(int, args.lengths.split(",")):
                r = decode_row(kind, args.batch, T, args.heads, args.kv_heads, args.head_dim, args.repeats, isas,
                               not args.no_baselines)
                rows.append(r)
                print(json.dumps(r))
                sys.stdout.flush()
        if own_attention.available() and compiled.ops().has_prefill() and not args.skip_prefill:
            for S in (256, 1024, 2048):
                r = prefill_row(S, args.prefill_tokens, args.heads, args.kv_heads, args.head_dim, args.repeats, isas)
                prefill.append(r)
                print(json.dumps(r))
                sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"decode": rows, "prefill": prefill}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
