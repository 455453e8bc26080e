"""The block executor's own rules (engine/loop/schedule.py), run directly on token ids: a block's rows finish
independently and left padding changes no row's tokens; each layer's weights are fetched once per step for the
whole block; each layer call gets the step's compute device and phase in its context; the step counts it
reports; a block gives back every tier reservation it made."""

import pytest
import torch

from engine.engine import Engine
from engine.loop.row_state import RowState
from engine.memory.placement import PlacedKV
from engine.policy import Policy
from engine.request import Request, SamplingParams

VARIANT = "llama_deep"  # five layers: a split by layers has layers on both sides


def _rows(lengths: list[int], max_new: list[int], eos_ids=()) -> list[RowState]:
    """Rows of distinct prompts (token ids) of the given lengths and max_new_tokens."""
    return [RowState(Request(f"r{i}", "", SamplingParams(max_new_tokens=n)),
                     [(7 * i + 3 * j) % 300 + 1 for j in range(L)], eos_ids)
            for i, (L, n) in enumerate(zip(lengths, max_new))]


def _load(checkpoint, policy: Policy, tmp_path, simulate_gpu: bool = False) -> Engine:
    return Engine.load(checkpoint(VARIANT), dtype="float32", policy=policy, simulate_gpu=simulate_gpu,
                       offload_dir=tmp_path, tokenizer=False)


def _alone(executor, row: RowState) -> list[int]:
    """The tokens of `row`'s request and prompt run as a block of its own."""
    return _run(executor, [RowState(row.req, list(row.prompt_ids), ())])[0].tokens


def _run(executor, rows: list[RowState], waiting: list[RowState] | None = None) -> list[RowState]:
    with torch.inference_mode():
        executor.run_block(rows, waiting)
    return rows


@pytest.fixture
def engine(checkpoint, tmp_path, one_thread):
    eng = _load(checkpoint, Policy(gbs=2, num_gb=3), tmp_path)
    yield eng
    eng.weights.close()


def test_rows_finish_independently_and_padding_changes_no_tokens(engine):
    """Rows of one block (three GPU batches, prompts of 3 to 9 tokens left-padded to 9) each stop at their own
    max_new_tokens or EOS, with the tokens each computes alone (no padding, no neighbours)."""
    lengths, max_new = [3, 9, 5, 7, 4], [1, 7, 3, 5, 2]
    executor = engine.executor()
    alone = [_alone(executor, row) for row in _rows(lengths, max_new)]
    assert [len(t) for t in alone] == max_new
    eos = alone[1][2]  # row 1's third token ends it; rows that never choose it run to their length
    block = _run(executor, _rows(lengths, max_new, eos_ids=(eos,)))
    for row, want in zip(block, alone):
        end = want.index(eos) + 1 if eos in want else len(want)
        assert row.tokens == want[:end]
        assert row.finish == ("eos" if eos in want else "length")
    assert block[1].finish == "eos" and len(block[1].tokens) == 3


def test_a_layer_is_fetched_once_per_step_for_the_whole_block(engine, monkeypatch):
    """Zig-zag: per step, layers 0..L-1 are fetched once each and reused by every GPU batch of the block; the
    next layer (after the last, the first) is prefetched."""
    fetched, prefetched, get, prefetch = [], [], engine.weights.get, engine.weights.prefetch
    monkeypatch.setattr(engine.weights, "get", lambda j, dev: fetched.append(j) or get(j, dev))
    monkeypatch.setattr(engine.weights, "prefetch", lambda j, dev: prefetched.append(j) or prefetch(j, dev))
    executor, steps, L = engine.executor(), 4, engine.spec.num_layers
    _run(executor, _rows([5, 6, 4, 6, 3, 5], [steps] * 6))  # three GPU batches of two rows
    assert executor.counts["steps"] == steps
    assert fetched == list(range(L)) * steps
    assert prefetched == [(j + 1) % L for j in range(L)] * steps


def test_each_layer_call_gets_its_device_and_phase(checkpoint, tmp_path, one_thread, monkeypatch):
    """A split policy: in prefill layers below 2 compute on the CPU, in decode below 3; every layer call's
    context says where it computes and in which phase, and the cache's attention is told the same."""
    policy = Policy(gbs=2, num_gb=2, prefill_device="split", prefill_split_layer=2, decode_device="split",
                    decode_split_layer=3)
    eng = _load(checkpoint, policy, tmp_path, simulate_gpu=True)
    calls, attends, layer, attend = [], [], eng.model.layer, PlacedKV.attend

    def spy(w, h, ctx, j):
        calls.append((ctx.phase, j, ctx.device, h.shape[1]))
        return layer(w, h, ctx, j)

    def attend_spy(self, layer, *args, device, phase, **kw):
        attends.append((phase, layer, device))
        return attend(self, layer, *args, device=device, phase=phase, **kw)

    monkeypatch.setattr(eng.model, "layer", spy)
    monkeypatch.setattr(PlacedKV, "attend", attend_spy)
    rows = _run(eng.executor(), _rows([4, 6, 5, 3], [3] * 4))
    assert all(r.finish == "length" for r in rows)
    L, S = eng.spec.num_layers, 6
    want = [("prefill", j, "gpu" if j >= 2 else "cpu", S) for j in range(L) for _ in range(2)]
    want += [("decode", j, "gpu" if j >= 3 else "cpu", 1) for _ in range(2) for j in range(L) for _ in range(2)]
    assert calls == want
    assert attends == [c[:3] for c in want]
    eng.weights.close()


def test_refilled_rows_prefill_in_the_decode_layer_pass(checkpoint, tmp_path, one_thread, monkeypatch):
    """With refill, a finished row's slot takes a waiting row: its prefill runs in the same layer pass as the
    batch's decode, right after it, on the same device, with its own prefill context; the executor counts it."""
    eng = _load(checkpoint, Policy(gbs=2, num_gb=1, refill=True), tmp_path)
    calls, layer = [], eng.model.layer

    def spy(w, h, ctx, j):
        calls.append((ctx.phase, j, ctx.device))
        return layer(w, h, ctx, j)

    monkeypatch.setattr(eng.model, "layer", spy)
    executor, waiting = eng.executor(), _rows([3, 4], [2, 2])
    entering = list(waiting)
    rows = _run(executor, _rows([5, 6], [1, 5]), waiting)
    assert not waiting and executor.counts["refilled_rows"] == 2
    L = eng.spec.num_layers
    prefill, decode = [("prefill", j, "cpu") for j in range(L)], [("decode", j, "cpu") for j in range(L)]
    with_refill = [c for j in range(L) for c in (("decode", j, "cpu"), ("prefill", j, "cpu"))]
    # row 0 ends at step 1 and a waiting row takes its slot at step 2; that row ends at step 3, the next one
    # enters at step 4; row 1 ends at step 5
    assert calls == prefill + with_refill + decode + with_refill + decode
    calls.clear()
    alone = eng.executor(Policy(gbs=1, num_gb=1))
    for row in rows + entering:
        assert row.finish == "length" and row.tokens == _alone(alone, row)


def test_counts_steps_and_the_rows_they_compute(engine):
    """`counts`: a step is one layer pass over the live GPU batches; `row_steps` counts the rows it computes. A
    finished row leaves its batch (here at once: it is half of a batch of two), and a finished batch leaves the
    step, so the rows computed are each row's own steps. Both accumulate over runs."""
    executor = engine.executor()
    max_new = [2, 5]
    _run(executor, _rows([4, 6], max_new))
    assert executor.counts["steps"] == max(max_new)
    assert executor.counts["row_steps"] == sum(max_new)
    assert executor.seconds["prefill"] > 0 and executor.seconds["decode"] > 0
    max_new2 = [3, 1, 4]  # two GPU batches: [3, 1] and [4]
    _run(executor, _rows([4, 6, 5], max_new2))
    assert executor.counts["steps"] == max(max_new) + max(max_new2)
    assert executor.counts["row_steps"] == sum(max_new) + sum(max_new2)


def test_a_gpu_batch_is_left_padded_with_its_cache_and_activations(engine):
    """A GPU batch is made with its KV cache and activations; its prompts end together at slot S-1, padded on
    the left with the pad id, which no row attends to; positions start at 0 on each row's first token; the first
    decode step writes slot S at each row's own next position."""
    executor = engine.executor()
    rows = _rows([2, 5, 3], [2, 2, 2])
    S, T, pad = 5, 7, engine.loaded.pad
    batch = executor._batch(rows, S, T)
    try:
        assert batch.kv is not None and batch.acts is not None and batch.phase == "prefill"
        ids, ctx = batch.context()
        assert ctx.phase == "prefill" and ctx.start == 0 and ctx.cache is batch.kv
        for b, r in enumerate(rows):
            L = len(r.prompt_ids)
            assert ids[b].tolist() == [pad] * (S - L) + r.prompt_ids
            assert ctx.positions[b].tolist() == [0] * (S - L) + list(range(L))
            assert not ctx.mask[b, 0, S - L :, : S - L].any()  # a prompt's tokens never see the padding
        batch.choose(torch.zeros(len(rows), engine.spec.vocab_size), None)
        ids, ctx = batch.context()
        assert batch.phase == "decode" and ctx.phase == "decode" and ctx.start == S
        assert ctx.positions.view(-1).tolist() == [len(r.prompt_ids) for r in rows]
        for b, r in enumerate(rows):
            assert ctx.mask[b, 0, 0].tolist() == [False] * (S - len(r.prompt_ids)) + [True] * (len(r.prompt_ids) + 1)
    finally:  # a batch made by hand: its reservations are given back here, as `run` does
        for tier, nbytes in executor._held:
            engine.devices.tiers[tier].release(nbytes)


def test_a_block_gives_back_every_tier_reservation(checkpoint, tmp_path, one_thread):
    """KV cache and activations split over the cpu and disk tiers (so that activations get buffers): after a
    block, and after a second one, every tier holds what it held before (the weights)."""
    policy = Policy(gbs=2, num_gb=2, cache_cpu=0.5, act_cpu=0.5)
    eng = _load(checkpoint, policy, tmp_path)
    before = {name: tier.used for name, tier in eng.devices.tiers.items()}
    executor = eng.executor()
    for _ in range(2):
        _run(executor, _rows([4, 6, 5, 3], [3, 2, 3, 1]))
        assert {name: tier.used for name, tier in eng.devices.tiers.items()} == before
    assert eng.devices.tiers["disk"].peak > before["disk"]  # the block did place its buffers there
    eng.weights.close()
