"""Keeping the C heap from holding memory the engine has freed.

While a model loads, quantizing a layer frees its full-precision copy and temporaries, but glibc keeps freed heap
memory, and the compressed layers allocated in between pin it (measured on the 110M Llama: RSS added by an int4
load +498 MiB untrimmed, +198 MiB trimmed after each layer, float32 +424 MiB): `release_freed_memory`.

While a block runs, its large temporaries (a prefill's attention, norm and MLP intermediates, megabytes each)
land in the heap too: glibc serves a block of 128 KiB or more with mmap only until one such block is freed, and
then raises that threshold to the freed size (up to 32 MiB). In the heap they fragment it: holes that the next
temporaries do not fit, and free memory above a live block, which the heap cannot give back. Under a binding
memory limit that slack is what kills: the same plan (the demo model, a 512-row block) peaked between 400 and
510 MiB from run to run, the heap holding 80-190 MiB free at the peak, and a 500 MiB group killed it about one
run in six to ten. There `bound_heap` has every block of LARGE_BLOCK_BYTES or more mmapped (given back when
freed). Elsewhere glibc's default stays: it reuses freed heap memory without faulting it in again, which is
faster (engine.models.by_rows keeps a prefill's temporaries small enough for it)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from functools import cache

log = logging.getLogger(__name__)
LARGE_BLOCK_BYTES = 4 << 20  # the demo plan's peak varied by 4-10 MiB with this, by ~90 MiB with 8 MiB
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


@cache
def _libc():
    """glibc, or None where the C library is another (musl, macOS: no malloc_trim, other mallopt numbers)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_freed_memory() -> None:
    """glibc's malloc_trim(0): free heap pages go back to the OS (a no-op where the C library has none)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def mmap_large_blocks(nbytes: int = LARGE_BLOCK_BYTES) -> bool:
    """From now on glibc serves every block of `nbytes` or more with its own mmap, freed straight back to the OS,
    and never raises that threshold (mallopt M_MMAP_THRESHOLD); whether it could be set."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, int(nbytes)))


def bound_heap(room) -> bool:
    """Under a binding memory limit (`room.limit_binds`, an engine.memory_room.MemoryRoom: the kernel kills at the
    cgroup's limit), `mmap_large_blocks`, so that the process's peak is what its tensors take, not that plus the
    heap's holes; whether it did."""
    if not room.limit_binds or not mmap_large_blocks():
        return False
    log.info("a memory limit binds: allocations of %d MiB or more are mmapped, given back to the OS when freed",
             LARGE_BLOCK_BYTES >> 20)
    return True
