"""`flexbatch bench engine`, line 8 ("heap"): what keeping a block's large temporaries off the C heap costs, as an
engine does under a binding memory limit (engine/heap.py): every allocation of LARGE_BLOCK_BYTES or more mmapped
(fresh pages, faulted in on first touch, given back when freed) vs glibc's threshold at its ceiling (freed
blocks reused from the heap, where its own rising threshold ends up after a few large frees). One engine, the
threshold set again before each call, the two interleaved call by call. glibc's own rising threshold cannot be
restored in a process, so this line runs last."""

from __future__ import annotations

from pathlib import Path

from engine.generate import Engine
from engine.heap import LARGE_BLOCK_BYTES, mmap_large_blocks, release_freed_memory
from engine.policy import Policy
from jobs.bench.report import Line
from jobs.bench.runs import DTYPE, engine_runner, side_by_side

GLIBC_CEILING = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the highest its threshold rises


def heap_line(model_dir: Path, prompts, block: tuple[int, int], gen_len: int, repeats: int) -> Line:
    eng = Engine.load(model_dir, dtype=DTYPE, policy=Policy())
    run = engine_runner(eng, prompts, *block)

    def at(threshold: int):
        def call(n: int) -> int:
            mmap_large_blocks(threshold)
            release_freed_memory()  # each call starts from a heap without the other setting's free pages
            return run(n)

        return call

    res = side_by_side({"mmapped": at(LARGE_BLOCK_BYTES), "heap": at(GLIBC_CEILING)}, gen_len, repeats)
    mmap_large_blocks(GLIBC_CEILING)
    what = (f"block {block[0]}x{block[1]}: allocations of {LARGE_BLOCK_BYTES >> 20} MiB or more mmapped (under a "
            f"binding memory limit) vs reused from the heap (glibc's threshold at {GLIBC_CEILING >> 20} MiB)")
    return Line("heap", what, "tokens/s", res["mmapped"]["tokens_per_s"], res["heap"]["tokens_per_s"], None,
                {"block": block, "runs": res})
