"""Which kernel runs decode attention (one query per row) over a KV cache: the chunked online softmax
(`engine/kernels/cpu_attention.py`: float32, chunk by chunk, never a full-precision copy of a 4-bit cache),
PyTorch's SDPA (over the cache as stored, or over a dequantized copy of a 4-bit cache), or the project's own kernel
(`engine/kernels/own_attention.py`: the cache read once as stored), where it is built and takes the shape.

All are exact attention; they differ in rounding only (SDPA computes in the cache's dtype, the chunked path and
the own kernel in float32), and greedy float32 tokens equal transformers' with each
(tests/engine/kernels/test_decode_choice.py, test_own_attention.py). As the rounding decides a row's bytes, the
choice is a fixed rule of the machine class (engine/kernels/machine_class.py), the cache kind, the dtype and the
head size, never a timing: the own kernel wherever it is built and takes the head size (it reads the cache once,
at 0.4-0.6 of the memory rate; measured faster than SDPA and the chunked path at every shape of 32 or more (row, KV
head) items on the AMX Xeon); elsewhere the chunked path over a 4-bit cache (SDPA would widen all of it) and SDPA
over a plain one (measured faster than the chunked path at every shape without the own kernels)."""

from __future__ import annotations

import torch

from engine.compression.int4 import DEFAULT_CONFIG, QTensor, QuantConfig, dequantize
from engine.kernels import own_attention
from engine.kernels.attention import attend
from engine.kernels.cpu_attention import decode_attention
from engine.kernels.machine_class import kernel_class

KERNELS = ("chunked", "sdpa", "own")
KV_CONFIG = QuantConfig(DEFAULT_CONFIG.bits, DEFAULT_CONFIG.group_size, dim=-1)  # as engine.compression.codecs.KVCodec


def decode(q: torch.Tensor, k, v, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Decode attention by the kernel `decode_kernel` names: q [B, NH, 1, D], k/v [B, KVH, T, D] tensors or QTensors,
    mask [B, 1, 1, T] -> [B, NH, 1, D]."""
    B, NH, _, D = q.shape
    kind = "4bit" if isinstance(k, QTensor) else "plain"
    if q.device.type != "cpu":  # chosen on the CPU only; elsewhere the chunked path
        return decode_attention(q, k, v, mask, scale)
    kernel = decode_kernel(kind, q.dtype, B, NH, k.shape[1], D)
    if kernel == "own" and own_attention.supports(q, k):
        return own_attention.decode_attention(q, k, v, mask, scale)
    if kernel == "sdpa":
        return sdpa(q, k, v, mask, scale)
    return decode_attention(q, k, v, mask, scale)


def sdpa(q: torch.Tensor, k, v, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    if isinstance(k, QTensor):
        k, v = dequantize(k, dtype=q.dtype), dequantize(v, dtype=q.dtype)
    return attend(q, k, v, mask, scale)


def decode_kernel(kind: str, dtype: torch.dtype, batch: int, heads: int, kv_heads: int, head_dim: int) -> str:
    """"chunked", "sdpa" or "own" for this cache kind ("plain" or "4bit"), dtype and shape on this machine class."""
    own = (kernel_class() != "scalar" and dtype in (torch.float32, torch.bfloat16)
           and head_dim % 16 == 0 and head_dim <= own_attention.MAX_HEAD_DIM)
    return "own" if own else "chunked" if kind == "4bit" else "sdpa"
