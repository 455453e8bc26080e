"""Row-wise int8 Linear weights (engine/compression/int8.py) multiplied by the project's own kernel
(engine/kernels/csrc/int8_*.cpp): the activations quantized per row inside the call, the int8 x int8 dot products
(VNNI on AVX-512 CPUs, vpmaddubsw on AVX2 ones) and the rescale y = a_m s_n (qx_m . q_n) in one pass that writes
the output in the activations' dtype, over the codes as stored (nothing repacked). PyTorch's path
(`engine.compression.int8.int8_linear`: quantize, `torch._int_mm`, rescale as separate ops) is the fallback.

AVX-512's vpdpbusd multiplies unsigned by signed bytes, so the kernel offsets the activation codes by 128 and takes
128 sum_k q[n, k] off each dot product: those sums are computed once, when the weight is packed here."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.compression.int8 import Int8Weight, int8_linear
from engine.kernels import compiled


@dataclass(frozen=True)
class Int8Rows:
    """An Int8Weight's codes and scales (the same tensors) with each output row's code sum."""

    codes: torch.Tensor
    scales: torch.Tensor
    code_sums: torch.Tensor


def available() -> bool:
    mod = compiled.ops()
    return mod is not None and mod.isa() != "none"


def pack_fast(w: Int8Weight) -> Int8Rows | Int8Weight:
    """The kernel's operand for `w` where the kernels are built (and `w` lies in CPU memory), else `w` itself
    (PyTorch's int8 path)."""
    if not available() or w.codes.device.type != "cpu" or not w.codes.is_contiguous():
        return w
    return Int8Rows(w.codes, w.scales.float().contiguous(), w.codes.sum(dim=1, dtype=torch.int32))


def fast_linear(x: torch.Tensor, fast: Int8Rows | Int8Weight) -> torch.Tensor:
    """y = x W^T through whichever int8 path `pack_fast` chose, in x's dtype."""
    if isinstance(fast, Int8Weight):
        return int8_linear(x, fast)
    n, k = fast.codes.shape
    with compiled.profiled(f"gemm-int8 {x.numel() // k}x{n}x{k}"):
        if x.dtype not in (torch.float32, torch.bfloat16):
            return compiled.ops().int8_linear(x.float(), fast.codes, fast.scales, fast.code_sums).to(x.dtype)
        return compiled.ops().int8_linear(x, fast.codes, fast.scales, fast.code_sums)
