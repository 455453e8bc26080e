"""Preallocated KV caches for one batch: per layer, K and V of shape [B, KVH, max_len, D], plain (`KVCache`)
or 4-bit (`QuantKVCache`). Decode attention over them runs by the kernel its rule chooses
(`engine/kernels/decode_choice.py`); a prefill's by SDPA."""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.compression.int4 import DEFAULT_CONFIG, QuantConfig, dequantize, empty_qtensor, quantize
from engine.kernels.attention import attend
from engine.kernels.cpu_attention import attention
from engine.kernels.decode_choice import decode


class KVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype, alloc=None):
        """`alloc(shape, dtype)` makes each buffer (on a tier); uninitialized CPU tensors by default, which is
        safe because a slot is always written (prefill writes every slot of the padded prompt) before any
        attention reads it."""
        shape = (batch, kv_heads, max_len, head_dim)
        alloc = alloc or (lambda shape, dtype: torch.empty(shape, dtype=dtype))
        self.max_len = max_len
        self.k = [alloc(shape, dtype) for _ in range(num_layers)]
        self.v = [alloc(shape, dtype) for _ in range(num_layers)]

    def store(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, start: int, copy=torch.Tensor.copy_) -> int:
        """Write k_new/v_new [B, KVH, S, D] at slots [start, start+S) with `copy(dst, src)`; bytes written."""
        end = start + k_new.shape[2]
        assert end <= self.max_len, (end, self.max_len)
        copy(self.k[layer][:, :, start:end], k_new)
        copy(self.v[layer][:, :, start:end], v_new)
        return 2 * k_new.numel() * self.k[layer].element_size()

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, start: int):
        """Write k_new/v_new [B, KVH, S, D] at slots [start, start+S); return K, V over slots [0, start+S)."""
        self.store(layer, k_new, v_new, start)
        end = start + k_new.shape[2]
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def attend(self, layer: int, q, k_new, v_new, start: int, mask, scale: float | None = None):
        """Store this step's K/V, then attend q [B, NH, S, D] over every slot so far -> [B, NH, S, D]
        (one query: the decode kernel `decode_choice` chooses)."""
        k_all, v_all = self.update(layer, k_new, v_new, start)
        return decode(q, k_all, v_all, mask, scale) if q.shape[2] == 1 else attention(q, k_all, v_all, mask, scale)

    def shift_slots(self, first: int, count: int) -> None:
        """Move slots [first, first+count) to [0, count) in every layer (refill reclaims the slots before the
        oldest live row; rotary positions are applied before K is stored, so moved keys keep their meaning)."""
        for t in self.k + self.v:
            t[:, :, :count].copy_(t[:, :, first : first + count].clone())

    def keep_rows(self, rows: list[int]) -> None:
        """Keep batch rows `rows` (ascending), moved to the front; the cache becomes views of its first
        len(rows) rows (the buffers stay allocated)."""
        for t in (self.k, self.v):
            t[:] = [keep_rows(x, rows) for x in t]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class QuantKVCache:
    """A preallocated 4-bit KV cache (groups along D), with KVCache's interface.

    `update` returns QTensor views over slots [0, end) that `attention` / `decode_attention` read lazily."""

    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype,
                 alloc=None, config: QuantConfig = DEFAULT_CONFIG):
        shape = (batch, kv_heads, max_len, head_dim)
        assert config.dim in (-1, 3), config
        self.max_len = max_len
        self.config = config
        self.k = [empty_qtensor(shape, dtype, config, alloc) for _ in range(num_layers)]
        self.v = [empty_qtensor(shape, dtype, config, alloc) for _ in range(num_layers)]

    def store(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, start: int, copy=torch.Tensor.copy_) -> int:
        """Quantize k_new/v_new [B, KVH, S, D] where they are, then write the codes, mins and scales into slots
        [start, start+S) with `copy(dst, src)` (only compressed bytes cross); bytes written."""
        end = start + k_new.shape[2]
        assert end <= self.max_len, (end, self.max_len)
        moved = 0
        for cache, new in ((self.k[layer], k_new), (self.v[layer], v_new)):
            q = quantize(new, self.config)
            for part in ("data", "mins", "scales"):
                copy(getattr(cache, part)[..., start:end], getattr(q, part))
            moved += q.nbytes
        return moved

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, start: int):
        """Quantize k_new/v_new [B, KVH, S, D] into slots [start, start+S); return lazy K, V over [0, end)."""
        self.store(layer, k_new, v_new, start)
        end = start + k_new.shape[2]
        return self.k[layer].row_slice(0, end), self.v[layer].row_slice(0, end)

    def dequantized(self, layer: int, end: int, dtype=None):
        """Full K, V [B, KVH, end, D] (strided views of K^T / V^T buffers), e.g. for a prefill's SDPA."""
        k, v = self.k[layer].row_slice(0, end), self.v[layer].row_slice(0, end)
        return dequantize(k, dtype=dtype), dequantize(v, dtype=dtype)

    def attend(self, layer: int, q, k_new, v_new, start: int, mask, scale=None):
        """Store this step's K/V in 4 bits, then attend. A prefill from slot 0 attends over the new K/V as
        computed (full precision); later steps read the 4-bit cache chunk by chunk."""
        k_all, v_all = self.update(layer, k_new, v_new, start)
        if start == 0:
            return attend(q, k_new, v_new, mask, scale)
        return decode(q, k_all, v_all, mask, scale) if q.shape[2] == 1 else attention(q, k_all, v_all, mask, scale)

    def shift_slots(self, first: int, count: int) -> None:
        """Move slots [first, first+count) to [0, count) in every layer (slots are the last dim of each part)."""
        for qt in self.k + self.v:
            for t in (qt.data, qt.mins, qt.scales):
                t[..., :count].copy_(t[..., first : first + count].clone())

    def keep_rows(self, rows: list[int]) -> None:
        """Keep batch rows `rows` (ascending), moved to the front (KVCache.keep_rows)."""
        for t in (self.k, self.v):
            t[:] = [replace(qt, data=keep_rows(qt.data, rows), mins=keep_rows(qt.mins, rows),
                            scales=keep_rows(qt.scales, rows), shape=(len(rows), *qt.shape[1:])) for qt in t]

    def nbytes(self) -> int:
        return sum(qt.nbytes for qt in self.k + self.v)


def keep_rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The first len(rows) rows of `x` (dim 0), holding rows `rows` (ascending) of x, written in place."""
    n = len(rows)
    if rows != list(range(n)):
        x[:n].copy_(x.index_select(0, torch.tensor(rows, device=x.device)))
    return x[:n]
