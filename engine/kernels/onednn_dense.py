"""Dense Linear weights laid out once in oneDNN's blocked form, for the CPU-resident layers of the native backend.

aten's float32 GEMM goes through MKL's sgemm, which on some CPUs (measured: a 2-core AVX2 AMD EPYC) runs decode-sized
calls at a fraction of the rate oneDNN reaches over a weight reordered once (`torch.ops.mkldnn._reorder_linear_weight`
at load, then `_linear_pointwise` per call): 1.6-1.9x at 16 rows, 1.3-1.4x at 96, equal at a few thousand, slower
at one row, per core. Which one a weight shape takes is measured once on the machine and cached with the compressed
kernels' crossovers (engine/kernels/rates.py, format "onednn"): a layer keeps only one form (the reordered one
replaces the plain one, so nothing more is held), so the choice is for every row count at once, by the geometric
mean over the measured row counts of aten's time over oneDNN's. Weights below MIN_PACK_PARAMS are left alone (the
call costs more than the arithmetic). bfloat16 reordering needs AVX512-BW or AVX-NE-CONVERT: where the CPU lacks
them the measurement fails and the plain form stays."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MIN_PACK_PARAMS = 1 << 20  # out * in of the smallest weight considered
MIN_GAIN = 1.1  # geometric-mean speed-up over the measured row counts that a reordered weight must show


@dataclass(frozen=True)
class OnednnWeight:
    """A Linear weight [out, in] reordered for oneDNN; `nbytes` of its plain form (what the tier reserved)."""

    packed: torch.Tensor
    out_features: int
    nbytes: int


def pack(w: torch.Tensor) -> OnednnWeight:
    return OnednnWeight(torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 64), w.shape[0],
                        w.numel() * w.element_size())


def linear(x: torch.Tensor, w: OnednnWeight, b: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w.packed, b, "none", [], "")


def worth_packing(w: torch.Tensor) -> bool:
    """Whether this weight computes faster reordered, on this machine (measured once per shape and dtype)."""
    from engine.kernels.rates import shape_timings

    if w.dim() != 2 or w.numel() < MIN_PACK_PARAMS or w.dtype not in (torch.float32, torch.bfloat16):
        return False
    try:
        timings = shape_timings("onednn", w.shape[0], w.shape[1], w.dtype, every_row_count=True)["timings"]
    except RuntimeError:  # the CPU cannot reorder this dtype
        return False
    gain = math.exp(sum(math.log(t["dense_s"] / t["fast_s"]) for t in timings) / len(timings))
    return gain >= MIN_GAIN
