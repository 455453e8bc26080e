"""FP8 Linear weights as DeepSeek-V3 and Qwen3-FP8 publish them (`quant_method: fp8`): `weight` in float8 e4m3 and
`weight_scale_inv` float32, one scale per block of `weight_block_size` = (rows, cols) (DeepSeek and Qwen: 128 x
128; the last block of a dimension may be partial), or one per tensor:

    w[n, k] = weight[n, k] * weight_scale_inv[n // rows, k // cols]

computed in float32 (exact: an e4m3 value has 4 significant bits), then rounded once to the run's dtype."""

from __future__ import annotations

import torch

from engine.errors import WeightFormatError
from engine.quantized.config import QuantFormat

FP8_DTYPES = (torch.float8_e4m3fn,)


def dense(weight: torch.Tensor, scale_inv: torch.Tensor, fmt: QuantFormat, dtype: torch.dtype,
          name: str) -> torch.Tensor:
    """The weight [out, in] in `dtype` from its e4m3 values and their scales."""
    if weight.dtype not in FP8_DTYPES or weight.dim() != 2:
        raise WeightFormatError(f"fp8 weight {name!r} is {weight.dtype} {tuple(weight.shape)}; expected a 2-D "
                                "float8_e4m3fn tensor")
    out, cols = weight.shape
    s = scale_inv.float()
    if s.numel() == 1:
        return (weight.float() * s.reshape(())).to(dtype).contiguous()
    rows_per, cols_per = fmt.block or (out, cols)
    grid = (-(-out // rows_per), -(-cols // cols_per))
    if tuple(s.shape) != grid:
        raise WeightFormatError(f"fp8 weight {name!r} [{out}, {cols}] with weight_block_size {fmt.block} needs "
                                f"weight_scale_inv of shape {list(grid)}; the checkpoint has {list(s.shape)}")
    w = weight.float()  # the one float32 temporary: scaled in place, block by block where blocks are whole
    if out % rows_per == 0 and cols % cols_per == 0:
        w.view(grid[0], rows_per, grid[1], cols_per).mul_(s[:, None, :, None])
    else:
        w.mul_(s.repeat_interleave(rows_per, 0)[:out].repeat_interleave(cols_per, 1)[:, :cols])
    return w.to(dtype).contiguous()
