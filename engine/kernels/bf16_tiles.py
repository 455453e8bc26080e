"""bfloat16 Linear weights of a float32 run (engine/compression/bf16.py) laid out once for the project's own kernel
(engine/kernels/csrc/bf16w_*.cpp), for layers kept in memory: the weight stays in bfloat16 (half float32's bytes to
read per step) and is widened to float32 in registers; the products and sums are float32, each output one chain of
fused multiply-adds over the inputs in order. What a float32 run over the same (bf16-rounded) weights computes, up
to the order of the sums.

Layout, for tiles of 16 output columns (N padded to a multiple of 16 with zero columns):

    values  bfloat16 [Np/16, K, 16]   values[t, k, 2c] = w[16 t + c, k], values[t, k, 2c + 1] = w[16 t + 8 + c, k]

so that one 32-byte load of a tile at input k, read as 8 32-bit lanes, holds columns 0-7 in the lanes' high halves
once shifted left by 16 and columns 8-15 once their low halves are masked off: two float32 vectors for two integer
operations, the activations' x[m, k] broadcast."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kernels import compiled

TILE = 16
ORDER = [c + 8 * h for c in range(8) for h in range(2)]  # position -> column within a tile: 0, 8, 1, 9, ...
INVERSE = [ORDER.index(c) for c in range(TILE)]  # column -> its position within a tile


@dataclass(frozen=True)
class Bf16Tiles:
    """A bfloat16 Linear weight [out, in] in the kernel's tile layout; `shape` is the weight's own."""

    values: torch.Tensor
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.values.nbytes


def available() -> bool:
    mod = compiled.ops()
    return mod is not None and mod.isa() != "none"


def pack(w: torch.Tensor) -> Bf16Tiles:
    """A bfloat16 weight [out, in] -> the tile layout (once, at load)."""
    n, k = w.shape
    padded = F.pad(w, (0, 0, 0, -n % TILE))
    tiles = padded.view(-1, TILE, k)[:, ORDER].transpose(1, 2).contiguous()
    return Bf16Tiles(tiles, (n, k))


def dequantize(w: Bf16Tiles, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """The dense weight [out, in] in `dtype` (into `out`'s storage where given): for the calls the kernel does not
    take, from a layer kept in this layout alone."""
    n, k = w.shape
    dense = torch.empty(n, k, dtype=dtype) if out is None else out.view(-1)[: n * k].view(n, k)
    rows = w.values.transpose(1, 2)[:, INVERSE].reshape(-1, k)[:n]  # [Np, K] in column order
    return dense.copy_(rows)



def linear(x: torch.Tensor, w: Bf16Tiles) -> torch.Tensor:
    """y = x W^T: x [*, in] float32 -> y [*, out] float32."""
    n, k = w.shape
    with compiled.profiled(f"gemm-bf16 {x.numel() // k}x{n}x{k}"):
        return compiled.ops().bf16_tile_linear(x, w.values, n)
