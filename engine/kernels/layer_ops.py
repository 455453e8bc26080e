"""A Llama layer's row-wise work: RMSNorm (with the residual add before it), rotary positions on q and k, SiLU
gating; and the sampler's greedy choice over the logits' rows. Each as PyTorch ops (the reference, and the path
off the CPU) and as the project's fused kernel (engine/kernels/csrc/layer_*.cpp), which makes one pass over each
row where PyTorch makes several and one call where it makes five to ten.

The kernels do the reference's arithmetic: float32 throughout, rounded to the compute dtype exactly where the
PyTorch ops round (each op on bfloat16 tensors computes in float32 and rounds its result once). What differs:

    add_rms_norm, rms_norm   the order of the mean's sum of squares: float32 within a few ulp; bfloat16 equal but
                             for a value every ~10^5 lying one rounding step apart (equal where the sum is exact)
    silu_mul                 exp within 2 ulp of PyTorch's: float32 within a few ulp; bfloat16 as for the norm
    rope                     none: bit-equal, float32 and bfloat16 (the same cos/sin tables, made once per step)
    argmax_rows              none: the same index (the first of the largest value; a NaN counts as largest)

`fused_*` return None wherever the kernel does not take the operands (kernels not built for this CPU, a tensor off
the CPU, a dtype other than float32 / bfloat16, rows not evenly strided): the caller then runs the PyTorch
function of the same name. The kernels check their operands themselves, so that a call from Python costs one
call (a decode step makes a few hundred of them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import compiled


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalized in float32, scaled in the weight's dtype (the compute dtype)."""
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)).to(weight.dtype)
    return normed.mul_(weight)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                 in_place: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(h + delta, rms_norm(h + delta)): the sum in float32, into h itself when `in_place`."""
    h = h.add_(delta) if in_place else h + delta
    return h, rms_norm(h, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [*, 2F] -> silu(gate) * up [*, F]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def split_heads(qkv: torch.Tensor, NH: int, KVH: int, D: int):
    """qkv [B, S, (NH + 2 KVH) D] -> views q [B, NH, S, D], k, v [B, KVH, S, D]."""
    B, S, _ = qkv.shape
    q, k, v = qkv.split((NH * D, KVH * D, KVH * D), dim=-1)
    return q.view(B, S, NH, D).transpose(1, 2), *(t.view(B, S, KVH, D).transpose(1, 2) for t in (k, v))


def fused_add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                       in_place: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`add_rms_norm` (or, without delta, (h, rms_norm(h))) in one pass over each row; h float32."""
    mod = compiled.ops()
    if mod is None:
        return None
    with compiled.profiled("add_rms_norm"):
        return mod.add_rms_norm(h, delta, weight, eps, in_place)


def fused_silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """`silu_mul` in one pass."""
    mod = compiled.ops()
    if mod is None:
        return None
    with compiled.profiled("silu_mul"):
        return mod.silu_mul(gate_up)


def fused_rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, NH: int, KVH: int, D: int):
    """q and k heads of qkv [B, S, (NH + 2 KVH) D] rotated in place by cos, sin [B, 1, S, D] (in qkv's dtype, as
    engine/kernels/rope.py `cos_sin` makes them), and `split_heads(qkv)`; None (nothing done) where the kernel
    does not take them."""
    mod = compiled.ops()
    if mod is None:
        return None
    with compiled.profiled("rope_qkv"):
        return mod.rope_qkv(qkv, cos, sin, NH, KVH, D)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [*, V] -> the first index of each row's largest value [*] (torch.argmax(-1)), by the kernel where it
    takes them (float32 on the CPU: PyTorch's CPU argmax runs at a few percent of memory speed, ~1 ms for a decode
    step's 32 x 32k logits)."""
    mod = compiled.ops()
    out = None
    if mod is not None:
        with compiled.profiled("argmax_rows"):
            out = mod.argmax_rows(logits)
    return logits.argmax(-1) if out is None else out
