"""engine/batching.py: how rows become blocks, engine calls and shards, and the block length the planner prices."""

from engine.batching import (
    BLOCKS_PER_CALL,
    BLOCKS_PER_SHARD,
    MAX_NEW_GROUP,
    MIN_CONTEXT,
    block_gen_length,
    blocks,
    call_rows,
    context_blocks,
    shard_rows,
)
from engine.loop.row_state import RowState
from engine.request import Request, SamplingParams


def _row(length: int, max_new: int) -> RowState:
    return RowState(Request("x", "", SamplingParams(max_new_tokens=max_new), prompt_ids=(1,) * length), [1] * length,
                    ())


def test_blocks_without_refill_group_rows_by_max_new_tokens_then_prompt_length():
    """MAX_NEW_GROUP blocks' worth of rows of the smallest max_new_tokens first, each group by prompt length."""
    rows = [_row(length=1 + (7 * i) % 16, max_new=1 + i % 4) for i in range(16)]
    grouped = blocks(list(enumerate(rows)), block_size=2, refill=False)
    assert MAX_NEW_GROUP == 4 and [len(b) for b, waiting in grouped] == [2] * 8
    assert all(waiting == [] for _, waiting in grouped)
    order = [row for block, _ in grouped for _, row in block]
    first, second = order[:8], order[8:]
    assert {r.req.params.max_new_tokens for r in first} == {1, 2} and {r.req.params.max_new_tokens for r in second} == {3, 4}
    for group in (first, second):
        assert [len(r.prompt_ids) for r in group] == sorted(len(r.prompt_ids) for r in group)


def test_with_refill_one_block_of_the_longest_prompts_and_the_rest_waiting_longest_first():
    rows = [_row(length=n, max_new=4) for n in (3, 9, 1, 7, 5)]
    [(block, waiting)] = blocks(list(enumerate(rows)), block_size=2, refill=True)
    assert [len(r.prompt_ids) for _, r in block] == [9, 7]
    assert [len(r.prompt_ids) for _, r in waiting] == [5, 3, 1]
    assert blocks([], block_size=2, refill=True) == []


def test_every_row_is_in_exactly_one_block():
    rows = list(enumerate(_row(length=1 + i % 5, max_new=1 + i % 3) for i in range(23)))
    for refill in (False, True):
        grouped = blocks(rows, block_size=4, refill=refill)
        seen = sorted(n for block, waiting in grouped for n, _ in block + waiting)
        assert seen == list(range(23))


def test_a_worker_calls_with_one_block_until_a_block_is_measured():
    assert call_rows(block_size=8, measured_rows=0) == 8
    assert call_rows(block_size=8, measured_rows=7) == 8
    assert call_rows(block_size=8, measured_rows=8) == 8 * BLOCKS_PER_CALL


def test_a_derived_shard_holds_a_few_blocks_and_at_most_a_workers_share():
    assert shard_rows(total_rows=10_000, block_size=16, workers=2) == 16 * BLOCKS_PER_SHARD
    assert shard_rows(total_rows=50, block_size=16, workers=2) == 25
    assert shard_rows(total_rows=0, block_size=16, workers=1) == 1


def test_a_block_runs_about_the_largest_max_new_tokens_of_its_group():
    """Without refill a block runs until its last row ends, and blocks come from groups of MAX_NEW_GROUP blocks'
    rows of similar max_new_tokens: a call of BLOCKS_PER_CALL blocks has four such groups, so a block runs about
    its group's largest max_new_tokens, not the rows' mean."""
    assert BLOCKS_PER_CALL // MAX_NEW_GROUP == 4
    assert block_gen_length([80, 10, 70, 20, 60, 30, 50, 40]) == (20 + 40 + 60 + 80) / 4
    assert block_gen_length([256] * 9) == 256
    assert block_gen_length([5, 9]) == 7  # fewer rows than groups: each row its own


def _scoring(ids) -> RowState:
    return RowState(Request("x", "", SamplingParams(max_new_tokens=1), prompt_ids=tuple(ids)), list(ids), ())


def _questions(n: int, choices: int, context: int, own: int = 1) -> list[RowState]:
    """n questions' rows: each question's context (its own tokens) before each of its choices."""
    return [_scoring([10 + q] * context + [100 + c] * own) for q in range(n) for c in range(choices)]


def test_scoring_rows_sharing_a_context_form_blocks_of_their_own():
    """The choices of a question (one token asked for, a long context in common) are blocks of their own, cut at
    the block size; generation rows and scoring rows without such a context are blocked by length as before."""
    rows = _questions(3, 4, MIN_CONTEXT) + [_row(length=20, max_new=4) for _ in range(5)] + [_scoring([7, 8, 9])]
    grouped = blocks(list(enumerate(rows)), block_size=3, refill=False, contexts=True)
    assert sorted(n for block, _ in grouped for n, _ in block) == list(range(len(rows)))
    question_blocks = [{n // 4 for n, _ in block} for block, _ in grouped[:6]]
    assert question_blocks == [{0}, {0}, {1}, {1}, {2}, {2}] and [len(b) for b, _ in grouped[:6]] == [3, 1] * 3
    assert all(n >= 12 for block, _ in grouped[6:] for n, _ in block)
    mixed = blocks(list(enumerate(rows)), block_size=3, refill=False)  # contexts off: by length only
    assert any(len({n // 4 for n, _ in block if n < 12}) > 1 for block, _ in mixed)


def test_short_contexts_little_shared_or_one_context_for_all_are_not_grouped():
    """A context under MIN_CONTEXT tokens, one that is less than half of its rows' tokens, and one that every
    scoring row shares (blocks by length share it already) leave the rows to the blocks by length."""
    for rows in (_questions(3, 4, MIN_CONTEXT - 1), _questions(3, 4, MIN_CONTEXT, own=2 * MIN_CONTEXT),
                 _questions(1, 8, MIN_CONTEXT)):
        grouped, rest = context_blocks(list(enumerate(rows)), block_size=4)
        assert grouped == [] and len(rest) == len(rows)
