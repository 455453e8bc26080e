"""Refill: finished rows' slots take waiting rows inside the zig-zag loop. Greedy fp32 tokens equal a run
without refill row for row (and transformers' own), rows come back in input order, and fewer layer passes run."""

import dataclasses
import random

import pytest

from engine.engine import Engine
from engine.loop.refill import choose_refill
from engine.loop.row_state import RowState
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.engine.reference import PROMPTS, hf_greedy, hf_model

REFILL_POLICIES = {
    "cpu-2x2": Policy(gbs=2, num_gb=2, refill=True),
    "cpu-4bit-cache": Policy(gbs=3, num_gb=1, refill=True, compress_cache=True),
    "cache-cpu-disk": Policy(gbs=5, num_gb=1, refill=True, cache_cpu=0.5),
    "weights-disk": Policy(gbs=2, num_gb=2, refill=True, weight_cpu=0.0),
    "gpu-cache-3-tiers": Policy(gbs=4, num_gb=2, refill=True, cache_gpu=0.4, cache_cpu=0.4, act_gpu=0.5,
                                act_cpu=0.25, prefill_device="gpu", decode_device="gpu"),
    "split-both": Policy(gbs=3, num_gb=2, refill=True, prefill_device="split", prefill_split_layer=1,
                         decode_device="split", decode_split_layer=1, cache_gpu=0.5, cache_cpu=0.5),
}


def _requests(n: int = 24, seed: int = 0) -> list[Request]:
    """Prompts of varied length, per-row max_new_tokens, a stop string on a third of the rows."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = (PROMPTS[i % len(PROMPTS)] * rng.randint(1, 4))[:160]
        stop = ("e",) if i % 3 == 0 else ()
        out.append(Request(f"r{i}", prompt, SamplingParams(max_new_tokens=rng.randint(2, 30), stop=stop)))
    return out


@pytest.fixture(scope="module")
def plain_run(checkpoint):
    runs = {}

    def get(variant, policy: Policy):
        if (variant, policy) not in runs:
            engine = Engine.load(checkpoint(variant), dtype="float32", policy=policy)
            runs[variant, policy] = (engine.generate(_requests()), engine.schedule_counts["steps"])
        return runs[variant, policy]

    return get


@pytest.mark.parametrize("name", list(REFILL_POLICIES))
def test_refill_gives_the_tokens_of_a_run_without_it(checkpoint, plain_run, one_thread, tmp_path, name):
    policy = REFILL_POLICIES[name]
    engine = Engine.load(checkpoint("llama_gqa_llama3"), dtype="float32", policy=policy, simulate_gpu=True,
                         offload_dir=tmp_path)
    got = engine.generate(_requests())
    want, _ = plain_run("llama_gqa_llama3", Policy(gbs=4, num_gb=2, compress_cache=policy.compress_cache))
    assert [c.id for c in got] == [f"r{i}" for i in range(len(got))]
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [(c.text, c.finish_reason) for c in got] == [(c.text, c.finish_reason) for c in want]
    assert engine.schedule_counts["refilled_rows"] > 0
    engine.weights.close()


@pytest.mark.parametrize("variant", ["opt", "mistral_window", "qwen2"])
def test_refill_is_exact_across_families_and_shifts_the_cache(checkpoint, plain_run, one_thread, variant):
    engine = Engine.load(checkpoint(variant), dtype="float32", policy=Policy(gbs=5, num_gb=1, refill=True))
    got = engine.generate(_requests())
    want, plain_steps = plain_run(variant, Policy(gbs=5, num_gb=1))
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    counts = engine.schedule_counts
    assert counts["shifts"] > 0 and counts["refilled_rows"] >= len(got) - 5
    assert counts["steps"] < plain_steps  # the same 5 slots, kept busy: fewer layer passes than blocks (grouped)


def test_refill_matches_transformers(checkpoint, one_thread):
    model_dir = checkpoint("llama_gqa_llama3")
    engine = Engine.load(model_dir, dtype="float32", policy=Policy(gbs=2, num_gb=1, refill=True))
    reqs = [Request(str(i), p, SamplingParams(max_new_tokens=3 + 4 * i)) for i, p in enumerate(PROMPTS)]
    got = engine.generate(reqs)
    hf = hf_model(model_dir)
    for req, c in zip(reqs, got):
        assert c.token_ids == hf_greedy(hf, engine.tokenizer, req.prompt, req.params.max_new_tokens, engine.eos_ids)
    assert engine.schedule_counts["refilled_rows"] == len(reqs) - 2


def _row(length: int, max_new: int) -> RowState:
    return RowState(Request("x", "", SamplingParams(max_new_tokens=max_new), prompt_ids=(1,) * length), [1] * length,
                    ())


def test_choose_refill_skips_rows_that_do_not_fit_and_shifts_only_when_needed():
    # cursor at slot 20 of 30; a live row still reads from slot 6
    waiting = [_row(4, 12), _row(4, 5), _row(22, 2)]
    rows, shift = choose_refill([0], waiting, next_slot=20, oldest_live=6, total=30)
    assert rows[0].req.params.max_new_tokens == 12 and shift == 6  # needs 20 - m + 12 <= 30: m in [2, 6]
    rows, shift = choose_refill([0, 1], waiting, next_slot=20, oldest_live=0, total=30)
    assert [r.req.params.max_new_tokens for r in rows] == [5] and shift == 0  # 22 tokens do not fit before 20
    assert len(waiting) == 1
    assert choose_refill([0], waiting, next_slot=20, oldest_live=0, total=30) == ([], 0)


@pytest.mark.parametrize("name", ["cpu-4bit-cache", "cache-cpu-disk", "gpu-cache-3-tiers", "split-both"])
@pytest.mark.parametrize("refill", [False, True])
def test_finished_rows_leave_the_batch_and_the_tokens_stay(checkpoint, one_thread, tmp_path, monkeypatch, name,
                                                           refill):
    """Once no row waits, finished rows' cache rows and activations are dropped (over every tier they span):
    fewer rows are computed, and every row's tokens equal a run that keeps computing them."""
    policy = dataclasses.replace(REFILL_POLICIES[name], refill=refill)
    engine = Engine.load(checkpoint("llama_gqa_llama3"), dtype="float32", policy=policy, simulate_gpu=True,
                         offload_dir=tmp_path)
    got, dropped = engine.generate(_requests()), engine.schedule_counts["row_steps"]
    monkeypatch.setattr("engine.loop.schedule.DROP_SHARE", 2.0)  # a share above 1: finished rows are never dropped
    want, kept = engine.generate(_requests()), engine.schedule_counts["row_steps"]
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [(c.text, c.finish_reason) for c in got] == [(c.text, c.finish_reason) for c in want]
    assert dropped < (kept if refill else 0.9 * kept)  # with refill only the drain at the end drops rows
    engine.weights.close()
