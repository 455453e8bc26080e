"""zentorch (AMD) vs flexbatch's own CPU kernels vs plain PyTorch, side by side in one process.

Run in the environment `scripts/setup_zentorch_venv.sh DIR` makes, with this repository on the path:

    PYTHONPATH=. DIR/bin/python scripts/bench_zentorch.py \
        [--threads 1,2] [--repeats 5] [--group 128] [--sections linear,norm,attn] [--json out.json]

Every figure is the best of `--repeats` interleaved rounds (each round times a loop of calls lasting ~20 ms or
one call, whichever is longer); each section records the load average before and after (the machine may be shared).

Exactness: the int4 weights are built so that every path holds the very same dequantized weight W (codes 0..15,
per-group scale s with 4 significant bits, min m = -8 s: exact in float16, bfloat16, flexbatch's QTensor, aten's
int4pack and zentorch's symmetric s4 form), and each output is compared with x.float() @ W.T in float32."""

# ruff: noqa: B023  (each path's lambda runs within the iteration that makes it)
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
import zentorch  # noqa: F401  (registers torch.ops.zentorch)

from engine.compression.int4 import QTensor, QuantConfig, dequantize, int4_linear, pack_int4
from engine.dtypes import cpu_info
from engine.kernels import compiled, int4_tiles, layer_ops, own_attention
from engine.kernels.attention import attend, prefill_mask
from engine.memory import heap

ZEN = torch.ops.zentorch
LINEAR_SHAPES = [(5632, 1024), (1024, 2816), (32000, 1024)]  # N x K
LINEAR_ROWS = [1, 32, 256, 1024]
NORM_ROWS = [1, 32, 128, 4096]
HIDDEN = 1024
EPS = 1e-6


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def best_per_call(fns, repeats: int, target_s: float = 0.02) -> list[float]:
    """Fewest seconds per call of each fn over `repeats` interleaved rounds of loops of ~target_s."""
    loops = []
    for fn in fns:
        fn()  # warm-up (and zentorch's / oneDNN's first-call setup)
        t0 = time.perf_counter()
        fn()
        one = time.perf_counter() - t0
        loops.append(max(1, min(10000, math.ceil(target_s / max(one, 1e-7)))))
    best = [math.inf] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            n = loops[i]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / n)
    return best


# ---------------------------------------------------------------------------------------------------- int4 linear

class Int4Weight:
    """One int4 weight W [N, K] (group G along K) in every path's form."""

    def __init__(self, n: int, k: int, group: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        ng = k // group
        self.q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        # scales ~ 0.02 / 8 with 4 significant bits: products (q - 8) s are exact in bfloat16
        s = torch.rand(n, ng, generator=g) * 0.004 + 0.001
        e = torch.floor(torch.log2(s))
        s = torch.round(s / 2**e * 8) / 8 * 2**e
        self.s = s  # [N, ng] float32, exact in fp16/bf16
        w = (self.q.float().view(n, ng, group) - 8) * s[..., None]
        self.w32 = w.view(n, k)  # the dequantized weight, float32
        # flexbatch's QTensor: data [ng, G/2, N], byte (g, j, r) = q[r, gG + j] | q[r, gG + G/2 + j] << 4
        qg = self.q.view(n, ng, group)
        packed = qg[..., : group // 2] | (qg[..., group // 2:] << 4)  # [N, ng, G/2]
        data = packed.permute(1, 2, 0).contiguous()
        mins = (-8 * s).t().contiguous().half()
        scales = s.t().contiguous().half()
        self.qt = QTensor(data, mins, scales, (n, k), torch.bfloat16, QuantConfig(4, group, 1))
        assert torch.equal(dequantize(self.qt, dtype=torch.float32), self.w32), "QTensor does not hold W"
        self.tiles = int4_tiles.pack(self.qt)  # flexbatch's own kernel's layout
        self.aten = pack_int4(self.qt, torch.bfloat16)  # aten int4pack (flexbatch's fallback), zero = m + 8 s = 0
        self.wbf = self.w32.bfloat16()
        assert torch.equal(self.wbf.float(), self.w32), "W not exact in bf16"
        # zentorch, symmetric: s4 codes (q - 8) as int8 [N, K] -> int32 [N, K/8], used as its [K/8, N] transpose;
        # scales [K/G, N] (the form zentorch's own IntxWeightOnly graph rewrite passes)
        self.zen_w = ZEN.zentorch_woq_repack_weight((self.q.to(torch.int8) - 8).contiguous()).transpose(0, 1)
        self.zen_s = s.t().contiguous().bfloat16()
        # zentorch, with bf16 zero points, from aten's int4pack (its Int4OpaqueTensor graph rewrite):
        # w = (q - 8) s + zero
        self.zen_w4 = ZEN.zentorch_woq_repack_from_int4pack(self.aten.weight).transpose(0, 1)
        self.zen_s4 = self.aten.scales_and_zeros[..., 0].contiguous()
        self.zen_z4 = self.aten.scales_and_zeros[..., 1].contiguous()


def linear_paths(w: Int4Weight, x: torch.Tensor, with_aten: bool):
    paths = {
        "zen woq sym": lambda: ZEN.zentorch_woq_linear(x, w.zen_w, w.zen_s, None, None),
        "zen woq zp": lambda: ZEN.zentorch_woq_linear(x, w.zen_w4, w.zen_s4, w.zen_z4, None),
        "fb int4_tiles": lambda: int4_tiles.linear(x, w.tiles),
        "bf16 F.linear": lambda: F.linear(x, w.wbf),
    }
    if with_aten:
        paths["aten int4pack"] = lambda: int4_linear(x, w.aten)
    return paths


def bench_linear(threads: int, repeats: int, group: int, errors: dict) -> list[dict]:
    rows_out = []
    for si, (n, k) in enumerate(LINEAR_SHAPES):
        w = Int4Weight(n, k, group, seed=si)
        for m in LINEAR_ROWS:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
            paths = linear_paths(w, x, with_aten=m <= 32)
            key = f"{n}x{k} M={m}"
            if key not in errors:  # exactness once per shape (results do not depend on threads)
                ref = x.float() @ w.w32.T
                errs = {}
                for name, fn in paths.items():
                    try:
                        errs[name] = round((fn().float() - ref).abs().max().item(), 5)
                    except Exception as e:  # noqa: BLE001
                        errs[name] = f"ERR {e}"
                errs["ref max|y|"] = round(ref.abs().max().item(), 3)
                errors[key] = errs
            ok = {nm: fn for nm, fn in paths.items() if not isinstance(errors[key].get(nm), str)}
            secs = best_per_call(list(ok.values()), repeats)
            flops = 2 * m * n * k
            r = {"threads": threads, "N": n, "K": k, "M": m}
            r |= {f"{nm} GF/s": round(flops / s / 1e9, 1) for nm, s in zip(ok, secs)}
            r |= {f"{nm} us": round(s * 1e6, 1) for nm, s in zip(ok, secs)}
            rows_out.append(r)
            print(json.dumps(r), flush=True)
        del w
    return rows_out


# ---------------------------------------------------------------------------------------------------- RMSNorm

def bench_norm(threads: int, repeats: int, errors: dict) -> list[dict]:
    rows_out = []
    g = torch.Generator().manual_seed(7)
    weight = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).bfloat16()
    for m in NORM_ROWS:
        h32 = torch.randn(m, HIDDEN, generator=g)  # residual stream, float32 as flexbatch keeps it
        delta = torch.randn(m, HIDDEN, generator=g).bfloat16()  # a sublayer's output
        hb = h32.bfloat16()
        # buffers the in-place calls update (values drift over the loop; timing does not depend on them)
        zin, zres, fb_h, pt_h = delta.clone(), hb.clone(), h32.clone(), h32.clone()

        paths = {
            # fused residual add + RMSNorm
            "zen add_rms_norm_ (bf16 res)": lambda: ZEN.zentorch_add_rms_norm_(zin, weight, zres, EPS),
            "fb fused_add_rms_norm (f32 res)": lambda: layer_ops.fused_add_rms_norm(fb_h, delta, weight, EPS, True),
            "torch layer_ops.add_rms_norm (f32 res)": lambda: layer_ops.add_rms_norm(pt_h, delta, weight, EPS, True),
            "torch add+F.rms_norm (bf16 res)": lambda: F.rms_norm(hb + delta, (HIDDEN,), weight, EPS),
            # RMSNorm alone
            "zen rms_norm (bf16 in)": lambda: ZEN.zentorch_rms_norm(hb, weight, EPS),
            "fb fused rms_norm (f32 in)": lambda: layer_ops.fused_add_rms_norm(h32, None, weight, EPS, False),
            "torch F.rms_norm (bf16 in)": lambda: F.rms_norm(hb, (HIDDEN,), weight, EPS),
        }
        key = f"norm M={m}"
        if key not in errors:
            def ref_norm(h):
                return (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + EPS)) * weight.float()

            errs = {}
            a, r = delta.clone(), hb.clone()
            ZEN.zentorch_add_rms_norm_(a, weight, r, EPS)
            errs["zen add_rms_norm_ (bf16 res)"] = (a.float() - ref_norm(hb.float() + delta.float())).abs().max().item()
            errs["zen add_rms_norm_ residual"] = (r.float() - (hb.float() + delta.float())).abs().max().item()
            ref_add = ref_norm(h32 + delta.float())
            _, xo = layer_ops.fused_add_rms_norm(h32.clone(), delta, weight, EPS, True)
            errs["fb fused_add_rms_norm (f32 res)"] = (xo.float() - ref_add).abs().max().item()
            _, xo = layer_ops.add_rms_norm(h32.clone(), delta, weight, EPS, True)
            errs["torch layer_ops.add_rms_norm (f32 res)"] = (xo.float() - ref_add).abs().max().item()
            xo = F.rms_norm(hb + delta, (HIDDEN,), weight, EPS)
            errs["torch add+F.rms_norm (bf16 res)"] = (xo.float() - ref_norm(hb.float() + delta.float())).abs().max().item()
            errs["zen rms_norm (bf16 in)"] = (ZEN.zentorch_rms_norm(hb, weight, EPS).float() - ref_norm(hb.float())).abs().max().item()
            errs["fb fused rms_norm (f32 in)"] = (paths["fb fused rms_norm (f32 in)"]()[1].float() - ref_norm(h32)).abs().max().item()
            errs["torch F.rms_norm (bf16 in)"] = (F.rms_norm(hb, (HIDDEN,), weight, EPS).float() - ref_norm(hb.float())).abs().max().item()
            errors[key] = {k_: round(v, 5) for k_, v in errs.items()}
        secs = best_per_call(list(paths.values()), repeats)
        r = {"threads": threads, "rows": m} | {f"{nm} us": round(s * 1e6, 2) for nm, s in zip(paths, secs)}
        rows_out.append(r)
        print(json.dumps(r), flush=True)
    return rows_out


# ---------------------------------------------------------------------------------------------------- attention

def bench_attn(threads: int, repeats: int, errors: dict, heads=32, kv_heads=8, D=128, tokens=8192) -> list[dict]:
    rows_out = []
    for S in (256, 1024):
        B = tokens // S
        g = torch.Generator().manual_seed(S)
        q = torch.randn(B, heads, S, D, generator=g).bfloat16()
        k, v = (torch.randn(B, kv_heads, S, D, generator=g).bfloat16() for _ in range(2))
        mask = prefill_mask(torch.ones(B, S, dtype=torch.bool))
        out = torch.empty_like(q)
        paths = {
            "zen sdpa": lambda: ZEN.zentorch_sdpa(q, k, v, 0.0, True)[0],
            "zen sdpa_attn": lambda: ZEN.zentorch_sdpa_attn(q, k, v, out, None, True),
            "fb prefill_attention": lambda: own_attention.prefill_attention(q, k, v, mask),
            "torch SDPA (attend)": lambda: attend(q, k, v, mask),
        }
        key = f"attn S={S}"
        if key not in errors:
            b = slice(0, 1)
            ref = F.scaled_dot_product_attention(q[b].float(), k[b].float(), v[b].float(), is_causal=True,
                                                 enable_gqa=True)
            errs = {}
            for nm, fn in paths.items():
                try:
                    y = fn()
                    y = out if y is None else y
                    errs[nm] = round((y[b].float() - ref).abs().max().item(), 5)
                except Exception as e:  # noqa: BLE001
                    errs[nm] = f"ERR {e}"
            errors[key] = errs
        ok = {nm: fn for nm, fn in paths.items() if not isinstance(errors[key].get(nm), str)}
        secs = best_per_call(list(ok.values()), repeats, target_s=0.0)
        flops = 4 * B * heads * D * S * (S + 1) / 2
        r = {"threads": threads, "S": S, "B": B}
        r |= {f"{nm} GF/s": round(flops / s / 1e9, 1) for nm, s in zip(ok, secs)}
        r |= {f"{nm} ms": round(s * 1e3, 2) for nm, s in zip(ok, secs)}
        rows_out.append(r)
        print(json.dumps(r), flush=True)
    return rows_out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--sections", default="linear,norm,attn")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    assert args.repeats >= 5
    heap_policy = heap.reuse_freed_blocks()
    flags = f"CPU flags: {cpu_info('flags')}"
    mod = compiled.ops()
    print(f"torch {torch.__version__}, zentorch {zentorch.__version__}, flexbatch kernels: "
          f"{mod.isa() if mod else 'none'}, prefill: {bool(mod and mod.has_prefill())}, heap reuse: {heap_policy}")
    print(flags)
    result = {"torch": torch.__version__, "zentorch": zentorch.__version__, "group": args.group,
              "flags": flags, "errors": {}, "runs": []}
    sections = args.sections.split(",")
    with torch.inference_mode():
        for t in (int(x) for x in args.threads.split(",")):
            torch.set_num_threads(t)
            for sec in sections:
                before = loadavg()
                print(f"== {sec}, threads {t}, loadavg before: {before}", flush=True)
                t0 = time.time()
                if sec == "linear":
                    rows = bench_linear(t, args.repeats, args.group, result["errors"])
                elif sec == "norm":
                    rows = bench_norm(t, args.repeats, result["errors"])
                else:
                    rows = bench_attn(t, args.repeats, result["errors"])
                after = loadavg()
                print(f"== {sec}, threads {t}, loadavg after: {after} ({time.time() - t0:.0f} s)", flush=True)
                result["runs"].append({"section": sec, "threads": t, "load_before": before, "load_after": after,
                                       "rows": rows})
    print("exactness (max abs diff vs float32 reference):")
    for key, errs in result["errors"].items():
        print(key, json.dumps(errs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
