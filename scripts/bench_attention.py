"""Decode and prefill attention figures on this machine, side by side with today's PyTorch paths and the
machine's own ceilings measured in the same run: decode as cache GB/s against a plain memory read (a large
tensor's sum), prefill as GFLOP/s against torch.mm in bfloat16. The machine is shared: every figure is the best
of `--repeats` interleaved rounds. The C heap runs under the engine's default policy (engine/memory/heap.py: freed
blocks reused, not faulted in afresh at every call), as the kernels run inside an engine.

    python scripts/bench_attention.py [--threads 2] [--repeats 5] [--heads 32 --kv-heads 8 --head-dim 128]"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from engine.compression.int4 import quantize
from engine.dtypes import cpu_info
from engine.kernels import compiled, cpu_attention, decode_choice, own_attention
from engine.kernels.attention import attend, prefill_mask
from engine.kernels.rates import fewest_seconds
from engine.memory import heap

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")


def read_gbs(repeats: int) -> float:
    """A plain memory read: the sum of a 512 MiB float32 tensor."""
    x = torch.ones(128 << 20)
    (s,) = fewest_seconds([lambda: x.sum()], repeats)
    return x.numel() * 4 / s / 1e9


def mm_gflops(rows: int, inner: int, cols: int, repeats: int) -> float:
    a, b = torch.randn(rows, inner).bfloat16(), torch.randn(inner, cols).bfloat16()
    (s,) = fewest_seconds([lambda: torch.mm(a, b)], repeats)
    return 2 * rows * inner * cols / s / 1e9


def cache_bytes(k) -> int:
    return k.nbytes if hasattr(k, "nbytes") and not isinstance(k, torch.Tensor) else k.numel() * k.element_size()


def decode_row(kind: str, B: int, T: int, heads: int, kv_heads: int, D: int, repeats: int) -> dict:
    dtype = torch.float32 if kind == "float32" else torch.bfloat16
    q = torch.randn(B, heads, 1, D).to(dtype)
    k, v = (torch.randn(B, kv_heads, T, D).to(dtype) for _ in range(2))
    if kind == "4bit":
        k, v = quantize(k, decode_choice.KV_CONFIG), quantize(v, decode_choice.KV_CONFIG)
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    paths = {"own": lambda: own_attention.decode_attention(q, k, v, mask),
             "chunked": lambda: cpu_attention.decode_attention(q, k, v, mask),
             "sdpa": lambda: decode_choice.sdpa(q, k, v, mask)}
    seconds = fewest_seconds(list(paths.values()), repeats)
    nbytes = 2 * cache_bytes(k)
    return {"cache": kind, "B": B, "T": T, "MB": round(nbytes / 1e6, 1)} | {
        f"{name} GB/s": round(nbytes / s / 1e9, 2) for name, s in zip(paths, seconds)}


def prefill_row(S: int, tokens: int, heads: int, kv_heads: int, D: int, peak: float, repeats: int) -> dict:
    """Causal bf16 prefill of tokens / S prompts of S tokens: useful GFLOP/s (4 B NH D S (S + 1) / 2 FLOPs, the
    products under the diagonal) of the own kernel and SDPA, and the own kernel's share of the GEMM peak."""
    B = max(1, tokens // S)
    q = torch.randn(B, heads, S, D).bfloat16()
    k, v = (torch.randn(B, kv_heads, S, D).bfloat16() for _ in range(2))
    mask = prefill_mask(torch.ones(B, S, dtype=torch.bool))
    own_s, sdpa_s = fewest_seconds([lambda: own_attention.prefill_attention(q, k, v, mask),
                                    lambda: attend(q, k, v, mask)], repeats)
    flops = 4 * B * heads * D * S * (S + 1) / 2
    own, sdpa = flops / own_s / 1e9, flops / sdpa_s / 1e9
    return {"S": S, "B": B, "own GFLOP/s": round(own), "sdpa GFLOP/s": round(sdpa),
            "own / mm": round(own / peak, 2), "sdpa / mm": round(sdpa / peak, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--prefill-tokens", type=int, default=8192, help="prompts of S tokens: B = this / S")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    heap_policy = "freed blocks reused" if heap.reuse_freed_blocks() else "the C library's own"
    flags = set((cpu_info("flags") or "").split())
    print(f"CPU: {cpu_info('model name')}; flags: {' '.join(f for f in FLAGS if f in flags)}; "
          f"kernels: {compiled.ops().isa() if compiled.ops() else 'none'}; threads {args.threads}; heap: {heap_policy}")
    rows = []
    with torch.inference_mode():
        read = read_gbs(args.repeats)
        print(f"memory read (sum of 512 MiB): {read:.2f} GB/s")
        for kind in ("bfloat16", "float32", "4bit"):
            for T in (128, 512, 2048):
                r = decode_row(kind, args.batch, T, args.heads, args.kv_heads, args.head_dim, args.repeats)
                r["own / read"] = round(r["own GB/s"] / read, 2)
                rows.append(r)
                print(json.dumps(r))
                sys.stdout.flush()
        peak = mm_gflops(1024, 4096, 1024, args.repeats)
        print(f"bf16 torch.mm [1024 x 4096] x [4096 x 1024]: {peak:.0f} GFLOP/s")
        prefill = []
        if own_attention.available() and compiled.ops().has_prefill():
            for S in (256, 1024, 2048):
                r = prefill_row(S, args.prefill_tokens, args.heads, args.kv_heads, args.head_dim, peak, args.repeats)
                prefill.append(r)
                print(json.dumps(r))
                sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"read_gbs": read, "decode": rows, "mm_gflops": peak, "prefill": prefill}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
