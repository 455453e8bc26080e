"""A mixture's routed experts in one call of the project's kernels (csrc/moe_bind.cpp) where every expert's
gate_up and down weights are 4-bit in the kernel's tiles and each expert's rows take the kernel: each expert's
gate_up GEMM, SiLU(gate) * up and down GEMM over its own rows, all experts' work spread over the threads at once.
Each row gets the arithmetic the same calls one expert at a time give it (the same bytes), without a Python call,
a quantization and a thread hand-out per expert and projection: a decode step of a fine-grained mixture (Qwen3-MoE:
64-128 experts of a few rows each) is otherwise mostly that overhead."""

from __future__ import annotations

import torch

from engine.compression.qlinear import QLinear
from engine.kernels import compiled
from engine.kernels.int4_tiles import Int4Tiles


def run(rows: torch.Tensor, counts: list[int], gate_up: list, down: list) -> torch.Tensor | None:
    """rows [R, H] grouped by expert (`counts[j]` rows of the j-th expert, whose weights are gate_up[j] [2F, H]
    and down[j] [H, F]) -> down(SiLU(gate) * up) [R, H] in rows' dtype; None where the call does not take them
    (another weight form, a row count an expert's weights compute densely, no kernels built)."""
    call = getattr(compiled.ops(), "int4_experts", None)
    if call is None or rows.dtype not in (torch.float32, torch.bfloat16) or rows.device.type != "cpu":
        return None
    for n, *ws in zip(counts, gate_up, down):
        if not all(isinstance(w, QLinear) and isinstance(w.weight.fast, Int4Tiles) and w.takes_kernel(n) for w in ws):
            return None
    gu, dn = [w.weight.fast for w in gate_up], [w.weight.fast for w in down]
    starts = [0]
    for n in counts:
        starts.append(starts[-1] + n)
    with compiled.profiled(f"experts {len(counts)}x{rows.shape[0]}x{gu[0].out_features}x{gu[0].in_features}"):
        return call(rows.contiguous(), starts, [w.codes for w in gu], [w.scales for w in gu],
                                [w.mins for w in gu], [w.codes for w in dn], [w.scales for w in dn],
                                [w.mins for w in dn], gu[0].out_features, dn[0].out_features, gu[0].group_size,
                                dn[0].group_size)
