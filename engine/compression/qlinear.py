"""Compressed Linear weights as they compute: the compressed kernel up to the row count its rule names, a
dequantized copy and the dense GEMM above it.

The choice is per row count (rows = batch x tokens of the call, so decode and prefill choose apart): `max_rows`
is the largest row count the compressed kernel takes, a fixed rule of the machine class, format and dtype
(engine/kernels/gemm_choice.py); calls with more rows take the dense path, unless the kernel takes every row count
(`max_rows` at the largest row count measured): then int8 takes the call whole (`int8_linear` goes through
it in chunks of rows written into one output, nothing concatenated), and int4's kernel, built for decode-sized
rows, runs on chunks of that many rows. The dense copy is made on first need and kept for the rest of the step
(one dequantization per layer per step, as before), in buffers the weight store hands back when the next layer
is taken.

    int4   the project's 4-bit x int8 kernel (engine/kernels/int4_tiles.py) where it is built, else aten's packed
           int4 GEMM (`_weight_int4pack_mm_for_cpu`), for layers packed once at load
    int8   int8 x int8 GEMM with activations quantized per row: the project's kernel over its tiles for layers
           packed once at load (engine/kernels/int8_tiles.py) or over the codes as stored for layers read anew
           (engine/kernels/int8_rows.py), else PyTorch's (`engine/compression/int8.py`)
    bf16   bfloat16 weights of a float32 run (weights at rest): the project's bf16 x float32 kernel over its tiles
           (engine/kernels/bf16_tiles.py) for layers packed once at load, else widened to float32 + the dense GEMM"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.compression.int4 import Int4Packed
from engine.compression.int8 import Int8Weight, dequantize_int8
from engine.kernels import bf16_tiles, int4_tiles, int8_rows, int8_tiles
from engine.kernels.bf16_tiles import Bf16Tiles
from engine.kernels.int4_tiles import Int4Tiles
from engine.kernels.int8_rows import Int8Rows
from engine.kernels.int8_tiles import Int8Tiles
from engine.kernels.rates import ROWS

LARGEST_MEASURED = ROWS[-1]


@dataclass(frozen=True)
class QWeight:
    """A compressed Linear weight as kept: `stored` (QTensor, Int8Weight or Bf16Weight) for the dense path, `fast`
    (the compressed kernel's operand, or None where there is none) and the row counts it serves (<= max_rows). A
    weight in the project's tiles (4-bit, int8 or bf16) keeps no stored form (None): its dense path dequantizes
    (or widens) the tiles."""

    stored: object
    fast: Int4Tiles | Int4Packed | Int8Tiles | Int8Rows | Int8Weight | Bf16Tiles | None
    max_rows: int


def kernel_layout_bytes(weights) -> int:
    """Bytes the int4 kernel's own layout keeps beside the stored codes, over a layer's weights (aten's layout; a
    weight kept in the project's tiles alone has no stored form beside them)."""
    return sum(_layout_bytes(w.fast) for w in weights if isinstance(w, QWeight) and w.stored is not None)


def _layout_bytes(fast) -> int:
    if isinstance(fast, Int4Tiles):
        return fast.nbytes
    if isinstance(fast, Int4Packed):
        return fast.weight.nbytes + fast.scales_and_zeros.nbytes
    return 0


def stored_bytes(weights) -> int:
    """Bytes of weights as kept: tensors at their size, QWeights at their stored form's or, kept in tiles alone,
    the tiles' (the int8 head), other kept forms (a weight reordered for oneDNN) at their `nbytes`."""
    return sum((w.fast if w.stored is None else w.stored).nbytes if isinstance(w, QWeight) else w.numel() * w.element_size()
               if isinstance(w, torch.Tensor) else w.nbytes for w in weights)


def one_call(w: QWeight, dtype: torch.dtype) -> QLinear:
    """A view of an int8 QWeight kept outside a layer (the head) for one call: a dense copy only if needed."""
    if w.stored is None:
        return QLinear(w, lambda: int8_tiles.dequantize(w.fast, dtype))
    return QLinear(w, lambda: dequantize_int8(w.stored, dtype))


@dataclass
class QLinear:
    """One step's view of a QWeight: `dense()` dequantizes on first call, through `make_dense`; `gemm` computes the
    calls the kernel does not take over that dense copy."""

    weight: QWeight
    make_dense: Callable[[], torch.Tensor]
    gemm: Callable[..., torch.Tensor] = F.linear
    _dense: torch.Tensor | None = field(default=None, repr=False)

    def dense(self) -> torch.Tensor:
        if self._dense is None:
            self._dense = self.make_dense()
        return self._dense

    def uses_fast(self, rows: int) -> bool:
        return self.weight.fast is not None and rows <= self.weight.max_rows

    def takes_kernel(self, rows: int) -> bool:
        """Whether a call of `rows` rows runs the compressed kernel on all of them at once."""
        w = self.weight
        takes_any_rows = isinstance(w.fast, (Int8Tiles, Int8Rows, Int8Weight, Int4Tiles, Bf16Tiles))
        return self.uses_fast(rows) or (takes_any_rows and w.max_rows >= LARGEST_MEASURED)

    def __call__(self, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        rows, w = x.numel() // x.shape[-1], self.weight
        if self.takes_kernel(rows):
            y = _kernel(x, w.fast)
        elif w.fast is not None and w.max_rows >= LARGEST_MEASURED:  # still faster at the largest row count
            x2 = x.reshape(-1, x.shape[-1])  # measured: run the kernel on chunks of that many rows
            y = torch.cat([_kernel(c, w.fast) for c in x2.split(w.max_rows)]).view(*x.shape[:-1], -1)
        else:
            return self.gemm(x, self.dense(), b)
        return y if b is None else y.add_(b)


def _kernel(x: torch.Tensor,
            fast: Int4Tiles | Int4Packed | Int8Tiles | Int8Rows | Int8Weight | Bf16Tiles) -> torch.Tensor:
    if isinstance(fast, Bf16Tiles):
        return bf16_tiles.linear(x, fast)
    if isinstance(fast, Int8Tiles):
        return int8_tiles.linear(x, fast)
    if isinstance(fast, (Int8Rows, Int8Weight)):
        return int8_rows.fast_linear(x, fast)
    return int4_tiles.fast_linear(x, fast)
