"""CUDA streams and events behind one small interface that is a no-op without CUDA.

The engine computes on the current stream and moves data on side streams: `weights` (the next layer's weights
and their decompression) and `kv` (prefill's K/V stored to a pinned host cache). Ordering between streams uses
events, never a whole-device synchronize:

    side.wait(compute.record())   a side stream starts only after what the compute stream has queued so far
    compute.wait(side_event)      the compute stream uses a buffer only after the side stream has filled it
    event.synchronize()           the host reads a pinned buffer only after the copy into it has finished

On the CPU (or with the simulated gpu tier) every copy is synchronous, so each of these is a no-op."""

from __future__ import annotations

from contextlib import nullcontext

import torch


class Stream:
    """A CUDA stream, or nothing when `cuda` is False (then every method is a no-op)."""

    def __init__(self, cuda: bool, current: bool = False):
        self.cuda = cuda
        self._stream = (torch.cuda.current_stream() if current else torch.cuda.Stream()) if cuda else None

    def __enter__(self):
        """Make this the thread's current stream for the `with` body (kernels and copies queue on it)."""
        self._ctx = torch.cuda.stream(self._stream) if self.cuda else nullcontext()
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

    def record(self) -> torch.cuda.Event | None:
        """An event that completes when everything queued on this stream so far has run."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(self._stream)
        return event

    def wait(self, event: torch.cuda.Event | None) -> None:
        """Work queued on this stream from now on waits for `event` (the host does not wait)."""
        if self.cuda and event is not None:
            self._stream.wait_event(event)


def synchronize(event: torch.cuda.Event | None) -> None:
    """The host waits for `event` (no-op for None)."""
    if event is not None:
        event.synchronize()


def current(cuda: bool) -> Stream:
    """The calling thread's current stream (the compute stream of the main thread)."""
    return Stream(cuda, current=True)
