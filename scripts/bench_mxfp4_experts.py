"""One gpt-oss-shaped decode layer's routed experts (engine/models/experts.py `moe_block`, router included), bfloat16
rows, with the experts in three forms timed side by side in the same rounds: MXFP4 kept packed, every routed expert
in one kernel call (engine/kernels/mxfp4_experts.py); MXFP4 kept packed, one MXFP4 GEMM per projection and expert
(the path of experts read from disk); and dequantized to bfloat16 at load (the fallback, oneDNN-reordered as the
engine keeps resident dense weights). Random codes and scales: the work does not depend on the values.

On one thread (`--threads 1`, the default) each round is timed in the thread's CPU time, so that other processes on
a shared machine do not count; every figure is the median of `--repeats` interleaved rounds, a ratio the median of
the rounds' own ratios. Prints the CPU flags the kernels care about.

    PYTHONPATH=. python scripts/bench_mxfp4_experts.py [--hidden 1440] [--experts 32 --top 4] [--rows 32,256]"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from engine.dtypes import cpu_info
from engine.kernels import compiled, mxfp4_experts
from engine.kernels.native import NativeKernels
from engine.models import family_for
from engine.models.experts import moe_block
from engine.quantized.mxfp4 import dense
from engine.quantized.mxfp4_layer import per_expert
from engine.spec import spec_from_config

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")


def clock():
    """The calling thread's CPU time on one thread (other processes' use of the core not counted), else wall time."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def gpt_oss_layer(hidden: int, experts: int, top: int, seed: int = 0):
    """(spec, the mixture's stored tensors with its experts packed, the same with them dequantized to bfloat16)."""
    spec = spec_from_config(dict(model_type="gpt_oss", hidden_size=hidden, intermediate_size=hidden,
                                 num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=8, head_dim=64,
                                 vocab_size=32, max_position_embeddings=128, num_local_experts=experts,
                                 num_experts_per_tok=top, sliding_window=128))
    g = torch.Generator().manual_seed(seed)
    stored = {"mlp.router.weight": (torch.randn(experts, hidden, generator=g) * 0.02).bfloat16(),
              "mlp.router.bias": torch.zeros(experts, dtype=torch.bfloat16)}
    packed, widened = dict(stored), dict(stored)
    for proj, out in (("gate_up_proj", 2 * hidden), ("down_proj", hidden)):
        blocks = torch.randint(0, 256, (experts, out, hidden // 32, 16), generator=g, dtype=torch.uint8)
        scales = torch.randint(118, 122, (experts, out, hidden // 32), generator=g, dtype=torch.uint8)
        packed |= per_expert(f"mlp.experts.{proj}", {"blocks": blocks, "scales": scales})
        for e in range(experts):  # [out, in], gate / up interleaved as in the checkpoint: unstacked as fuse.py does
            w = dense(blocks[e : e + 1], scales[e : e + 1], torch.bfloat16, proj)[0].T
            widened[f"mlp.experts.{e}.{proj}.weight"] = torch.cat([w[0::2], w[1::2]]) if out > hidden else w.contiguous()
        bias = (torch.randn(experts, out, generator=g) * 0.1).bfloat16()
        for e in range(experts):
            packed[f"mlp.experts.{e}.{proj}.bias"] = widened[f"mlp.experts.{e}.{proj}.bias"] = bias[e]
    kernels = NativeKernels()
    return spec, kernels.pack_resident(packed, None), kernels.pack_resident(widened, None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=1440, help="hidden = expert width (gpt-oss-20b: 2880)")
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top", type=int, default=4)
    p.add_argument("--rows", default="32", help="comma-separated row counts (tokens of the step)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if compiled.ops() is None:
        print("the project's kernels are not built here", file=sys.stderr)
        return 1
    flags = set((cpu_info("flags") or "").split())
    print(f"CPU: {cpu_info('model name')}; flags: {' '.join(f for f in FLAGS if f in flags)}; kernels: "
          f"{compiled.ops().isa()}; threads: {args.threads}")
    spec, packed, widened = gpt_oss_layer(args.hidden, args.experts, args.top)
    model = family_for(spec, torch.bfloat16, NativeKernels())
    weight_mb = {name: sum(t.nbytes for n, t in lw.items() if ".experts." in n and n.endswith(".weight")) / 1e6
                 for name, lw in (("packed", packed), ("bf16", widened))}
    print(f"experts {args.experts} x [{2 * args.hidden}, {args.hidden}] + [{args.hidden}, {args.hidden}], top "
          f"{args.top}: MXFP4 {weight_mb['packed']:.0f} MB, bfloat16 {weight_mb['bf16']:.0f} MB")
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, args.hidden, generator=torch.Generator().manual_seed(rows)).bfloat16()
        ms, ratio = row_figures(model, packed, widened, x, args.repeats)
        print(f"rows {rows}: " + "; ".join(f"{n} {ms[n]:.1f} ms ({ratio[n]:.2f}x bf16)" for n in ms))
    return 0


def row_figures(model, packed, widened, x, repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Each path's median milliseconds over the rounds, and the median of its rounds' speed over the bf16 path's."""
    one_call = mxfp4_experts.run

    def per_projection():
        mxfp4_experts.run = lambda *a: None  # the hook declines: one GEMM per projection and expert
        try:
            return moe_block(model, packed, x)
        finally:
            mxfp4_experts.run = one_call

    paths = {"mxfp4 one call": lambda: moe_block(model, packed, x), "mxfp4 per expert": per_projection,
             "bf16 dequantized": lambda: moe_block(model, widened, x)}
    with torch.inference_mode():
        times = dict(zip(paths, rounds(list(paths.values()), repeats)))
    base = times["bf16 dequantized"]
    return ({name: statistics.median(t) * 1e3 for name, t in times.items()},
            {name: statistics.median(b / a for a, b in zip(t, base)) for name, t in times.items()})


def rounds(fns, repeats: int) -> list[list[float]]:
    """Seconds of each of `fns` in each of `repeats` rounds, interleaved (after one warm-up call each)."""
    for fn in fns:
        fn()
    times, now = [[] for _ in fns], clock()
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = now()
            fn()
            times[i].append(now() - t0)
    return times


if __name__ == "__main__":
    sys.exit(main())
