"""GPTQ and AWQ weights repacked into the project's own 4-bit form (engine/compression/int4.py `QTensor`), for a run
with 4-bit weights: the checkpoint's codes are kept, so its layers are neither widened to a dense copy nor
quantized a second time, and they compute with the own int4 kernels as any 4-bit layer does.

A QTensor holds x = q s + m per group of G columns (the codec's group, 64 by default), while the checkpoint holds
x = (q - z) s per group of its own group size. A group of G columns that lies inside one checkpoint group (g_idx
constant over it: a checkpoint group of 128 is two groups of 64, a per-row group (-1) any number) keeps the codes
q and s, with m = -z s. s is float16 in the checkpoint and kept as it is; m is rounded once to float16, which is
exact where z s has at most 11 significant bits (symmetric GPTQ, z = 8, always) and else off by at most half a
float16 unit of |z s| <= 16 s, i.e. |error| <= 2^-11 16 s = s / 128 per value (an eighth of the rounding the
4-bit code itself may carry). A weight whose groups do not line up with G (act-order with a shuffled g_idx, a
checkpoint group smaller than G or not a multiple of it) is not repacked: its layer is read dequantized, one layer
at a time, and quantized by the codec like an unquantized checkpoint's."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from engine.compression.int4 import PARAM_DTYPE, QTensor, QuantConfig
from engine.kernels.fuse import fuse_projections, fused_groups
from engine.quantized import int4_formats
from engine.quantized.config import INT4_METHODS
from engine.quantized.layer import split_quantized

log = logging.getLogger(__name__)


def to_qtensor(w: int4_formats.Int4Groups, cfg: QuantConfig, dtype: torch.dtype) -> QTensor | None:
    """The weight as a QTensor grouped along `in` by cfg.group_size, or None where its groups do not line up."""
    out, cols = w.shape
    group = cfg.group_size
    ng = math.ceil(cols / group)
    g = F.pad(w.g_idx, (0, ng * group - cols), value=int(w.g_idx[-1])).view(ng, group)
    if not bool((g == g[:, :1]).all()):
        return None
    scales = w.scales.to(PARAM_DTYPE)
    if not torch.equal(scales.to(w.scales.dtype), w.scales) or not bool(torch.isfinite(scales).all()):
        return None  # scales that float16 does not hold
    block = g[:, 0]  # the checkpoint group of each group of G columns
    scales = scales[block]  # [ng, out]
    mins = (-(w.zeros[block].float() * scales.float())).to(PARAM_DTYPE)
    codes = F.pad(w.codes, (0, ng * group - cols)).view(out, ng, 2, group // 2)
    data = (codes[:, :, 0] | (codes[:, :, 1] << 4)).permute(1, 2, 0).contiguous()  # [ng, G/2, out]
    return QTensor(data, mins.contiguous(), scales.contiguous(), (out, cols), dtype, cfg)


def _cat(parts: list[QTensor]) -> QTensor | None:
    """QTensors of the same `in` and config stacked along `out` (fused projections), or None."""
    first = parts[0]
    if any(q.config != first.config or q.shape[1:] != first.shape[1:] for q in parts):
        return None
    return replace(first, data=torch.cat([q.data for q in parts], -1), mins=torch.cat([q.mins for q in parts], -1),
                   scales=torch.cat([q.scales for q in parts], -1), shape=(sum(q.shape[0] for q in parts),
                                                                          *first.shape[1:]))


def _fuse(qts: dict[str, QTensor]) -> dict[str, QTensor] | None:
    """The QTensors with each group of `fused_groups` concatenated, as fuse_projections does to dense weights; None
    where a group is partly quantized."""
    out = dict(qts)
    for fused, parts in fused_groups(qts).items():
        names = [p + ".weight" for p in parts]
        present = [n in out for n in names]
        if all(present):
            cat = _cat([out.pop(n) for n in names])
            if cat is None:
                return None
            out[fused + ".weight"] = cat
        elif any(present):
            return None
    return out


def repacked_layer(reader, i: int, codec) -> tuple[dict[str, torch.Tensor], dict[str, str]] | None:
    """Layer i of a GPTQ/AWQ checkpoint in a 4-bit codec's stored form (what `codec.encode` of the fused dense
    layer gives, the quantized weights as repacked QTensors), or None where it cannot be repacked (another
    checkpoint or codec, or groups that do not line up): the caller then dequantizes and encodes the layer."""
    fmt = getattr(reader, "quant", None)
    if fmt is None or fmt.method not in INT4_METHODS or codec is None or codec.format != "int4":
        return None
    parts, rest = split_quantized(reader.stored_layer(i), fmt)
    qts = {}
    for name, p in parts.items():
        qt = to_qtensor(int4_formats.unpack(p, fmt, name), codec.config, codec.dtype)
        if qt is None:
            log.info("layer %d: %s's groups do not line up with groups of %d: dequantized and quantized again",
                     i, name, codec.config.group_size)
            return None
        qts[name] = qt
    fused_q = _fuse(qts)
    if fused_q is None:
        return None
    stand_ins = {n: torch.zeros(qt.shape[0], 0, dtype=codec.dtype) for n, qt in qts.items()}  # fuse biases alike
    dense = fuse_projections({n: t.to(codec.dtype).contiguous() for n, t in rest.items()} | stand_ins)
    tensors, meta = codec.encode({n: t for n, t in dense.items() if n not in fused_q})
    for name, qt in fused_q.items():
        for part in ("data", "mins", "scales"):
            tensors[f"{name}.{part}"] = getattr(qt, part)
        meta[name] = json.dumps(qt.metadata())
    return tensors, meta
