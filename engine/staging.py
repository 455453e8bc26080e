"""Reused host staging buffers for copies that cross PCIe on a side stream.

A strided host tensor (a slice of the KV cache up to the current slot) copied to the GPU as it is goes through
a pageable temporary, synchronously. Gathered first into a contiguous pinned buffer, it crosses asynchronously
on a side stream. The buffers are few and reused in turn; the host refills one only after the copy that last
read it has finished (its event), so a buffer is never rewritten under a copy in flight."""

from __future__ import annotations

import torch

from engine.streams import synchronize

STAGING_BUFFERS = 4  # K and V of two fetches: the host gathers the next while the previous one crosses


class StagingRing:
    """STAGING_BUFFERS flat host buffers (pinned by `host_empty` with CUDA), grown to the largest request."""

    def __init__(self, host_empty, count: int = STAGING_BUFFERS):
        self._host_empty = host_empty
        self.buffers: list[torch.Tensor | None] = [None] * count
        self.events: list = [None] * count
        self._next = 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, torch.Tensor]:
        """The next buffer in turn as a contiguous tensor of `shape`, once the copy that last read it is done."""
        i = self._next
        self._next = (i + 1) % len(self.buffers)
        synchronize(self.events[i])
        self.events[i] = None
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        buf = self.buffers[i]
        if buf is None or buf.numel() < nbytes:
            buf = self.buffers[i] = self._host_empty((nbytes,), torch.uint8)
        return i, buf[:nbytes].view(dtype).view(shape)

    def read_by(self, i: int, event) -> None:
        """Buffer i is being read by the copy that completes with `event`."""
        self.events[i] = event

    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers if b is not None)
