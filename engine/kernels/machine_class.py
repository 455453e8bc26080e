"""The class of machine a kernel choice is made for: the instruction set the project's own kernels run with, and
whether the CPU multiplies bf16 in AMX tiles (oneDNN's dense bf16 GEMM then runs ~5x faster than on AVX-512 alone,
which moves every crossover against the compressed kernels).

    "amx"      own kernels on AVX-512, and the CPU reports amx_bf16 (a Sapphire Rapids or later Xeon)
    "avx512"   own kernels on AVX-512 without AMX (an AVX512-BF16/VNNI EPYC)
    "avx2"     own kernels on AVX2 (an AVX2-only EPYC, or FLEXBATCH_ISA=avx2 on a larger CPU)
    "scalar"   no own kernels (not built, FLEXBATCH_KERNELS=off, or FLEXBATCH_ISA=scalar): PyTorch's alone

Two nodes of one CPU kind are of one class, whatever their load; a pin of FLEXBATCH_ISA moves a node to the class
it names (the pin then runs on every node of a pool that is to agree)."""

from __future__ import annotations

import functools

from engine.dtypes import cpu_info
from engine.kernels import compiled

CLASSES = ("amx", "avx512", "avx2", "scalar")


def kernel_class() -> str:
    """This process's class now (read at each call: FLEXBATCH_ISA's pin may change the own kernels' set)."""
    mod = compiled.ops()
    isa = mod.isa() if mod is not None else "none"
    if isa == "avx512":
        return "amx" if _has_amx_bf16() else "avx512"
    return "avx2" if isa == "avx2" else "scalar"


@functools.cache
def _has_amx_bf16() -> bool:
    return "amx_bf16" in (cpu_info("flags") or "").split()
