"""A quantized checkpoint's layer: which stored tensors make up each quantized Linear weight (GPTQ/AWQ: `X.qweight`,
`X.qzeros`, `X.scales`, `X.g_idx`; FP8: `X.weight` and `X.weight_scale_inv`), all named `X.weight` once read
(MXFP4's stacked experts: `X_blocks` and `X_scales`, named `X`), and
the layer in the run's dtype, one layer at a time (the checkpoint reader's dequantizing read: a run never holds
more than one layer's dense copy on the way)."""

from __future__ import annotations

import torch

from engine.errors import WeightFormatError
from engine.quantized import fp8, int4_formats, mxfp4
from engine.quantized.config import INT4_METHODS, QuantFormat

Parts = dict[str, torch.Tensor]
_FP8_PARTS = {"weight": "weight", "scale_inv": "weight_scale_inv"}


def split_quantized(raw: dict[str, torch.Tensor], fmt: QuantFormat) -> tuple[dict[str, Parts], dict[str, torch.Tensor]]:
    """(quantized weight name `X.weight` -> its stored tensors by part, the other tensors as stored)."""
    if fmt.method == "mxfp4":  # stacked experts: `X_blocks`, `X_scales` -> `X` (no `.weight` suffix)
        bases = sorted(n.removesuffix("_blocks") for n in raw if n.endswith("_blocks"))
        parts = {b: {p: raw[f"{b}_{p}"] for p in ("blocks", "scales") if f"{b}_{p}" in raw} for b in bases}
        used = {f"{b}_{p}" for b in bases for p in ("blocks", "scales")}
    else:
        if fmt.method in INT4_METHODS:
            bases = sorted(n.removesuffix(".qweight") for n in raw if n.endswith(".qweight"))
            names = {p: p for p in int4_formats.PARTS}
        else:
            bases = sorted(n.removesuffix(".weight_scale_inv") for n in raw if n.endswith(".weight_scale_inv"))
            names = _FP8_PARTS
        parts = {f"{b}.weight": {p: raw[f"{b}.{key}"] for p, key in names.items() if f"{b}.{key}" in raw}
                 for b in bases}
        used = {f"{b}.{key}" for b in bases for key in names.values()}
    rest = {n: t for n, t in raw.items() if n not in used}
    stray = [n for n, t in rest.items() if not t.dtype.is_floating_point or t.dtype in fp8.FP8_DTYPES]
    if stray:
        raise WeightFormatError(f"{fmt.method} checkpoint: tensor {stray[0]!r} ({rest[stray[0]].dtype}) is not part "
                                "of a quantized weight that the checkpoint describes (a missing scale or packed part?)")
    return parts, rest


def dense_weight(parts: Parts, fmt: QuantFormat, dtype: torch.dtype, name: str) -> torch.Tensor:
    """Quantized weight `name` [out, in] in `dtype`."""
    if fmt.method in INT4_METHODS:
        return int4_formats.dense(int4_formats.unpack(parts, fmt, name), dtype)
    if fmt.method == "mxfp4":
        if set(parts) != {"blocks", "scales"}:
            raise WeightFormatError(f"mxfp4 weight {name!r} lacks its {'scales' if 'blocks' in parts else 'blocks'}")
        return mxfp4.dense(parts["blocks"], parts["scales"], dtype, name)
    if "weight" not in parts:
        raise WeightFormatError(f"fp8 weight {name!r} has a weight_scale_inv but no weight in the checkpoint")
    return fp8.dense(parts["weight"], parts["scale_inv"], fmt, dtype, name)


def dense_weights(raw: dict[str, torch.Tensor], fmt: QuantFormat, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Stored tensors of one layer (or the globals) -> every weight in `dtype`, quantized ones dequantized."""
    parts, rest = split_quantized(raw, fmt)
    out = {name: t.to(dtype).contiguous() for name, t in rest.items()}
    for name, p in parts.items():
        out[name] = dense_weight(p, fmt, dtype, name)
    return out
