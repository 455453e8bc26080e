"""Row-wise 8-bit weights, computed as int8 x int8 GEMMs with activations quantized per row on the fly (the
path CTranslate2's int8 takes; VNNI CPUs run it several times faster than a bf16 GEMM at decode row counts).

A Linear weight W [out, in] is kept as codes q [out, in] int8 and one float32 scale per output row:

    s_n = max_k |W[n, k]| / 127,    q[n, k] = round(W[n, k] / s_n)  in [-127, 127],    |W - q s| <= s / 2.

At compute time each activation row x_m is quantized the same way (scale a_m = max |x_m| / 127), and

    y[m, n] = a_m s_n sum_k qx[m, k] q[n, k]      (the sum exact in int32).

The second error term (activations to 8 bits, about 1 / 254 of a row's largest value per element) is what
weight-only formats avoid; the greedy agreement and perplexity of the format are measured in the tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

FORMAT = "flexbatch-rowwise-int8"
_QMAX = 127
CHUNK_ROWS = 1024  # rows quantized, multiplied and rescaled at a time (a few MiB of int32 sums)


@dataclass(frozen=True)
class Int8Weight:
    """Codes [out, in] int8 and scales [out] float32 of one Linear weight."""

    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales))


def quantize_int8(w: torch.Tensor) -> Int8Weight:
    """W [out, in] (any float dtype) -> row-wise symmetric int8 codes and float32 scales."""
    w32 = w.float()
    scales = w32.abs().amax(dim=1) / _QMAX
    inv = torch.where(scales > 0, 1 / scales, 0.0)
    codes = (w32 * inv[:, None]).round_().clamp_(-_QMAX, _QMAX).to(torch.int8)
    return Int8Weight(codes.contiguous(), scales.contiguous())


def dequantize_int8(w: Int8Weight, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """The dense weight [out, in] in `dtype`: q s (into `out` when given)."""
    out = torch.empty(w.codes.shape, dtype=dtype, device=w.codes.device) if out is None else out
    out.copy_(w.codes)
    return out.mul_(w.scales.to(dtype)[:, None])


def int8_linear(x: torch.Tensor, w: Int8Weight, chunk_rows: int = CHUNK_ROWS) -> torch.Tensor:
    """y = x W^T in x's dtype: x [*, in] quantized per row to int8, int8 x int8 -> int32 GEMMs, rescaled.
    Rows go through in chunks written into one output: each chunk's activations, codes and int32 sums stay in
    cache while they are quantized and rescaled, and no chunk outputs are concatenated afterwards."""
    *lead, k = x.shape
    x2 = x.reshape(-1, k)
    out = torch.empty(x2.shape[0], w.codes.shape[0], dtype=x.dtype)
    for xs, ys in zip(x2.split(chunk_rows), out.split(chunk_rows)):
        xs = xs.float()
        a = xs.abs().amax(dim=1, keepdim=True).div_(_QMAX)  # [rows, 1]
        qx = (xs / torch.where(a > 0, a, 1.0)).round_().to(torch.int8)
        acc = torch._int_mm(qx, w.codes.T)  # [rows, out] int32
        y = ys if ys.dtype == torch.float32 else acc.view(torch.float32)  # float32 in place: same element size
        y.copy_(acc).mul_(a).mul_(w.scales)
        if y is not ys:
            ys.copy_(y)
    return out.view(*lead, -1)
