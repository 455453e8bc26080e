"""Reused host staging buffers for copies that cross PCIe on a side stream.

A strided host tensor (a slice of the KV cache up to the current slot) copied to the GPU as it is goes through
a pageable temporary, synchronously. Gathered first into a contiguous pinned buffer, it crosses asynchronously
on a side stream. One fetch (K and V of a layer, with every part of a 4-bit cache) takes one set of buffers and
copies it under one event; the sets are few and reused in turn, and the host refills one only after the copies
that last read it have finished (its event), so a buffer is never rewritten under a copy in flight."""

from __future__ import annotations

import torch

from engine.memory.streams import synchronize

STAGING_SETS = 2  # the host gathers the next fetch while the previous one crosses


class StagingRing:
    """STAGING_SETS sets of flat host buffers (pinned by `host_empty` with CUDA), each grown to what it held."""

    def __init__(self, host_empty, count: int = STAGING_SETS):
        self._host_empty = host_empty
        self.sets: list[list[torch.Tensor]] = [[] for _ in range(count)]
        self.events: list = [None] * count
        self._next = 0

    def take(self, likes: list[torch.Tensor]) -> tuple[int, list[torch.Tensor]]:
        """The next set in turn, once the copies that last read it are done: one contiguous buffer of each
        tensor's shape and dtype."""
        i = self._next
        self._next = (i + 1) % len(self.sets)
        synchronize(self.events[i])
        self.events[i] = None
        bufs = self.sets[i]
        out = []
        for n, like in enumerate(likes):
            nbytes = like.numel() * like.element_size()
            if n == len(bufs):
                bufs.append(self._host_empty((nbytes,), torch.uint8))
            elif bufs[n].numel() < nbytes:
                bufs[n] = self._host_empty((nbytes,), torch.uint8)
            out.append(bufs[n][:nbytes].view(like.dtype).view(like.shape))
        return i, out

    def read_by(self, i: int, event) -> None:
        """Set i is being read by the copies that complete with `event`."""
        self.events[i] = event

    def nbytes(self) -> int:
        return sum(b.numel() for s in self.sets for b in s)
