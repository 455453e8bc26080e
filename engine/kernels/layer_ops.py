"""A Llama layer's row-wise work: RMSNorm (with the residual add before it), rotary positions on q and k, SiLU
gating. Each as PyTorch ops (the reference, and the path off the CPU) and as the project's fused kernel
(engine/kernels/csrc/layer_*.cpp), which makes one pass over each row where PyTorch makes several and one call
where it makes five to ten.

The kernels do the reference's arithmetic: float32 throughout, rounded to the compute dtype exactly where the
PyTorch ops round (each op on bfloat16 tensors computes in float32 and rounds its result once). What differs:

    add_rms_norm, rms_norm   the order of the mean's sum of squares: float32 within a few ulp; bfloat16 equal but
                             for a value every ~10^5 lying one rounding step apart (equal where the sum is exact)
    silu_mul                 exp within 2 ulp of PyTorch's: float32 within a few ulp; bfloat16 as for the norm
    rope                     none: bit-equal, float32 and bfloat16 (the same cos/sin tables, made once per step)

`fused_*` return None (or False) wherever the kernel does not take the operands (kernels not built for this CPU,
a tensor off the CPU, a dtype other than float32 / bfloat16, rows that are not contiguous): the caller then runs
the PyTorch function of the same name."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import compiled

KERNEL_DTYPES = (torch.float32, torch.bfloat16)


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


def _ops(*tensors: torch.Tensor):
    """The compiled module where it runs here and every tensor is a CPU tensor of a dtype it takes, else None."""
    mod = compiled.ops()
    if mod is None or any(t.device.type != "cpu" or t.dtype not in KERNEL_DTYPES for t in tensors):
        return None
    return mod if mod.isa() != "none" else None


def _rows(t: torch.Tensor) -> torch.Tensor | None:
    """t [*, n] as [rows, n] without a copy, or None where its rows are not contiguous."""
    if t.dim() == 2 and t.stride(1) == 1:
        return t
    return t.view(-1, t.shape[-1]) if t.dim() > 0 and t.is_contiguous() else None


def fused_add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                       in_place: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`add_rms_norm` (or, without delta, (h, rms_norm(h))) in one pass over each row; h float32."""
    mod = _ops(h, weight) if delta is None else _ops(h, weight, delta)
    h2 = _rows(h)
    d2 = None if delta is None else _rows(delta)
    if mod is None or h.dtype != torch.float32 or h2 is None or (delta is not None and d2 is None) \
            or weight.dim() != 1 or weight.shape[0] != h.shape[-1] or (delta is not None and delta.shape != h.shape):
        return None
    h_out, x = mod.add_rms_norm(h2, d2, weight.contiguous(), eps, in_place)
    return (h if in_place or delta is None else h_out.view(h.shape)), x.view(h.shape)


def fused_silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """`silu_mul` in one pass."""
    mod, rows = _ops(gate_up), _rows(gate_up)
    if mod is None or rows is None or gate_up.shape[-1] % 2:
        return None
    return mod.silu_mul(rows).view(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


def fused_rope_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, D: int) -> bool:
    """Rotate the first `heads` heads of qkv [B, S, W] in place by cos, sin [B, 1, S, D] (in qkv's dtype, as
    engine/kernels/rope.py `cos_sin` makes them); False (nothing done) where the kernel does not take them."""
    mod, rows = _ops(qkv, cos, sin), _rows(qkv)
    B, S = qkv.shape[:2] if qkv.dim() == 3 else (0, 0)
    table = (B, 1, S, D)
    if mod is None or rows is None or qkv.dim() != 3 or cos.shape != table or sin.shape != table \
            or not (cos.dtype == sin.dtype == qkv.dtype) or not (cos.is_contiguous() and sin.is_contiguous()):
        return False
    mod.rope_(rows, cos.view(B * S, D), sin.view(B * S, D), heads, D)
    return True
