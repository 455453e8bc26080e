"""A gpt-oss mixture's routed experts in one call of the project's MXFP4 kernels (csrc/mxfp4_bind.cpp) where every
expert's gate_up and down weights are kept packed (engine/kernels/mxfp4_linear.py): each expert's gate_up GEMM + bias,
gpt-oss's clamped SwiGLU, (clamp(up, -limit, limit) + 1) * g sigmoid(alpha g) with g = min(gate, limit), and its down
GEMM + bias over its own rows, every expert's work spread over the threads at once, with no Python call, widening or
thread hand-out per expert and projection.

The values between the two GEMMs stay float32; the expert-at-a-time path (engine/models/experts.py `expert`) rounds
each op's result to the run's dtype: the same arithmetic in float32 (the sigmoid's exponential aside, within 2 ulp),
more precise in bfloat16."""

from __future__ import annotations

import torch

from engine.kernels import compiled
from engine.kernels.mxfp4_linear import Mxfp4Weight


def run(rows: torch.Tensor, counts: list[int], gate_up: list, gate_up_bias: list, down: list, down_bias: list,
        limit: float, alpha: float) -> torch.Tensor | None:
    """rows [R, H] grouped by expert (`counts[j]` rows of the j-th expert, whose weights are gate_up[j] [2F, H] (gate
    rows, then up rows) and down[j] [H, F], its biases gate_up_bias[j] [2F] and down_bias[j] [H]) -> [R, H] in rows'
    dtype; None where the call does not take them (another weight form, a missing bias, another dtype)."""
    if rows.dtype not in (torch.float32, torch.bfloat16) or rows.device.type != "cpu":
        return None
    if not all(isinstance(w, Mxfp4Weight) for w in (*gate_up, *down)):
        return None
    if any(b is None for b in (*gate_up_bias, *down_bias)):
        return None
    starts = [0]
    for n in counts:
        starts.append(starts[-1] + n)
    with compiled.profiled(f"mxfp4 experts {len(counts)}x{rows.shape[0]}x{gate_up[0].out_features}x"
                           f"{gate_up[0].in_features}"):
        return compiled.ops().mxfp4_experts(rows, starts, [w.packed for w in gate_up], gate_up_bias,
                                            [w.packed for w in down], down_bias, limit, alpha)
