"""GPTQ and AWQ 4-bit Linear weights as stored in their checkpoints, unpacked to one form:

    w[n, k] = (q[n, k] - z[g(k), n]) * s[g(k), n]        q, z in [0, 15] (GPTQ v1: z in [1, 16]), g(k) = g_idx[k]

GPTQ (AutoGPTQ / GPTQModel, `checkpoint_format` gptq or gptq_v2, int32 packing):
    qweight int32 [in / 8, out]     nibble j (bits 4j..4j+3) of row i is q[:, 8 i + j]    (packed along `in`)
    qzeros  int32 [groups, out / 8] nibble j of column c is z[:, 8 c + j] - 1 (gptq; gptq_v2 stores z itself)
    scales  float16 [groups, out]
    g_idx   int32 [in]              the group of each input column (act-order / desc_act: not k // group_size)
AWQ (AutoAWQ's GEMM version):
    qweight int32 [in, out / 8]     nibble i of column c is q[8 c + ORDER[i], :]^T      (packed along `out`)
    qzeros  int32 [groups, out / 8] the same packing of z
    scales  float16 [groups, out]   (no g_idx: g(k) = k // group_size)"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import WeightFormatError
from engine.quantized.config import QuantFormat

PARTS = ("qweight", "qzeros", "scales", "g_idx")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # column offset held by nibble i of an AWQ word
_AWQ_UNORDER = [AWQ_ORDER.index(j) for j in range(8)]  # nibble holding column offset j
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


@dataclass(frozen=True)
class Int4Groups:
    """One Linear weight [out, in]: codes q uint8 [out, in], zeros z int16 [groups, out], scales s [groups, out]
    (the checkpoint's dtype), and the group of each input column, g_idx int64 [in]."""

    codes: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> its 8 nibbles, uint8 [..., W, 8] (nibble j from bits 4j..4j+3)."""
    return ((packed.to(torch.int32)[..., None] >> _SHIFTS) & 15).to(torch.uint8)


def unpack(parts: dict[str, torch.Tensor], fmt: QuantFormat, name: str) -> Int4Groups:
    """The Int4Groups of weight `name` from its checkpoint tensors `parts` (qweight, qzeros, scales, g_idx)."""
    missing = [p for p in PARTS[:3] if p not in parts]
    if missing:
        raise WeightFormatError(f"{fmt.method} weight {name!r} lacks {', '.join(missing)} in the checkpoint")
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise WeightFormatError(f"{fmt.method} weight {name!r}: qweight/qzeros are {qweight.dtype}/{qzeros.dtype}, "
                                "expected int32 packing")
    if fmt.method == "gptq":
        codes = _nibbles(qweight).permute(0, 2, 1).reshape(-1, qweight.shape[1]).T  # [out, in]
        zeros = _nibbles(qzeros).reshape(qzeros.shape[0], -1).to(torch.int16) + fmt.zero_offset
    else:
        codes = _nibbles(qweight)[..., _AWQ_UNORDER].reshape(qweight.shape[0], -1).T
        zeros = _nibbles(qzeros)[..., _AWQ_UNORDER].reshape(qzeros.shape[0], -1).to(torch.int16)
    out, cols = codes.shape
    g_idx = parts.get("g_idx")
    if g_idx is None:
        g_idx = torch.arange(cols) // (fmt.group_size if fmt.group_size > 0 else cols)
    g_idx = g_idx.to(torch.int64)
    ok = (zeros.shape == scales.shape and scales.shape[1] == out and g_idx.shape == (cols,)
          and int(g_idx.min()) >= 0 and int(g_idx.max()) < scales.shape[0])
    if not ok:
        raise WeightFormatError(f"{fmt.method} weight {name!r}: codes [{out}, {cols}], zeros {tuple(zeros.shape)}, "
                                f"scales {tuple(scales.shape)}, g_idx {tuple(g_idx.shape)} do not agree")
    return Int4Groups(codes.contiguous(), zeros, scales, g_idx)


def dense(w: Int4Groups, dtype: torch.dtype) -> torch.Tensor:
    """The weight [out, in] in `dtype`: (q - z) s computed in float32 (exact: 5-bit integers times the scales),
    in place in one float32 temporary where groups are contiguous runs of columns (no act-order)."""
    out, cols = w.shape
    ng = w.scales.shape[0]
    z, s = w.zeros.float().T, w.scales.float().T  # [out, groups]
    x = w.codes.float()
    if cols % ng == 0 and torch.equal(w.g_idx, torch.arange(cols) // (cols // ng)):
        x.view(out, ng, cols // ng).sub_(z[..., None]).mul_(s[..., None])
    else:
        x.sub_(z[:, w.g_idx]).mul_(s[:, w.g_idx])
    return x.to(dtype).contiguous()
