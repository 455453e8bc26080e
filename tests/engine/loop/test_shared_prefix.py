"""A prefix every row of a block shares is computed once (engine/loop/shared_prefix.py): greedy float32 tokens
equal transformers' and the run without sharing, token for token, for every family, under every placement policy,
with refill, and prompt scores stay exact; the rows' caches hold only their own tokens."""

import pytest
import torch

from engine.engine import Engine
from engine.loop.shared_prefix import MIN_SHARED, shared_length
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.checkpoints import VARIANTS
from tests.engine.loop.test_prompt_logprobs import _check, hf_prompt_logprobs
from tests.engine.reference import hf_greedy, hf_model
from tests.engine.test_policies import POLICIES

VARIANT = "llama_gqa_llama3"
FEW_SHOT = "Q: is 1 = 2? A: no\nQ: is 3 = 3? A: yes\nQ: is 4 = 5? A: no\n"  # ~60 tokens in the test vocabularies
ROWS = [FEW_SHOT + q for q in ("Q: is 7 = 7? A:", "Q: 8?", "Q", "Q: is 2 + 2 = 4 = 2 * 2? A:", "Q: is 1 = 1? A: yes\nQ: 2?")]
MAX_NEW = 8


def _reqs(rows=ROWS, max_new=MAX_NEW, **params):
    return [Request(str(i), p, SamplingParams(max_new_tokens=max_new, **params)) for i, p in enumerate(rows)]


def _tokens(engine, policy=None, **kw):
    return [c.token_ids for c in engine.generate(_reqs(**kw), policy=policy)]


def test_shared_length_is_the_common_start_leaving_each_row_a_token():
    a = list(range(100))
    assert shared_length([a, a[:60] + [7, 8], a[:70]]) == 60
    assert shared_length([a[:50], a[:50]]) == 49  # each row keeps its last token
    assert shared_length([a, a[: MIN_SHARED - 1] + [0, 1]]) == 0  # too short to be worth a pass
    assert shared_length([a, [5] + a]) == 0
    assert shared_length([a]) == 0  # a block of one row has nothing to share


@pytest.mark.parametrize("variant", VARIANTS)
def test_sharing_gives_transformers_tokens_for_every_family(checkpoint, variant):
    model_dir = checkpoint(variant)
    engine = Engine.load(model_dir, dtype="float32", policy=Policy(gbs=3, num_gb=2))
    ref = hf_model(model_dir)
    expected = [hf_greedy(ref, engine.tokenizer, p, MAX_NEW, engine.eos_ids) for p in ROWS]
    got = _tokens(engine)
    counts = engine.schedule_counts
    if engine.spec.sliding_window is None:
        assert counts["shared_tokens"] >= MIN_SHARED and counts["shared_rows"] == len(ROWS), counts
    else:  # rows longer than the window would stop seeing the prefix's first tokens: computed per row
        assert counts["shared_tokens"] == 0, counts
    assert got == expected
    assert _tokens(engine, Policy(gbs=3, num_gb=2, share_prefix=False)) == expected
    assert engine.schedule_counts["shared_tokens"] == 0


@pytest.fixture(scope="module")
def unshared(checkpoint):
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=Policy(share_prefix=False))
    return _tokens(engine)


@pytest.mark.parametrize("name", list(POLICIES))
def test_sharing_under_every_policy(checkpoint, unshared, tmp_path, name):
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=POLICIES[name], simulate_gpu=True,
                         offload_dir=tmp_path)
    assert _tokens(engine) == unshared
    one_row_blocks = POLICIES[name].block_size == 1  # nothing to share within a block of one row
    assert (engine.schedule_counts["shared_tokens"] == 0) == one_row_blocks, engine.schedule_counts
    engine.weights.close()


def test_rows_entering_by_refill_share_the_prefix(checkpoint, unshared):
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=Policy(gbs=2, num_gb=1, refill=True))
    reqs = [Request(r.id, r.prompt, SamplingParams(max_new_tokens=MAX_NEW if int(r.id) % 2 else 3))
            for r in _reqs()]
    got = engine.generate(reqs)
    counts = engine.schedule_counts
    assert counts["refilled_rows"] > 0 and counts["shared_rows"] == len(ROWS), counts
    assert [c.token_ids for c in got] == [t if int(c.id) % 2 else t[:3] for c, t in zip(got, unshared)]


def test_prompt_scores_with_a_shared_prefix_equal_transformers(checkpoint):
    model_dir = checkpoint(VARIANT)
    engine = Engine.load(model_dir, dtype="float32", policy=Policy(gbs=2, num_gb=2, refill=True))
    ref = hf_model(model_dir)
    got = engine.generate(_reqs(max_new=1, prompt_logprobs=True))
    assert engine.schedule_counts["shared_tokens"] >= MIN_SHARED
    _check(got, [hf_prompt_logprobs(ref, engine.tokenizer, t) for t in ROWS])


@pytest.mark.parametrize("last", [1, 3, 1000])
def test_scoring_the_last_tokens_with_a_shared_prefix_gives_the_tail_of_the_full_scores(checkpoint, last):
    """A row's last tokens within its own part are scored from its own positions; a tail reaching into the shared
    prefix (or past the prompt's start) comes from the full scores."""
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=Policy(gbs=2, num_gb=2, refill=True))
    full = engine.generate(_reqs(max_new=1, prompt_logprobs=True))
    tail = engine.generate(_reqs(max_new=1, prompt_logprobs=True, score_last=last))
    assert engine.schedule_counts["shared_tokens"] >= MIN_SHARED
    for f, t in zip(full, tail):
        n = min(last, len(f.prompt_logprobs))
        assert len(t.prompt_logprobs) == n and t.prompt_greedy == f.prompt_greedy[-n:]
        assert torch.allclose(torch.tensor(t.prompt_logprobs), torch.tensor(f.prompt_logprobs[-n:]), atol=1e-5,
                              rtol=0), (t.id, t.prompt_logprobs, f.prompt_logprobs[-n:])


@pytest.mark.parametrize("own, last, prefix_scored", [((1, 2), 2, "all"), ((1, 1), 1, "first"), ((3, 3), 2, None)])
def test_the_choices_of_questions_share_their_context_and_score_as_alone(checkpoint, monkeypatch, own, last,
                                                                        prefix_scored):
    """Scoring rows of several questions (a context each, then a choice) in one call: each question's rows form a
    block whose shared prefix is its context (engine.batching.context_blocks), computed once, and the choices'
    scores equal those of a run without sharing, whether the rows need the prefix's scores ("all": a tail longer
    than a choice), only its last position's ("first": a tail of exactly the choice) or nothing of it."""
    import random

    from engine import batching
    from engine.loop import schedule

    monkeypatch.setattr(batching, "MIN_CONTEXT", 40)
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=Policy(gbs=8, num_gb=1))
    rnd = random.Random(0)
    contexts = [[rnd.randrange(5, 200) for _ in range(60)] for _ in range(3)]
    rows = [ctx + [rnd.randrange(5, 200) for _ in range(own[c % 2])] for ctx in contexts for c in range(3)]
    asked = []
    real = schedule.prefix_logprobs_needed
    monkeypatch.setattr(schedule, "prefix_logprobs_needed", lambda rows, shared: asked.append(real(rows, shared)) or asked[-1])

    def scores(policy=None):
        params = SamplingParams(max_new_tokens=1, prompt_logprobs=True, score_last=last)
        got = engine.generate([Request(str(i), "", params, prompt_ids=tuple(r)) for i, r in enumerate(rows)],
                              policy=policy)
        return [c.prompt_logprobs for c in got], dict(engine.schedule_counts)

    shared, counts = scores()
    alone, alone_counts = scores(Policy(gbs=8, num_gb=1, share_prefix=False))
    assert counts["shared_tokens"] >= 3 * 60 and alone_counts.get("shared_tokens", 0) == 0, (counts, alone_counts)
    assert asked == [prefix_scored] * 3
    for s, a in zip(shared, alone):
        assert torch.allclose(torch.tensor(s), torch.tensor(a), atol=1e-5, rtol=0), (s, a)


def test_a_compressed_cache_shares_too(checkpoint, unshared):
    """The prefix is kept uncompressed (one row); the rows' own 4-bit caches attend over it: the tokens agree
    with the uncompressed run as the 4-bit cache does without sharing."""
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=Policy(compress_cache=True))
    shared = _tokens(engine)
    alone = _tokens(engine, Policy(compress_cache=True, share_prefix=False))
    same = sum(a == b for s, u in zip(shared, unshared) for a, b in zip(s, u))
    same_alone = sum(a == b for s, u in zip(alone, unshared) for a, b in zip(s, u))
    assert same >= same_alone - 2, (shared, alone, unshared)


def test_rows_hold_only_their_own_tokens(checkpoint):
    engine = Engine.load(checkpoint(VARIANT), dtype="float32")
    ex = engine.executor()
    rows = [engine._prepare(r, "error") for r in _reqs()]
    P = ex.shared_tokens(rows)
    assert P >= MIN_SHARED
    full = ex.total_slots(rows)
    longest = max(len(r.prompt_ids) for r in rows)
    shared = ex.block_bytes(len(rows), longest - P, full - P, shared=P)
    alone = ex.block_bytes(len(rows), longest, full)
    spec = engine.spec
    prefix = 2 * spec.num_layers * spec.num_kv_heads * P * spec.head_dim * 4  # K and V of P slots, float32
    acts = P * spec.hidden_size * 4  # a row's activations are P positions shorter
    assert shared["cpu"] == alone["cpu"] - len(rows) * (prefix + acts) + prefix, (shared, alone, prefix)


def test_questions_are_not_cut_into_small_blocks_where_weights_stream(checkpoint, monkeypatch, tmp_path):
    """Context blocks need weights that stay in CPU memory: with part of them on disk (read per block) or on a GPU,
    a block of a few rows would pay a whole model's traffic, so the rows are blocked by length as before."""
    from engine import batching

    assert Policy().weights_stay()
    assert not Policy(weight_cpu=0.5).weights_stay() and not Policy(weight_gpu=0.5, weight_cpu=0.5).weights_stay()
    assert not Policy(prefill_device="gpu").weights_stay()
    monkeypatch.setattr(batching, "MIN_CONTEXT", 40)
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=Policy(gbs=8, num_gb=1, weight_cpu=0.5),
                         offload_dir=tmp_path)
    rows = [[7 + q] * 60 + [100 + c] for q in range(3) for c in range(3)]
    params = SamplingParams(max_new_tokens=1, prompt_logprobs=True, score_last=1)
    engine.generate([Request(str(i), "", params, prompt_ids=tuple(r)) for i, r in enumerate(rows)])
    assert engine.schedule_counts.get("shared_tokens", 0) == 0, engine.schedule_counts
    engine.weights.close()
