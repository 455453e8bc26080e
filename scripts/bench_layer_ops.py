"""Microseconds per call of a Llama layer's row-wise ops, today's PyTorch code beside the fused kernels
(engine/kernels/layer_ops.py), at decode (1, 32, 128 rows) and prefill (4,096 rows) shapes; best of several
repeats, side by side in one run. Prints the CPU flags the kernels care about, the instruction set and the load.

    PYTHONPATH=. python scripts/bench_layer_ops.py --threads 2 [--isa avx2]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from engine.kernels import compiled, layer_ops
from engine.kernels.rope import apply_rope, cos_sin, inv_frequencies
from engine.spec import RopeSpec

SHAPES = {"1024": (1024, 2816, 16, 4, 64), "4096": (4096, 11008, 32, 8, 128)}  # H, F, NH, KVH, D
ROWS = (1, 32, 128, 4096)


def best_us(fn, budget_s: float = 0.05, repeats: int = 7) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    n = max(1, int(budget_s / max(time.perf_counter() - t0, 1e-7)))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def cases(H: int, F: int, NH: int, KVH: int, D: int, rows: int, dtype: torch.dtype):
    """(op, today's PyTorch call, the fused call) at one shape."""
    h, delta = torch.randn(rows, H), torch.randn(rows, H).to(dtype)
    w = torch.rand(H).to(dtype)
    gate_up = torch.randn(rows, 2 * F).to(dtype)
    B, S = (rows, 1) if rows <= 128 else (rows // 256, 256)  # decode: one token per row; prefill: 256-token prompts
    qkv = torch.randn(B, S, (NH + 2 * KVH) * D).to(dtype)
    cos, sin = cos_sin(inv_frequencies(RopeSpec(), D), torch.randint(0, 2048, (B, S)), dtype)

    def rope_torch():
        q, k, _ = layer_ops.split_heads(qkv, NH, KVH, D)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    return [
        ("rms_norm", lambda: layer_ops.rms_norm(h, w, 1e-5), lambda: layer_ops.fused_add_rms_norm(h, None, w, 1e-5, True)),
        ("add+rms_norm", lambda: layer_ops.add_rms_norm(h, delta, w, 1e-5, False),
         lambda: layer_ops.fused_add_rms_norm(h, delta, w, 1e-5, False)),
        ("silu*mul", lambda: layer_ops.silu_mul(gate_up), lambda: layer_ops.fused_silu_mul(gate_up)),
        ("rope q,k", rope_torch, lambda: layer_ops.fused_rope_qkv(qkv, cos, sin, NH, KVH, D)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default="")
    ap.add_argument("--hidden", choices=sorted(SHAPES), action="append")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], action="append")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mod = compiled.ops()
    assert mod is not None, "kernels not built"
    mod.select_isa(args.isa)
    flags = open("/proc/cpuinfo").read().split("flags\t\t: ")[1].split("\n")[0].split()
    print("cpu flags:", " ".join(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))))
    print(f"isa {mod.isa()}, torch threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    print(f"{'hidden':>6} {'dtype':>8} {'op':>12} {'rows':>5} {'torch us':>9} {'fused us':>9} {'speedup':>7}")
    with torch.inference_mode():
        for hidden in args.hidden or sorted(SHAPES):
            for dtype in [getattr(torch, d) for d in args.dtype or ["bfloat16", "float32"]]:
                for rows in ROWS:
                    for op, ref, fused in cases(*SHAPES[hidden], rows, dtype):
                        a, b = best_us(ref), best_us(fused)
                        print(f"{hidden:>6} {str(dtype)[6:]:>8} {op:>12} {rows:>5} {a:9.1f} {b:9.1f} {a / b:6.2f}x",
                              flush=True)


if __name__ == "__main__":
    main()
