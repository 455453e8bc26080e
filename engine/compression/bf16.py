"""bfloat16 weights at rest: a Linear weight kept and moved in bfloat16 and widened to the compute dtype (float32)
where it computes (in registers, by the bf16 x float32 kernel, where engine/kernels/gemm_choice.py's rule takes the
call). For a checkpoint stored in bfloat16, which most are, this loses nothing against the float32 run that widened
it at load, and halves what the weight tiers hold and what the disk tier reads.

Where the own kernels run AVX2 (no bf16 arithmetic in hardware: a float32 run), it is also the form a bf16
checkpoint is kept in unasked (`kept_unasked`): there the kernel makes decode faster than over float32 weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.kernels.machine_class import kernel_class

if TYPE_CHECKING:
    from engine.spec import ModelSpec


@dataclass(frozen=True)
class Bf16Weight:
    """One Linear weight [out, in] in bfloat16."""

    values: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size()


def lossless(model: ModelSpec, dtype_bytes: int) -> bool:
    """Whether keeping `model`'s weights in bfloat16 loses nothing: a float32 run (`dtype_bytes` 4) over a checkpoint
    stored in bfloat16 and not quantized (a GPTQ or AWQ checkpoint keeps its own 4-bit form)."""
    return dtype_bytes == 4 and model.checkpoint_dtype == "bfloat16" and model.quantization is None


def kept_unasked(model: ModelSpec, dtype_bytes: int) -> bool:
    """Whether a run keeps `model`'s Linear weights in bfloat16 where neither compress_weight nor weight_format is
    pinned (the planner's uncompressed form, and an unplanned run's): where it is `lossless` on the avx2 machine
    class, where the bf16 x float32 kernel generated 1.18x float32 weights' tokens/s on the decode-heavy gen
    workload and 0.98-1.00x on the prefill-heavy short and bulk ones, in half the weight bytes (docs/BENCHMARKS.md).
    A fixed rule of the machine class, as the kernel choices are: every node of one CPU kind keeps one form."""
    return lossless(model, dtype_bytes) and kernel_class() == "avx2"
