"""Keeping the C heap from holding memory the engine has freed.

While a model loads, quantizing a layer frees its full-precision copy and temporaries, but glibc keeps freed heap
memory, and the compressed layers allocated in between pin it: `release_freed_memory` trims after each layer.

While a block runs, its large temporaries (a prefill's attention, norm and MLP intermediates, megabytes each)
land in the heap too: glibc serves a block of 128 KiB or more with mmap only until one such block is freed, and
then raises that threshold to the freed size (up to 32 MiB). In the heap they fragment it: holes that the next
temporaries do not fit, and free memory above a live block, which the heap cannot give back. Under a binding
memory limit that slack is what kills: the same plan's peak varies from run to run by the heap's free holes.
There `choose_heap` has every block of LARGE_BLOCK_BYTES or more mmapped (given back when freed, so the peak is
what the tensors take), at the cost of faulting fresh pages in (`flexbatch bench engine`, line "heap", measures
the cost; docs/BENCHMARKS.md has the figures). A higher threshold does not bound that peak.

Elsewhere the opposite pays: above 32 MiB glibc always mmaps, so a long prefill's layer-sized temporaries
(hundreds of MiB per layer) would be mapped, faulted in page by page (zeroed by the kernel) and unmapped again at
every layer. There `choose_heap` has glibc serve every block from the heap and keep what is freed there, reused
without faulting it in again, for a few percent more peak RSS.

oneDNN holds memory of its own: it keeps every primitive it made (up to 1,024), each with its scratchpad, and a
GEMM over a weight it has not reordered (a layer read from disk, a routed expert, whose row count changes from
step to step) makes one per shape. Measured on a Mixtral-shaped mixture read from disk (8 experts of 22 MiB,
bf16, 32 rows): peak RSS 834 MiB with the default cache, 712 MiB with 16 primitives kept, 670 MiB with none. Under
a binding limit `choose_heap` keeps ONEDNN_PRIMITIVES (the resident layers' reordered GEMMs, a few shapes a layer,
stay cached); it takes effect only where oneDNN has made no primitive yet in this process (the variable is read
once), and a value the user set is kept."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from functools import cache

log = logging.getLogger(__name__)
LARGE_BLOCK_BYTES = 4 << 20
ONEDNN_PRIMITIVES = 16  # oneDNN primitives kept under a binding limit
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # glibc's mallopt parameters (malloc.h)
KEEP_FREED = 2**31 - 1  # M_TRIM_THRESHOLD, bytes of free heap top kept (mallopt takes an int)
_GLIBC_MMAP_MAX, _GLIBC_TRIM_THRESHOLD = 65536, 128 << 10  # glibc's own M_MMAP_MAX and M_TRIM_THRESHOLD


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
    and never raises that threshold (mallopt M_MMAP_THRESHOLD), and gives back free memory at the heap's top
    past glibc's own 128 KiB (undoing `reuse_freed_blocks`); whether it could be set."""
    libc = _libc()
    return libc is not None and all(libc.mallopt(param, value) for param, value in (
        (_M_MMAP_MAX, _GLIBC_MMAP_MAX), (_M_TRIM_THRESHOLD, _GLIBC_TRIM_THRESHOLD), (_M_MMAP_THRESHOLD, int(nbytes))))


def reuse_freed_blocks() -> bool:
    """From now on glibc serves every block from the heap (M_MMAP_MAX 0; a thread's arena still maps what its
    heap cannot hold) and keeps freed memory at the heap's top (M_TRIM_THRESHOLD), so freed blocks are reused
    without being faulted in again; whether it could be set. `release_freed_memory` still gives memory back."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, KEEP_FREED))


def choose_heap(room) -> str | None:
    """The C heap's policy for this process, from its memory room (an engine.memory.room.MemoryRoom): under a
    binding limit (`room.limit_binds`: the kernel kills at the cgroup's limit) `mmap_large_blocks`, so that the
    peak is what the tensors take, not that plus the heap's holes, and oneDNN keeps ONEDNN_PRIMITIVES primitives;
    elsewhere `reuse_freed_blocks`, so that large temporaries are not faulted in afresh at every layer. Which it
    set ("mmap-large", "reuse"), None if neither."""
    if room.limit_binds:
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_PRIMITIVES))
        if not mmap_large_blocks():
            return None
        log.info("a memory limit binds: allocations of %d MiB or more are mmapped, given back to the OS when freed",
                 LARGE_BLOCK_BYTES >> 20)
        return "mmap-large"
    return "reuse" if reuse_freed_blocks() else None
