"""gpt-oss's MXFP4 expert weights computed in their checkpoint form by the project's kernel (csrc/mxfp4_*.cpp), so
that a gpt-oss model takes about its checkpoint's bytes in memory rather than 4x (bfloat16) or 8x (float32) them.

A weight [out, in] is kept as [out, in / 32, 17] uint8 (engine/quantized/mxfp4.py `pack`): per output column and
block of 32 inputs, the block's 16 code bytes (two e2m1 values a byte, the low nibble first), then its e8m0 scale,
4.25 bits a weight. The kernel decodes each block through a 16-entry table scaled by the block's power of two
(exact: a value has 2 significant bits, a scale is a power of two) and sums the products in float32; rows are
float32 or bfloat16, widened once per call."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.checkpoint import LayerWeights
from engine.kernels import compiled
from engine.quantized.mxfp4 import BLOCK, SUFFIX


@dataclass(frozen=True)
class Mxfp4Weight:
    """A Linear weight [out, in] kept packed: `packed` [out, in / 32, 17] uint8."""

    packed: torch.Tensor

    @property
    def out_features(self) -> int:
        return self.packed.shape[0]

    @property
    def in_features(self) -> int:
        return self.packed.shape[1] * BLOCK

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes


def available() -> bool:
    """Whether the kernel is built and runs on this CPU."""
    mod = compiled.ops()
    return mod is not None and mod.isa() != "none"


def gather(lw: LayerWeights) -> LayerWeights:
    """A layer's weights with each packed tensor stored as `X` + SUFFIX as an Mxfp4Weight under `X` (the same dict
    where the layer has none)."""
    if not any(name.endswith(SUFFIX) for name in lw):
        return lw
    return {name.removesuffix(SUFFIX): Mxfp4Weight(t) if name.endswith(SUFFIX) else t for name, t in lw.items()}


def linear(x: torch.Tensor, w: Mxfp4Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T + b: x [*, in] -> y [*, out] in x's dtype, the products and the bias summed in float32."""
    rows = x.numel() // x.shape[-1]
    with compiled.profiled(f"mxfp4 gemm {rows}x{w.out_features}x{w.in_features}"):
        if x.dtype in (torch.float32, torch.bfloat16):
            return compiled.ops().mxfp4_linear(x, w.packed, b)
        return compiled.ops().mxfp4_linear(x.float(), w.packed, b).to(x.dtype)
