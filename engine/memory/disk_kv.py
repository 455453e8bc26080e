"""A KV cache on the disk tier read and written with direct I/O, so that its pages never sit in the page cache.

A memory-mapped cache (engine/memory/offload.py) is page cache that a memory cgroup charges to the process and that
cgroup v1 kills at its limit rather than write back; this one lives in a scratch file opened with O_DIRECT and is
moved through two reused, 4 KiB-aligned buffers (K and V of one layer), with `engine.memory.kv_cache.KVCache`'s
interface. Per layer the file holds K then V, each token-major ([T, B, KVH, D]), so the slots [0, end) a decode
step attends over are one contiguous prefix: a step reads that prefix of K and of V, writes its new slot into
the buffers, attends over them, and writes back only the aligned blocks the new slot touches. Where O_DIRECT is
refused (tmpfs), the file is read and written buffered."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from engine.kernels.cpu_attention import attention
from engine.memory.disk_read import ALIGN, aligned_empty, aligned_size
from engine.memory.offload import scratch_file


class DirectKVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype,
                 offload_dir: str | Path | None = None):
        self.num_layers, self.max_len, self.batch, self.dtype = num_layers, max_len, batch, dtype
        self.slot_shape = (batch, kv_heads, head_dim)
        self.slot_bytes = batch * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        self.region = aligned_size(max_len * self.slot_bytes)  # one of K or V of one layer
        self.fd = scratch_file(offload_dir, direct=True)
        os.ftruncate(self.fd, 2 * num_layers * self.region)
        self.buffers = (aligned_empty(self.region), aligned_empty(self.region))  # K, V

    def __del__(self):
        fd = getattr(self, "fd", None)
        if fd is not None:
            os.close(fd)
            self.fd = None

    def _view(self, which: int) -> torch.Tensor:
        """Buffer `which` (0: K, 1: V) as [T, B, KVH, D]."""
        n = self.max_len * self.slot_bytes
        return self.buffers[which][:n].view(self.dtype).view(self.max_len, *self.slot_shape)

    def _io(self, layer: int, which: int, begin: int, end: int, write: bool) -> None:
        """Read or write bytes [begin, end) (aligned) of buffer `which` from or to its place in the file."""
        if end <= begin:
            return
        at = (2 * layer + which) * self.region
        view = memoryview(self.buffers[which][begin:end].numpy())
        done = 0
        while done < end - begin:
            moved = (os.pwritev if write else os.preadv)(self.fd, [view[done:]], at + begin + done)
            if moved <= 0:
                raise OSError(f"KV scratch file: {'wrote' if write else 'read'} {done} of {end - begin} bytes")
            done += moved

    def _span(self, start: int, end: int) -> tuple[int, int]:
        """The aligned bytes holding slots [start, end)."""
        return start * self.slot_bytes // ALIGN * ALIGN, aligned_size(end * self.slot_bytes)

    def _write_slots(self, layer: int, start: int, end: int, put, read: bool = True) -> None:
        """Slots [start, end) of K and V changed by put(k_view, v_view) ([T, B, KVH, D] views of the buffers):
        the aligned span is read first (with `read`), so the bytes it shares with other slots are kept."""
        begin, stop = self._span(start, end)
        for which in (0, 1):
            if read:
                self._io(layer, which, begin, stop, write=False)
        put(self._view(0), self._view(1))
        for which in (0, 1):
            self._io(layer, which, begin, stop, write=True)

    def store(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, start: int, copy=torch.Tensor.copy_) -> int:
        """Write k_new/v_new [B, KVH, S, D] at slots [start, start+S); bytes written."""
        end = start + k_new.shape[2]
        assert end <= self.max_len, (end, self.max_len)

        def put(k, v):
            copy(k[start:end].permute(1, 2, 0, 3), k_new)
            copy(v[start:end].permute(1, 2, 0, 3), v_new)

        self._write_slots(layer, start, end, put)
        return 2 * k_new.numel() * k_new.element_size()

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, start: int):
        """Read slots [0, start), write k_new/v_new [B, KVH, S, D] at [start, start+S) (back to the file too);
        return K, V [B, KVH, start+S, D], views of the buffers valid until the next call."""
        end = start + k_new.shape[2]
        assert end <= self.max_len, (end, self.max_len)
        stop = aligned_size(end * self.slot_bytes)
        for which in (0, 1):
            self._io(layer, which, 0, stop, write=False)
        k, v = self._view(0), self._view(1)
        k[start:end].permute(1, 2, 0, 3).copy_(k_new)
        v[start:end].permute(1, 2, 0, 3).copy_(v_new)
        begin = self._span(start, end)[0]
        for which in (0, 1):
            self._io(layer, which, begin, stop, write=True)
        return k[:end].permute(1, 2, 0, 3), v[:end].permute(1, 2, 0, 3)

    def attend(self, layer: int, q, k_new, v_new, start: int, mask, scale: float | None = None):
        """As KVCache.attend: store this step's K/V, then attend q [B, NH, S, D] over every slot so far."""
        k_all, v_all = self.update(layer, k_new, v_new, start)
        return attention(q, k_all, v_all, mask, scale)

    def shift_slots(self, first: int, count: int) -> None:
        """Move slots [first, first+count) to [0, count) in every layer."""
        for layer in range(self.num_layers):
            def put(k, v):
                for t in (k, v):
                    t[:count].copy_(t[first : first + count].clone())

            stop = aligned_size((first + count) * self.slot_bytes)
            for which in (0, 1):
                self._io(layer, which, 0, stop, write=False)
            self._write_slots(layer, 0, count, put, read=False)

    def keep_rows(self, rows: list[int]) -> None:
        """Keep batch rows `rows` (ascending): every layer is rewritten with those rows only (the file and the
        buffers keep their size)."""
        if rows == list(range(self.batch)):
            return
        full = aligned_size(self.max_len * self.slot_bytes)
        kept_shape = (len(rows), *self.slot_shape[1:])
        index = torch.tensor(rows)
        for layer in range(self.num_layers):
            for which in (0, 1):
                self._io(layer, which, 0, full, write=False)
                kept = self._view(which).index_select(1, index)
                n = kept.numel() * kept.element_size()
                self.buffers[which][:n].view(self.dtype).copy_(kept.reshape(-1))
                self._io(layer, which, 0, aligned_size(n), write=True)
        self.slot_bytes = self.slot_bytes // self.batch * len(rows)
        self.batch, self.slot_shape = len(rows), kept_shape

    def nbytes(self) -> int:
        return os.fstat(self.fd).st_size
