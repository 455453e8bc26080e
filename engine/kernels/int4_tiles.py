"""4-bit Linear weights laid out once for the project's own kernel (engine/kernels/csrc/int4_*.cpp), which multiplies
them with activations quantized to int8 on the fly (per row and group, as llama.cpp's Q8 activations are): VNNI
(vpdpbusd) on AVX-512 CPUs, vpmaddubsw on AVX2 ones.

With a weight group's codes q (0..15), scale s and min m (w = q s + m), and the activations' codes qx, scale a
per row and group (x ~ a qx, |x - a qx| <= a / 2 per value),

    x . w over the group  ~  a (s (q . qx) + m sum(qx))       (q . qx exact in int32).

Layout, for tiles of 16 output columns (N padded to a multiple of 16 with zero columns):

    codes   uint8   [Np/16, Kp/8, 16, 4]   byte j of column c in octet o: q[c, 8o + j] | q[c, 8o + 4 + j] << 4
    scales  float16 [Np/16, ng, 16]
    mins    float16 [Np/16, ng, 16]

the same bytes as the stored QTensor (engine/compression/int4.py), rearranged so that a tile's 64-byte vector
holds four consecutive inputs of each of its 16 columns: the operand vpdpbusd takes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine import trace
from engine.compression.int4 import (
    INT4_GROUP_SIZES,
    PACKED_DTYPE,
    Int4Packed,
    QTensor,
    int4_linear,
    pack_int4,
)
from engine.kernels import compiled

TILE = 16
GEMM_RANGE = trace.KERNEL + "gemm"  # the profiler range of an own GEMM call, followed by " MxNxK"


@dataclass(frozen=True)
class Int4Tiles:
    """A Linear weight [out, in] in the kernel's tile layout."""

    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor
    in_features: int
    out_features: int
    group_size: int

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes + self.mins.nbytes


def supports(qt: QTensor) -> bool:
    """Whether the kernel takes this weight: 2-D, grouped along `in` by a multiple of 16 up to 1024, and the
    kernels built for this CPU."""
    g = qt.config.group_size
    return len(qt.shape) == 2 and qt.dim == 1 and g % 16 == 0 and g <= 1024 and available()


def available() -> bool:
    mod = compiled.ops()
    return mod is not None and mod.isa() != "none"


def pack(qt: QTensor) -> Int4Tiles:
    """A QTensor grouped along dim 1 ([out, in]) -> the tile layout (once, at load)."""
    n, k = qt.shape
    g = qt.config.group_size
    kp, n_pad = qt.data.shape[0] * g, -n % TILE
    tiles = (n + n_pad) // TILE
    codes = compiled.ops().int4_tile_codes(qt.data, n, g)  # [T, Kp/8, 16, 4], in one pass over the stored codes

    def per_tile(p: torch.Tensor) -> torch.Tensor:  # [ng, N] -> [T, ng, 16]
        p = torch.nn.functional.pad(p, (0, n_pad))
        return p.view(kp // g, tiles, TILE).permute(1, 0, 2).contiguous()

    return Int4Tiles(codes, per_tile(qt.scales), per_tile(qt.mins), k, n, g)


def dequantize(w: Int4Tiles, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """The dense weight [out, in] in `dtype` (into `out`'s storage where given), q s + m as the stored form's
    dequantization gives it: for the calls the kernel does not take, from a layer kept in this layout alone."""
    tiles, octets = w.codes.shape[:2]
    kp, ng = octets * 8, w.scales.shape[1]
    q = torch.stack((w.codes & 15, w.codes >> 4), dim=-1)  # [T, Kp/8, 16, 4, (low, high)]
    q = q.permute(0, 2, 1, 4, 3).reshape(tiles * TILE, kp)  # [Np, Kp]: pack's permutation undone

    def per_column(p: torch.Tensor) -> torch.Tensor:  # [T, ng, 16] -> [Np, ng, 1]
        return p.permute(0, 2, 1).reshape(tiles * TILE, ng, 1).to(dtype)

    n, k = w.out_features, w.in_features
    dense = q.view(tiles * TILE, ng, w.group_size)[:n].to(dtype)
    dense = torch.addcmul(per_column(w.mins)[:n], dense, per_column(w.scales)[:n],
                          out=None if out is None else out.view(-1)[: dense.numel()].view(dense.shape))
    return dense.view(n, kp)[:, :k]


def linear(x: torch.Tensor, w: Int4Tiles) -> torch.Tensor:
    """y = x W^T: x [*, in] float32 or bfloat16 -> y [*, out] in x's dtype."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        x = x.float()
    with compiled.profiled(f"gemm {x.numel() // x.shape[-1]}x{w.out_features}x{w.in_features}"):
        return compiled.ops().int4_linear(x, w.codes, w.scales, w.mins, w.out_features, w.group_size)


def pack_fast(qt: QTensor) -> Int4Tiles | Int4Packed | None:
    """The 4-bit kernel's operand for a weight: this kernel's tiles where it takes the weight, else aten's int4
    layout (`_weight_int4pack_mm_for_cpu`, the fallback) where that takes it, else None (dequantize + GEMM)."""
    if supports(qt):
        return pack(qt)
    if len(qt.shape) == 2 and qt.dim == 1 and qt.config.group_size in INT4_GROUP_SIZES:
        return pack_int4(qt, PACKED_DTYPE)
    return None


def fast_linear(x: torch.Tensor, fast: Int4Tiles | Int4Packed) -> torch.Tensor:
    """y = x W^T through whichever 4-bit kernel `pack_fast` packed the weight for."""
    return linear(x, fast) if isinstance(fast, Int4Tiles) else int4_linear(x, fast)
