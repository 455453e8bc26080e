"""Dense Linear weights laid out once in oneDNN's blocked form, for the CPU-resident layers of the native backend.

aten's float32 GEMM goes through MKL's sgemm, which on some CPUs (measured: a 2-core AVX2 AMD EPYC) runs decode-sized
calls at a fraction of the rate oneDNN reaches over a weight reordered once (`torch.ops.mkldnn._reorder_linear_weight`
at load, then `_linear_pointwise` per call): 1.6-1.9x at 16 rows, 1.3-1.4x at 96, equal at a few thousand, slower
at one row, per core. Which weights are reordered is a fixed rule (`engine.kernels.gemm_choice.packs_dense`: large
float32 and bf16 weights, where the CPU reorders the dtype): a layer keeps only one form (the reordered one replaces
the plain one, so nothing more is held), so the choice is for every row count at once."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def linear_plain(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """oneDNN's GEMM over a weight as it is (not reordered: for a weight made anew at every step): the values of
    `linear` over the same weight reordered, bit for bit (measured float32 at 1,024-4,096 rows), at 0.97-0.98x its
    rate."""
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
