"""`flexbatch bench engine`, line 8 ("heap"): the engine's two C heap policies (engine/memory/heap.py `choose_heap`) on
one block: under a binding memory limit every allocation of LARGE_BLOCK_BYTES or more mmapped (fresh pages,
faulted in on first touch, given back when freed), elsewhere every block served from the heap and freed memory
kept there (reused without faulting it in again). One engine, the policy set again before each call, the two
interleaved call by call. glibc's own default (a rising threshold) cannot be restored in a process, so this line
runs last."""

from __future__ import annotations

from pathlib import Path

from engine.engine import Engine
from engine.memory.heap import LARGE_BLOCK_BYTES, mmap_large_blocks, release_freed_memory, reuse_freed_blocks
from engine.policy import Policy
from jobs.bench.report import Line
from jobs.bench.runs import DTYPE, engine_runner, generations


def heap_line(model_dir: Path, prompts, block: tuple[int, int], gen_len: int, repeats: int) -> Line:
    eng = Engine.load(model_dir, dtype=DTYPE, policy=Policy())
    run = engine_runner(eng, prompts, *block)

    def under(policy):
        def call(n: int) -> int:
            policy()
            release_freed_memory()  # each call starts from a heap without the other policy's free pages
            return run(n)

        return call

    res = generations({"mmapped": under(mmap_large_blocks), "heap": under(reuse_freed_blocks)}, gen_len, repeats)
    what = (f"block {block[0]}x{block[1]}: allocations of {LARGE_BLOCK_BYTES >> 20} MiB or more mmapped (under a "
            "binding memory limit) vs every block from the heap, freed memory kept there (without one)")
    return Line("heap", what, "tokens/s", res["mmapped"]["tokens_per_s"], res["heap"]["tokens_per_s"], None,
                {"block": block, "runs": res})
