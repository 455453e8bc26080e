"""Which kernel runs a prefill's attention (queries over their own new K/V): PyTorch's SDPA
(`engine/kernels/attention.py` `attend`) or the project's own blocked kernel (`engine/kernels/own_attention.py`,
bf16 only, AVX-512 and AVX2). Both are exact attention up to rounding (the own kernel on AVX-512 rounds the
probabilities to bf16 before the product with V, as flash attention does; on AVX2 it keeps them in float32;
SDPA's bf16 path rounds more).

As the rounding decides a row's bytes, the choice is a fixed rule of the machine class
(engine/kernels/machine_class.py) and the dtype, never a timing: the own kernel for bf16 on the classes of
OWN_PREFILL, SDPA elsewhere. On an AVX512-BF16 EPYC without AMX the own kernel ran 2.6-3.3x SDPA (causal, 32/8
heads of 128, S 256-1,024, docs/BENCHMARKS.md); on the AMX Xeon SDPA was the faster at every shape measured (small
test shapes, heads of 32-64); on AVX2, where SDPA's bf16 path has no bf16 instructions, the own kernel (not yet
measured against SDPA there)."""

from __future__ import annotations

import torch

from engine.kernels import own_attention
from engine.kernels.attention import attend
from engine.kernels.machine_class import kernel_class

KERNELS = ("sdpa", "own")
OWN_PREFILL = ("avx512", "avx2")  # machine classes whose bf16 prefill attention runs the own kernel


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            scale: float | None = None) -> torch.Tensor:
    """Prefill attention by the kernel `prefill_kernel` names: q [B, NH, S, D], k/v [B, KVH, T, D], mask
    [B, 1, S, T] -> [B, NH, S, D]; SDPA off the CPU and wherever the own kernel does not apply."""
    B, NH, _, D = q.shape
    if own_attention.supports_prefill(q, k) and prefill_kernel(q.dtype, B, NH, k.shape[1], D) == "own":
        return own_attention.prefill_attention(q, k, v, mask, scale)
    return attend(q, k, v, mask, scale)


def prefill_kernel(dtype: torch.dtype, batch: int, heads: int, kv_heads: int, head_dim: int) -> str:
    """"sdpa" or "own" for this dtype and shape on this machine class."""
    return "own" if dtype == torch.bfloat16 and kernel_class() in OWN_PREFILL else "sdpa"
