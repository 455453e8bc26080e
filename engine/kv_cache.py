"""A preallocated KV cache for one batch: per layer, K and V of shape [B, KVH, max_len, D]."""

from __future__ import annotations

import torch

from engine.cpu_attention import attention, keep_rows


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
        (one query: chunked online-softmax attention, faster here than SDPA's decode path)."""
        k_all, v_all = self.update(layer, k_new, v_new, start)
        return attention(q, k_all, v_all, mask, scale)

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
