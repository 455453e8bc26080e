"""How rows become blocks, engine calls and shards, decided here once: the engine forms its blocks (`blocks`), a
worker sizes each engine call (`call_rows`), the driver sizes the shards it hands out (`shard_rows`), and the
planner prices how long a block generates as the engine will form it (`block_gen_length`). A rule changed here
changes all four, so the planner's predictions follow the engine's grouping.

A block is `gbs * num_gb` rows that go through every layer together (FlexGen's zig-zag schedule). Without refill a
block runs until its last row ends, so rows of similar max_new_tokens share a block; within such a group, rows of
similar prompt length share a block (less padding). With refill a finished row's slot takes a waiting row.

Rows that only score (one token asked for: no decode step) and share a long context with some other rows of the
call, as the choices of a multiple-choice question do, form blocks of their own, so that each block's shared prefix
(engine/loop/shared_prefix.py) is their context, computed once (`context_blocks`), where the weights stay in CPU
memory (with weights streamed per block, a small block would pay a whole model's traffic)."""

from __future__ import annotations

import math

from engine.loop.shared_prefix import shared_length

# Without refill, blocks come from groups of this many blocks' rows of similar max_new_tokens (0: one group, blocks
# by prompt length alone); measured by the W4 line of `flexbatch bench engine`.
MAX_NEW_GROUP = 4
# Blocks' worth of rows a worker hands the engine per call once a block has been measured: large enough for the
# engine to group rows by length, small enough that a shard's progress is logged often.
BLOCKS_PER_CALL = 16
# Scoring rows form blocks of their own (`context_blocks`) where they share at least this many leading tokens and
# those are at least half of their tokens: a block of a few rows then computes its context once instead of once per
# row (measured: 16 questions x 4 one-token choices after 600-token contexts, bf16, 110M: 9.5 s vs 29.9 s in blocks
# mixing questions), and a smaller block than planned costs no weight traffic when little is left to share.
MIN_CONTEXT = 128
# A shard the driver derives holds up to this many planned blocks: rows are grouped by length within a shard only,
# so a bigger shard pads less; a smaller one loses less work to a crash.
BLOCKS_PER_SHARD = 8


def blocks(ready: list, block_size: int, refill: bool, contexts: bool = False) -> list[tuple[list, list]]:
    """(block, waiting rows) pairs over `ready`, a list of (index, RowState). Without refill, no waiting rows, and
    blocks of rows of similar max_new_tokens, taken MAX_NEW_GROUP blocks at a time and sorted by prompt length
    within; with `contexts` (prefix sharing on, and weights that stay where they compute: `Policy.weights_stay`, as
    a block streamed from disk or to a GPU pays its weight traffic however few rows it holds), scoring rows sharing
    a context first (`context_blocks`). With refill, one block of
    the longest prompts, every other row waiting (longest first, so that each fits before the shared cursor of the
    slot it takes)."""
    if refill:
        ready = sorted(ready, key=lambda item: -len(item[1].prompt_ids))
        return [(ready[:block_size], ready[block_size:])] if ready else []
    grouped, ready = context_blocks(ready, block_size) if contexts else ([], ready)
    return grouped + length_blocks(ready, block_size)


def context_blocks(ready: list, block_size: int) -> tuple[list[tuple[list, list]], list]:
    """(blocks of scoring rows that share a context, the other rows). Scoring rows (max_new_tokens 1) in token
    order; a run of them whose common start (that of its first and last row, in that order) is MIN_CONTEXT tokens
    or more, leaving each row a token of its own, and at least half of the run's tokens, is cut into blocks of up to
    block_size rows. Nothing is grouped where all the scoring rows share one such start: blocks by length share it
    as well."""
    scoring = sorted((item for item in ready if item[1].req.params.max_new_tokens == 1),
                     key=lambda item: tuple(item[1].prompt_ids))
    if len(scoring) < 2 or common_start(scoring[0], scoring[-1]) >= MIN_CONTEXT:
        return [], ready
    grouped, taken, i = [], set(), 0
    while i < len(scoring):
        j = i + 1
        while j < len(scoring) and common_start(scoring[i], scoring[j]) >= MIN_CONTEXT:
            j += 1
        run, shared = scoring[i:j], common_start(scoring[i], scoring[j - 1])
        if len(run) > 1 and 2 * (len(run) - 1) * shared >= sum(len(row.prompt_ids) for _, row in run):
            grouped += [(run[k : k + block_size], []) for k in range(0, len(run), block_size)]
            taken.update(n for n, _ in run)
        i = j
    return grouped, [item for item in ready if item[0] not in taken]


def common_start(a: tuple, b: tuple) -> int:
    """Leading tokens two (index, RowState) items share as a block would (engine.loop.shared_prefix.shared_length:
    each row keeps a token of its own; 0 under MIN_SHARED, which MIN_CONTEXT exceeds)."""
    return shared_length([a[1].prompt_ids, b[1].prompt_ids])


def length_blocks(ready: list, block_size: int) -> list[tuple[list, list]]:
    """Blocks of rows of similar max_new_tokens, MAX_NEW_GROUP blocks' worth at a time, by prompt length within."""
    ready = sorted(ready, key=lambda item: (item[1].req.params.max_new_tokens, len(item[1].prompt_ids)))
    group = block_size * MAX_NEW_GROUP if MAX_NEW_GROUP else len(ready)
    ready = [item for g in range(0, len(ready), group)
             for item in sorted(ready[g : g + group], key=lambda item: len(item[1].prompt_ids))]
    return [(ready[i : i + block_size], []) for i in range(0, len(ready), block_size)]


def call_rows(block_size: int, measured_rows: int) -> int:
    """Rows of a worker's next engine call: one block until a block's worth of rows has finished (so the
    generation length is measured early and refill chosen from it), then BLOCKS_PER_CALL blocks."""
    return block_size * (BLOCKS_PER_CALL if measured_rows >= block_size else 1)


def shard_rows(total_rows: int, block_size: int, workers: int) -> int:
    """Rows per shard when the user gives none: up to BLOCKS_PER_SHARD blocks of the largest planned block, and no
    more than a worker's share of the rows."""
    per_worker = math.ceil(total_rows / max(1, workers))
    return max(1, min(block_size * BLOCKS_PER_SHARD, per_worker))


def block_gen_length(max_new_tokens: list[int]) -> float:
    """The tokens a block runs for without refill, as `blocks` forms them: until its last row ends, about the
    largest max_new_tokens of its group. A call of BLOCKS_PER_CALL blocks holds BLOCKS_PER_CALL / MAX_NEW_GROUP
    groups: the mean, over that many equal slices of the rows sorted by max_new_tokens, of each slice's largest."""
    ordered = sorted(max_new_tokens)
    groups = max(1, min(len(ordered), BLOCKS_PER_CALL // MAX_NEW_GROUP if MAX_NEW_GROUP else 1))
    return sum(ordered[(g + 1) * len(ordered) // groups - 1] for g in range(groups)) / groups
