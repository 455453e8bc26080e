"""Row-wise int8 Linear weights (engine/compression/int8.py) laid out once for the project's own kernel
(engine/kernels/csrc/int8_*.cpp), for layers kept in memory: the same arithmetic as the kernel over the weight as
stored (engine/kernels/int8_rows.py, activations quantized per row, y = a_m s_n (qx_m . q_n)), with each 64-byte
vector holding four consecutive inputs of 16 output columns: the operand vpdpbusd takes with a row's four inputs
broadcast, so no dot product is reduced across lanes. Both forms give the same values.

Layout, for tiles of 16 output columns (N padded to a multiple of 16, K to one of 64, with zeros):

    codes      int8    [Np/16, Kp/4, 16, 4]   codes[t, i, c, j] = q[16 t + c, 4 i + j]
    scales     float32 [Np]
    code_sums  int32   [Np]                   sum over k of q[n, k] (AVX-512 offsets the activation codes)"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.compression.int8 import Int8Weight
from engine.kernels import compiled

TILE = 16
INPUTS = 64  # inputs padded to a multiple of this, as the kernel quantizes the activations


@dataclass(frozen=True)
class Int8Tiles:
    """An int8 Linear weight in the kernel's tile layout; `shape` is the weight's own, (out, in), without padding."""

    codes: torch.Tensor
    scales: torch.Tensor
    code_sums: torch.Tensor
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes + self.code_sums.nbytes


def pack(w: Int8Weight) -> Int8Tiles:
    """An Int8Weight ([out, in] codes, one scale per output row) -> the tile layout (once, at load)."""
    n, k = w.codes.shape
    codes = F.pad(w.codes, (0, -k % INPUTS, 0, -n % TILE))
    np_, kp = codes.shape
    tiles = codes.view(np_ // TILE, TILE, kp // 4, 4).permute(0, 2, 1, 3).contiguous()
    scales = F.pad(w.scales.float(), (0, np_ - n))
    return Int8Tiles(tiles, scales, codes.sum(dim=1, dtype=torch.int32), (n, k))


def dequantize(w: Int8Tiles, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """The dense weight [out, in] in `dtype` (into `out`'s storage where given), q s as the stored form's
    dequantization gives it: for the calls the kernel does not take, from a layer kept in this layout alone."""
    tiles, quads = w.codes.shape[:2]
    n, k = w.shape
    q = w.codes.permute(0, 2, 1, 3).reshape(tiles * TILE, quads * 4)[:n, :k]
    dense = torch.empty(n, k, dtype=dtype) if out is None else out.view(-1)[: n * k].view(n, k)
    return dense.copy_(q).mul_(w.scales[:n].to(dtype)[:, None])


def linear(x: torch.Tensor, w: Int8Tiles) -> torch.Tensor:
    """y = x W^T: x [*, in] float32 or bfloat16 -> y [*, out] in x's dtype."""
    n, k = w.shape
    with compiled.profiled(f"gemm-int8 {x.numel() // k}x{n}x{k}"):
        if x.dtype not in (torch.float32, torch.bfloat16):
            return compiled.ops().int8_tile_linear(x.float(), w.codes, w.scales, w.code_sums, n, k).to(x.dtype)
        return compiled.ops().int8_tile_linear(x, w.codes, w.scales, w.code_sums, n, k)
