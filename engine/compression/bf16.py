"""bfloat16 weights at rest: a Linear weight kept and moved in bfloat16 and widened to the compute dtype (float32)
where it computes. For a checkpoint stored in bfloat16, which most are, this loses nothing against the float32
run that widened it at load, and halves what the weight tiers hold and what the disk tier reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
