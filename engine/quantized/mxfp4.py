"""MXFP4 weights as gpt-oss publishes its experts (`quant_method: mxfp4`): for each stacked expert projection
`X_blocks` [E, out, in / 32, 16] uint8, two 4-bit e2m1 values per byte (the low nibble first), and `X_scales`
[E, out, in / 32] uint8, one power of two per block of 32 values (an e8m0 exponent, biased by 127):

    w[e, n, k] = E2M1[nibble(e, n, k)] * 2^(scale[e, n, k // 32] - 127)

Exact in float32 (a value has 2 significant bits, a scale is a power of two), then rounded once to the run's dtype.
The result is laid out [E, in, out] as the unquantized checkpoints store these tensors (engine/kernels/fuse.py
unstacks them per expert).

Kept packed instead (engine/quantized/mxfp4_layer.py), a weight's blocks and scales sit side by side, [..., in / 32,
17] uint8: each block's 16 code bytes, then its scale, the bytes the project's kernel reads
(engine/kernels/mxfp4_linear.py), stored under the weight's name + SUFFIX."""

from __future__ import annotations

import torch

from engine.errors import WeightFormatError

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32  # values per scale
SCALE_BIAS = 127
SUFFIX = ".mxfp4"  # a packed weight's stored name: the weight's + this


def _check(blocks: torch.Tensor, scales: torch.Tensor, name: str) -> None:
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise WeightFormatError(f"mxfp4 weight {name!r}: blocks {blocks.dtype} {tuple(blocks.shape)} and scales "
                                f"{scales.dtype} {tuple(scales.shape)} do not match (uint8 [..., n / 32, 16] and "
                                "uint8 [..., n / 32])")


def dense(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """Stacked weight `name` [E, in, out] in `dtype` from its packed values and block scales."""
    _check(blocks, scales, name)
    lut = torch.tensor(E2M1, dtype=torch.float32)
    values = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)  # [..., G, 16, 2]
    values = values.flatten(-3)  # [E, out, in]: low nibble first within each byte
    exponents = (scales.to(torch.int32) - SCALE_BIAS).repeat_interleave(BLOCK, dim=-1)
    return torch.ldexp(values, exponents).to(dtype).transpose(1, 2).contiguous()


def pack(blocks: torch.Tensor, scales: torch.Tensor, name: str) -> torch.Tensor:
    """Weight `name`'s blocks [..., G, 16] and scales [..., G] side by side: [..., G, 17] uint8, the same bytes."""
    _check(blocks, scales, name)
    return torch.cat([blocks, scales.unsqueeze(-1)], dim=-1)
