"""Group-wise 4-bit compression, as in FlexGen: asymmetric min-max over groups of `group_size` values.

For each group of values x_0..x_{G-1} along the group dim, with m <= min(x) and s >= (max(x) - m) / 15:

    q_j = round((x_j - m) / s)  in [0, 15],        x_j ~= q_j * s + m,        |x_j - (q_j * s + m)| <= s / 2.

m and s are float16, as in FlexGen: m is rounded down and s up to float16, so the bound above holds exactly,
and float16's 11 significant bits widen a group's range by at most |m| 2^-11 in doing so (bfloat16: 2^-8).
They cost 2 x 16 bits per group, 0.5 bit per value at G = 64. Dequantizing to bfloat16 casts them first,
which adds bfloat16 rounding, as the bfloat16 output has anyway.

Layout (the group dim is moved last: x is viewed as [*L, R, C], grouped along C, padded to Cp = ng * G):

    data   uint8   [*L, ng, G/2, R]    byte (g, j, r) = q[r, g*G + j] | q[r, g*G + G/2 + j] << 4
    mins   float16 [*L, ng, R]
    scales float16 [*L, ng, R]

Rows (R) are innermost, so dequantization is a few long vectorized passes with per-group m and s broadcast
along j only, and it produces x transposed ([*L, Cp, R] contiguous): `dequantize` returns the [*L, R, C] view.
A Linear weight [out, in] thus becomes W^T contiguous (a plain GEMM operand), and a K/V chunk [B, KVH, T, D]
becomes K^T [B, KVH, D, T], the operand of q @ K^T."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from engine.errors import InvalidParamsError

FORMAT = "flexbatch-groupwise-int4"
FORMAT_VERSION = 1
PARAM_DTYPE = torch.float16
_DTYPE_NAMES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16}
_ROWS_PER_PASS = 1 << 22  # values quantized per pass, which bounds the float32 temporaries


@dataclass(frozen=True)
class QuantConfig:
    bits: int = 4
    group_size: int = 64
    dim: int = -1

    def __post_init__(self):
        if self.bits != 4:
            raise InvalidParamsError(f"bits={self.bits} is not supported: use bits=4")
        if self.group_size < 2 or self.group_size % 2:
            raise InvalidParamsError(f"group_size={self.group_size} is invalid: use an even size, e.g. 64")


@dataclass(frozen=True)
class QTensor:
    """A compressed tensor: packed codes, per-group mins and scales, and the format needed to undo it."""

    data: torch.Tensor
    mins: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype
    config: QuantConfig

    @property
    def dim(self) -> int:
        return self.config.dim % len(self.shape)

    @property
    def cols(self) -> int:
        """C: the length of the grouped dim."""
        return self.shape[self.dim]

    @property
    def rows(self) -> int:
        """R: the rows held (the data's last dim; fewer than the moved shape's R for a row slice)."""
        return self.data.shape[-1]

    @property
    def buffer_shape(self) -> tuple[int, ...]:
        """[*L, Cp, R]: the (transposed) layout dequantization writes."""
        *lead, ng, half, r = self.data.shape
        return (*lead, ng * 2 * half, r)

    @property
    def nbytes(self) -> int:
        """Bytes that travel between tiers: the codes plus the per-group mins and scales."""
        return sum(t.numel() * t.element_size() for t in (self.data, self.mins, self.scales))

    def row_slice(self, start: int, end: int) -> QTensor:
        """A view over rows [start, end) of the moved [*L, R, C] layout (no copy), e.g. slots of a KV cache."""
        assert len(self.shape) >= 2 and 0 <= start <= end <= self.rows, (start, end, self.rows)
        row_axis = len(self.shape) - (2 if self.dim == len(self.shape) - 1 else 1)
        shape = tuple(end - start if i == row_axis else s for i, s in enumerate(self.shape))
        return replace(self, data=self.data[..., start:end], mins=self.mins[..., start:end],
                       scales=self.scales[..., start:end], shape=shape)

    def write_rows(self, start: int, src: QTensor) -> None:
        """Copy src's rows into rows [start, start + src.rows) (same config, L and C)."""
        assert src.config == self.config and src.data.shape[:-1] == self.data.shape[:-1], (src.shape, self.shape)
        end = start + src.rows
        self.data[..., start:end] = src.data
        self.mins[..., start:end] = src.mins
        self.scales[..., start:end] = src.scales

    def metadata(self) -> dict[str, str]:
        """The format as strings (fits safetensors' metadata); `from_parts` reads it back."""
        cfg = self.config
        return {"format": FORMAT, "version": str(FORMAT_VERSION), "bits": str(cfg.bits),
                "group_size": str(cfg.group_size), "dim": str(cfg.dim),
                "shape": ",".join(map(str, self.shape)), "dtype": str(self.dtype).removeprefix("torch."),
                "param_dtype": str(PARAM_DTYPE).removeprefix("torch."), "layout": "groups,pairs,rows"}

    @classmethod
    def from_parts(cls, meta: dict[str, str], data, mins, scales) -> QTensor:
        """Rebuild from `metadata()` and the three tensors, checking that they agree."""
        if meta.get("format") != FORMAT or meta.get("version") != str(FORMAT_VERSION):
            raise ValueError(f"not a {FORMAT} v{FORMAT_VERSION} tensor: metadata {meta}")
        cfg = QuantConfig(int(meta["bits"]), int(meta["group_size"]), int(meta["dim"]))
        shape = tuple(int(s) for s in meta["shape"].split(",") if s)
        qt = cls(data, mins, scales, shape, _DTYPE_NAMES[meta["dtype"]], cfg)
        expected = _packed_shape(shape, cfg)
        params = expected[:-2] + expected[-1:]
        if (tuple(data.shape), tuple(mins.shape), tuple(scales.shape)) != (expected, params, params) or (
            data.dtype, mins.dtype, scales.dtype) != (torch.uint8, PARAM_DTYPE, PARAM_DTYPE):
            raise ValueError(f"packed tensors {data.dtype} {tuple(data.shape)}, {mins.dtype} {tuple(mins.shape)}, "
                             f"{scales.dtype} {tuple(scales.shape)} do not match {meta}")
        return qt


DEFAULT_CONFIG = QuantConfig()


def _moved_shape(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    """The shape with the group dim last, as [*L, R, C] (a 1-D tensor gets R = 1)."""
    dim %= len(shape)
    moved = tuple(s for i, s in enumerate(shape) if i != dim) + (shape[dim],)
    return moved if len(moved) >= 2 else (1, *moved)


def _packed_shape(shape: tuple[int, ...], cfg: QuantConfig) -> tuple[int, ...]:
    *lead, r, c = _moved_shape(shape, cfg.dim)
    return (*lead, math.ceil(c / cfg.group_size), cfg.group_size // 2, r)


def empty_qtensor(shape, dtype: torch.dtype, cfg: QuantConfig = DEFAULT_CONFIG, alloc=None) -> QTensor:
    """A zero-filled QTensor of `shape` (e.g. a preallocated KV cache); `alloc(shape, dtype)` makes buffers."""
    alloc = alloc or (lambda s, d: torch.zeros(s, dtype=d))
    packed = _packed_shape(tuple(shape), cfg)
    params = packed[:-2] + packed[-1:]
    return QTensor(alloc(packed, torch.uint8), alloc(params, PARAM_DTYPE), alloc(params, PARAM_DTYPE),
                   tuple(shape), dtype, cfg)


def _round_f16(x: torch.Tensor, up: bool) -> torch.Tensor:
    """float32 -> the nearest float16 on the requested side (x <= result if up, else x >= result)."""
    h = x.to(PARAM_DTYPE)
    wrong = h.float() < x if up else h.float() > x
    toward = torch.full_like(h, math.inf if up else -math.inf)
    return torch.where(wrong, torch.nextafter(h, toward), h)


def _quantize_rows(x: torch.Tensor, group: int):
    """x [*L, R, C] -> data u8 [*L, ng, G/2, R], mins f16 [*L, ng, R], scales f16 [*L, ng, R]."""
    *lead, r, c = x.shape
    ng = math.ceil(c / group)
    x = x.float()
    if ng * group != c:  # pad with the last value: it does not widen the last group's range
        x = torch.cat([x, x[..., -1:].expand(*lead, r, ng * group - c)], dim=-1)
    g = x.view(*lead, r, ng, group)
    lo, hi = g.amin(-1), g.amax(-1)  # [*L, R, ng]
    mins = _round_f16(lo, up=False)
    scales = _round_f16((hi - mins.float()) / 15, up=True)
    if not x.is_cuda and not (torch.isfinite(mins).all() and torch.isfinite(scales).all()):  # (a host sync on CUDA)
        raise ValueError("cannot quantize: values are not finite or exceed the float16 range of mins/scales")
    inv = torch.where(scales > 0, 1 / scales.float(), 0.0)
    q = ((g - mins.float()[..., None]) * inv[..., None]).round_().clamp_(0, 15).to(torch.uint8)
    packed = q[..., : group // 2] | (q[..., group // 2 :] << 4)  # [*L, R, ng, G/2]
    data = packed.movedim(-3, -1).contiguous()  # [*L, ng, G/2, R]
    return data, mins.movedim(-1, -2).contiguous(), scales.movedim(-1, -2).contiguous()


def quantize(x: torch.Tensor, cfg: QuantConfig = DEFAULT_CONFIG) -> QTensor:
    """x (any float dtype) -> QTensor grouped along cfg.dim, in passes of ~4M values."""
    qt = empty_qtensor(x.shape, x.dtype, cfg, alloc=lambda s, d: torch.empty(s, dtype=d, device=x.device))
    moved = x.movedim(cfg.dim, -1).reshape(_moved_shape(tuple(x.shape), cfg.dim))  # [*L, R, C]
    *lead, r, c = moved.shape
    step = max(1, _ROWS_PER_PASS // max(1, c * math.prod(lead)))
    for start in range(0, r, step):
        data, mins, scales = _quantize_rows(moved[..., start : start + step, :], cfg.group_size)
        qt.write_rows(start, replace(qt, data=data, mins=mins, scales=scales))
    return qt


def _take(buf: torch.Tensor | None, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous [shape] view at the start of buf (reused when big enough), else a new tensor on `device`."""
    n = math.prod(shape)
    if buf is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if buf.dtype != dtype or not buf.is_contiguous() or buf.numel() < n:
        raise ValueError(f"buffer {buf.dtype} {tuple(buf.shape)} cannot hold {dtype} {tuple(shape)}")
    return buf.view(-1)[:n].view(shape)


def unpack_codes(qt: QTensor, scratch=None) -> torch.Tensor:
    """data [*L, ng, G/2, R] -> codes q^T uint8 [*L, Cp, R] (low nibbles: j < G/2, high: j >= G/2)."""
    *lead, ng, half, r = qt.data.shape
    codes = _take(scratch, (*lead, ng, 2, half, r), torch.uint8, qt.data.device)
    torch.bitwise_and(qt.data, 15, out=codes[..., 0, :, :])
    torch.bitwise_right_shift(qt.data, 4, out=codes[..., 1, :, :])
    return codes.view(qt.buffer_shape)


def dequantize_transposed(qt: QTensor, out=None, scratch=None, dtype=None) -> torch.Tensor:
    """QTensor -> x^T [*L, Cp, R] contiguous (padded columns included), x^T[c, r] = q * s + m.

    out (dtype) and scratch (uint8) are reused when given: each needs prod(buffer_shape) elements.
    Three passes: unpack nibbles (uint8), widen to dtype, one addcmul with m and s broadcast along j."""
    dtype = dtype or (out.dtype if out is not None else qt.dtype)
    *lead, ng, half, r = qt.data.shape
    codes = unpack_codes(qt, scratch)  # [*L, Cp, R]
    res = _take(out, (*lead, ng, 2 * half, r), dtype, qt.data.device)
    res.copy_(codes.view(res.shape))
    mins, scales = qt.mins.to(dtype).unsqueeze(-2), qt.scales.to(dtype).unsqueeze(-2)  # [*L, ng, 1, R]
    torch.addcmul(mins, res, scales, out=res)
    return res.view(qt.buffer_shape)


def dequantize(qt: QTensor, out=None, scratch=None, dtype=None) -> torch.Tensor:
    """QTensor -> a tensor of qt.shape (a strided view of the transposed buffer; see dequantize_transposed)."""
    xt = dequantize_transposed(qt, out, scratch, dtype)[..., : qt.cols, :]  # [*L, C, R]
    x = xt.mT  # [*L, R, C]
    if len(qt.shape) == 1:
        x = x[0]
    return x.movedim(-1, qt.dim)


INT4_GROUP_SIZES = (32, 64, 128, 256)  # what aten's CPU int4 kernel accepts
# aten's CPU int4 kernel is fast with bfloat16 activations and scales only (its float32 path is much slower), so
# float32 runs pack in bfloat16 and cast the activations to it and the result back
PACKED_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Int4Packed:
    """A Linear weight [out, in] in aten's CPU int4 layout: w = (q - 8) * scale + zero per group of `in`."""

    weight: torch.Tensor  # from _convert_weight_to_int4pack_for_cpu, for [Np, Kp] codes
    scales_and_zeros: torch.Tensor  # [Kp / G, Np, 2] in the activation dtype
    in_features: int
    out_features: int
    group_size: int


def pack_int4(qt: QTensor, dtype: torch.dtype) -> Int4Packed:
    """Our QTensor (grouped along `in`) -> aten's layout; zero = m + 8 s makes (q - 8) s + zero = q s + m.

    N (out) is padded to a multiple of 16 with zero rows, as the kernel requires; K is already padded to G."""
    if len(qt.shape) != 2 or qt.dim != 1 or qt.config.group_size not in INT4_GROUP_SIZES:
        raise InvalidParamsError(f"int4pack needs a 2-D weight grouped along dim 1 with a group size in "
                                 f"{INT4_GROUP_SIZES}; got shape {qt.shape}, {qt.config}")
    n, k = qt.shape
    n_pad = -n % 16
    codes = unpack_codes(qt).T.to(torch.int32)  # [N, Kp]
    scales, zeros = qt.scales.float(), qt.mins.float() + 8 * qt.scales.float()  # [ng, N]
    if n_pad:
        codes = torch.nn.functional.pad(codes, (0, 0, 0, n_pad))
        scales, zeros = (torch.nn.functional.pad(t, (0, n_pad)) for t in (scales, zeros))
    weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)
    sz = torch.stack([scales, zeros], dim=-1).to(dtype).contiguous()  # [ng, Np, 2]
    return Int4Packed(weight, sz, k, n, qt.config.group_size)


def int4_linear(x: torch.Tensor, packed: Int4Packed) -> torch.Tensor:
    """y = x @ W^T with W kept in 4 bits: x [*, in] -> y [*, out] (x zero-padded to Kp columns)."""
    *lead, k = x.shape
    kp = packed.weight.shape[1] * 2
    x2 = x.reshape(-1, k)
    if kp != k:
        x2 = torch.nn.functional.pad(x2, (0, kp - k))
    x2 = x2.to(packed.scales_and_zeros.dtype)  # the kernel computes in its scales' dtype (see PACKED_DTYPE)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.contiguous(), packed.weight, packed.group_size,
                                                   packed.scales_and_zeros)  # [rows, Np]
    return y[:, : packed.out_features].to(x.dtype).reshape(*lead, packed.out_features)
