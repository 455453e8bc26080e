"""Which path computes a Linear on the CPU: for a compressed weight, up to how many rows its kernel runs (calls of
more rows dequantize the weight and run the dense GEMM: engine/compression/qlinear.py); for a dense weight kept in
memory, whether it is reordered once for oneDNN (engine/kernels/onednn_dense.py).

The two paths round differently, so the choice decides a row's bytes: it is a fixed rule of the machine class
(engine/kernels/machine_class.py), the format, the compute dtype and the weight's shape, never of a timing. Every
node of one CPU kind, a rerun and a resume compute each row by the same path, whatever the load of the moment.
The crossovers measured per shape (engine/kernels/rates.py, `flexbatch profile`) price these paths in the planner
and are the evidence this table is set from; they never change which path runs.

MAX_ROWS, from those measurements:
  amx      bf16: oneDNN's AMX GEMM over the dequantized weight wins from a few dozen rows (4-bit up to 256 rows,
           int8 up to 64, over 60 shapes on a Sapphire Rapids Xeon, 1 and 2 threads); float32: the kernels win
           at every row count (the float32 GEMM has no AMX).
  avx512   the kernels win at every row count (own 4-bit 287 GFLOP/s vs bf16 188 at 1,024 rows on an EPYC Zen 4).
  avx2     the kernels win at every row count (no bf16 GEMM in hardware; the float32 GEMM ~100 GFLOP/s).
           bf16 weights at rest in a float32 run: the bf16 x float32 kernel up to 512 rows (1 thread, torch held
           to AVX2 on the AMX Xeon, against widening the weight + aten's GEMM: 28-33 GFLOP/s at 1 row against
           2.5, 107-117 against 97-100 at 256, 115 against 105-109 at 512; at 1,024 rows 110-114 against 115-118).
  scalar   aten's int4 kernel and int8 x int8 GEMM up to 64 rows (measured on the AMX Xeon without own kernels).
EVERY means every row count (qlinear runs the kernel on chunks of that many rows beyond it). bf16 weights at rest
are widened + the dense GEMM on every class but avx2 (the bf16 kernel is written for AVX2 alone)."""

from __future__ import annotations

import functools

import torch

from engine.kernels import onednn_dense
from engine.kernels.machine_class import kernel_class
from engine.kernels.rates import MIN_PACK_PARAMS, ROWS

EVERY = ROWS[-1]
MAX_ROWS = {  # (machine class, format, compute dtype) -> the largest row count the compressed kernel takes
    ("amx", "int4", torch.bfloat16): 256, ("amx", "int8", torch.bfloat16): 64,
    ("amx", "int4", torch.float32): EVERY, ("amx", "int8", torch.float32): EVERY,
    ("scalar", "int4", torch.bfloat16): 64, ("scalar", "int8", torch.bfloat16): 64,
    ("scalar", "int4", torch.float32): 64, ("scalar", "int8", torch.float32): 64,
    ("avx2", "bf16", torch.float32): 512, ("amx", "bf16", torch.float32): 0, ("avx512", "bf16", torch.float32): 0,
    ("scalar", "bf16", torch.float32): 0,
}


def max_rows(fmt: str, n: int, k: int, dtype: torch.dtype) -> int:
    """The largest row count at which a compressed weight [n, k] of `fmt` ("int4", "int8", "bf16") is computed by its
    kernel for `dtype` activations on this machine class (0: never); EVERY where the table has no entry."""
    wide = torch.float32 if dtype not in (torch.float32, torch.bfloat16) else dtype
    return MAX_ROWS.get((kernel_class(), fmt, wide), EVERY)


def packs_dense(w: torch.Tensor) -> bool:
    """Whether dense weight `w` is reordered for oneDNN: float32 and bfloat16 weights of at least MIN_PACK_PARAMS
    (below, the call costs more than the arithmetic), where this CPU can reorder the dtype at all (bfloat16 needs
    AVX512-BW or AVX-NE-CONVERT). Measured faster on every machine class here (1.1-1.8x geometric mean over the row
    counts for bf16 on the AMX Xeon, 1.1-1.5x for float32; 1.3-1.9x for float32 at 16-96 rows on an AVX2 EPYC)."""
    return w.dim() == 2 and packs_shape(w.shape[0], w.shape[1], w.dtype)


def packs_shape(n: int, k: int, dtype: torch.dtype) -> bool:
    """packs_dense's rule for a weight [n, k] of `dtype`."""
    return n * k >= MIN_PACK_PARAMS and dtype in (torch.float32, torch.bfloat16) and reorders(dtype)


@functools.cache
def reorders(dtype: torch.dtype) -> bool:
    """Whether oneDNN reorders and multiplies a `dtype` weight on this CPU (a property of its instruction set)."""
    try:
        onednn_dense.linear(torch.zeros(2, 64, dtype=dtype), onednn_dense.pack(torch.zeros(64, 64, dtype=dtype)))
    except RuntimeError:
        return False
    return True
