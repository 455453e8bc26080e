"""Python's cyclic garbage collector while blocks run.

A decode step allocates a few hundred Python objects (tensor wrappers, tuples, frames), so the collector runs its
youngest generation every few steps and now and then a full collection, which walks every object the process
holds: torch's, transformers' and the tokenizer's modules and the loaded model's, hundreds of thousands. On the
100m preset at 32 rows and one thread that was ~4 % of decode (perf: gc_collect_main and its visitors). None of
those objects turns into garbage while blocks run, so `frozen_objects` moves them into the collector's permanent
generation (gc.freeze) for that time: its collections then walk only what the blocks themselves allocate. After
the last block they go back to it (gc.unfreeze). A process that froze objects itself keeps its own arrangement:
nothing is frozen or unfrozen then."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # blocks running (engines in several threads share the one collector)
_froze = False  # whether the outermost frozen_objects froze (and so unfreezes)


@contextmanager
def frozen_objects() -> Iterator[None]:
    """The objects alive on entry kept out of the collector's walks until the last concurrent exit."""
    global _depth, _froze
    with _lock:
        if _depth == 0:
            _froze = gc.get_freeze_count() == 0
            if _froze:
                gc.freeze()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _froze:
                gc.unfreeze()
