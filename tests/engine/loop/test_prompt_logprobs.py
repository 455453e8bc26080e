"""Prompt scoring from the prefill: each prompt token's log-probability equals transformers' log_softmax of its
logits (float32, 1e-4 per token) under every placement policy, for rows batched with left padding and for rows
entering by refill; whether each token was the most likely one agrees with the argmax."""

import pytest
import torch

from engine.engine import Engine
from engine.errors import InvalidParamsError
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.checkpoints import VARIANTS
from tests.engine.reference import PROMPTS, hf_model
from tests.engine.test_policies import POLICIES

VARIANT = "llama_gqa_llama3"
TEXTS = PROMPTS[:4] + ["Product A is a red kettle of two litres and product B a blue one; are they the same? No"]


def hf_prompt_logprobs(model, tokenizer, text: str) -> tuple[torch.Tensor, list[bool]]:
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    lp = logits.log_softmax(-1).gather(-1, ids[0, 1:].view(-1, 1)).view(-1)
    return lp, (logits.argmax(-1) == ids[0, 1:]).tolist()


def _score(engine, texts, **kw):
    reqs = [Request(str(i), t, SamplingParams(max_new_tokens=1, prompt_logprobs=True)) for i, t in enumerate(texts)]
    return engine.generate(reqs, **kw)


def _check(got, expected):
    for c, (lp, greedy) in zip(got, expected):
        assert c.prompt_logprobs is not None and len(c.prompt_logprobs) == len(lp) == c.prompt_tokens - 1
        assert torch.allclose(torch.tensor(c.prompt_logprobs), lp, atol=1e-4, rtol=0), (c.id, c.prompt_logprobs, lp)
        assert c.prompt_greedy == greedy


@pytest.fixture(scope="module")
def expected(checkpoint):
    model_dir = checkpoint(VARIANT)
    ref, tok = hf_model(model_dir), Engine.load(model_dir, dtype="float32").tokenizer
    return [hf_prompt_logprobs(ref, tok, t) for t in TEXTS]


@pytest.mark.parametrize("variant", VARIANTS)
def test_prompt_logprobs_equal_transformers_for_every_family(checkpoint, variant):
    model_dir = checkpoint(variant)
    engine = Engine.load(model_dir, dtype="float32")
    ref = hf_model(model_dir)
    _check(_score(engine, TEXTS), [hf_prompt_logprobs(ref, engine.tokenizer, t) for t in TEXTS])


@pytest.mark.parametrize("name", list(POLICIES))
def test_prompt_logprobs_under_every_policy(checkpoint, expected, tmp_path, name):
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=POLICIES[name], simulate_gpu=True,
                         offload_dir=tmp_path)
    _check(_score(engine, TEXTS), expected)
    engine.weights.close()


def test_rows_entering_by_refill_are_scored_too(checkpoint, expected):
    """One GPU batch of two rows, refill on: the later rows prefill inside decode steps (engine/loop/refill.py)
    and are scored there; rows that do not ask are not scored."""
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=Policy(gbs=2, num_gb=1, refill=True))
    reqs = [Request(str(i), t, SamplingParams(max_new_tokens=6 if i < 2 else 2, prompt_logprobs=i != 1))
            for i, t in enumerate(TEXTS)]
    got = engine.generate(reqs)
    assert engine.schedule_counts["refilled_rows"] > 0
    assert got[1].prompt_logprobs is None and got[1].prompt_greedy is None
    _check([c for i, c in enumerate(got) if i != 1], [e for i, e in enumerate(expected) if i != 1])


def test_scoring_only_the_last_tokens_gives_their_scores_with_the_head_run_there_only(checkpoint, expected,
                                                                                       monkeypatch):
    """`score_last` (an lm-eval continuation after its context): the last n tokens' scores, equal to transformers',
    from an LM head run over those n positions, not over the whole prompt."""
    from engine.loop import schedule

    positions = []
    real = schedule.prompt_logprobs
    monkeypatch.setattr(schedule, "prompt_logprobs", lambda head, h, ids: positions.append(len(ids) - 1) or real(
        head, h, ids))
    engine = Engine.load(checkpoint(VARIANT), dtype="float32")
    reqs = [Request(str(i), t, SamplingParams(max_new_tokens=1, prompt_logprobs=True, score_last=2))
            for i, t in enumerate(TEXTS)]
    for c, (lp, greedy) in zip(engine.generate(reqs), expected):
        assert torch.allclose(torch.tensor(c.prompt_logprobs), lp[-2:], atol=1e-4, rtol=0), (c.id, c.prompt_logprobs)
        assert c.prompt_greedy == greedy[-2:]
    assert positions == [2] * len(TEXTS)


def test_score_last_needs_prompt_logprobs():
    with pytest.raises(InvalidParamsError, match="score_last=3 .* needs prompt_logprobs=True"):
        SamplingParams(score_last=3)
    with pytest.raises(InvalidParamsError, match="score_last=-1"):
        SamplingParams(prompt_logprobs=True, score_last=-1)


def test_is_argmax_breaks_ties_as_argmax_does():
    """A target that holds the largest value is the argmax only where no earlier index holds it too; NaN-free
    rows of every kind: a unique max, a tie before the target, a tie after it, a target below the max."""
    from engine.loop.prompt_logprobs import is_argmax

    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [3.0, 1.0, 3.0, 0.0], [1.0, 3.0, 3.0, 0.0], [1.0, 2.0, 0.0, 2.0]])
    t = torch.tensor([1, 2, 1, 0])
    assert is_argmax(logits, t).tolist() == (logits.argmax(-1) == t).tolist() == [True, False, True, False]
    wide = torch.randn(64, 1000).bfloat16().float()  # bf16 values: ties at the max happen
    wide[::3, 7] = wide[::3].amax(-1)  # and here surely, before some targets and after others
    for t in (wide.argmax(-1), torch.full((64,), 7), torch.randint(0, 1000, (64,))):
        assert torch.equal(is_argmax(wide, t), wide.argmax(-1) == t)
