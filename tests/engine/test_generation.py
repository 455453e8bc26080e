"""bf16 agreement, seeded sampling, stop strings across tokens, EOS, logprobs and per-row errors."""

import pytest
import torch

from engine.engine import Engine
from engine.loop.sampling import filter_logits
from engine.request import Request, SamplingParams
from tests.engine.reference import PROMPTS, hf_greedy, hf_logits, hf_model

VARIANT = "llama_gqa_llama3"


@pytest.fixture(scope="module")
def engine(checkpoint):
    return Engine.load(checkpoint(VARIANT), dtype="float32")


def _reqs(params: SamplingParams, prompts=PROMPTS):
    return [Request(str(i), p, params) for i, p in enumerate(prompts)]


def _agreement(a, b) -> tuple[float, int]:
    pairs = [(x, y) for u, v in zip(a, b) for x, y in zip(u, v)]
    return sum(x == y for x, y in pairs) / len(pairs), len(pairs)


@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "opt350m"])
def test_bf16_is_as_close_to_fp32_as_transformers_bf16(checkpoint, variant):
    """Random weights give near-tied logits, so any bf16 run departs from fp32 here; the engine (bf16 GEMMs,
    float32 residual stream and norms) must stay at least as close to fp32 as transformers' bf16 does."""
    model_dir = checkpoint(variant)
    engine = Engine.load(model_dir, dtype="bfloat16")
    assert engine.layers[0]["self_attn.qkv_proj.weight"].dtype == torch.bfloat16
    reqs = _reqs(SamplingParams(max_new_tokens=16))
    fp32 = [c.token_ids for c in Engine.load(model_dir, dtype="float32").generate(reqs, batch_size=1)]
    ours = [c.token_ids for c in engine.generate(reqs, batch_size=1)]
    ref = hf_model(model_dir, torch.bfloat16)
    theirs = [hf_greedy(ref, engine.tokenizer, p, 16, engine.eos_ids) for p in PROMPTS]
    (ours_agree, n), (their_agree, _) = _agreement(fp32, ours), _agreement(fp32, theirs)
    assert n >= 40 and ours_agree >= their_agree - 0.02, f"engine bf16 {ours_agree:.3f}, transformers {their_agree:.3f}"


def test_bf16_agrees_with_fp32_on_95_percent_of_demo_model_tokens(demo_model_dir, demo_prompts):
    """On the bundled prompts, each answered up to the end of its line (as `make demo` does); past that the
    model invents the next exercise, where fp32 and bf16 drift apart (about 90 % agreement over 16 tokens)."""
    params = SamplingParams(max_new_tokens=16, stop=("\n",))
    reqs = _reqs(params, demo_prompts)
    fp32 = Engine.load(demo_model_dir, dtype="float32").generate(reqs)
    bf16 = Engine.load(demo_model_dir, dtype="bfloat16").generate(reqs)
    agree, n = _agreement([c.token_ids for c in fp32], [c.token_ids for c in bf16])
    assert n >= 100 and agree >= 0.95, f"bf16 agreement {agree:.3f} over {n} tokens"


def test_same_seed_same_tokens_different_seed_different_tokens(engine):
    def run(seed, prompts=PROMPTS, batch_size=8):
        p = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=50, top_p=0.95, seed=seed)
        return [c.token_ids for c in engine.generate(_reqs(p, prompts), batch_size=batch_size)]

    first = run(1)
    assert run(1) == first
    assert run(2) != first
    # a request's tokens do not depend on the batch it runs in
    assert run(1, PROMPTS[:1], batch_size=1) == first[:1]


def test_filters_keep_the_expected_tokens():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])
    top1 = filter_logits(logits, SamplingParams(temperature=1.0, top_k=1))
    assert torch.isfinite(top1).tolist() == [False, True, False, False]
    top2 = filter_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.isfinite(top2).tolist() == [False, True, False, True]
    # softmax of [0,3,1,2] is about [.03,.64,.09,.24]: top_p=0.8 keeps the two largest
    nucleus = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert torch.isfinite(nucleus).tolist() == [False, True, False, True]
    assert torch.allclose(filter_logits(logits, SamplingParams(temperature=2.0))[1], torch.tensor(1.5))


def _boundary_stop(tokenizer, tokens):
    """A 2-character stop string made of the last char of one token and the first of the next."""
    for k in range(1, len(tokens) - 1):
        head = tokenizer.decode(tokens[:k])
        full = tokenizer.decode(tokens[: k + 1])
        if head and len(full) > len(head) and full.startswith(head):
            return full[len(head) - 1 : len(head) + 1]
    raise AssertionError("no token boundary found")


def test_stop_string_spanning_tokens_cuts_before_it(engine):
    greedy = engine.generate(_reqs(SamplingParams(max_new_tokens=12), PROMPTS[:1]))[0]
    stop = _boundary_stop(engine.tokenizer, greedy.token_ids)
    text = engine.tokenizer.decode(greedy.token_ids, skip_special_tokens=True)
    got = engine.generate(_reqs(SamplingParams(max_new_tokens=12, stop=(stop, "never-seen")), PROMPTS[:1]))[0]
    assert got.finish_reason == "stop"
    assert got.text == text[: text.find(stop)]
    assert stop not in got.text
    assert got.completion_tokens < greedy.completion_tokens or greedy.finish_reason != "length"


def test_length_and_eos_finish_reasons(checkpoint):
    engine = Engine.load(checkpoint(VARIANT), dtype="float32")
    out = engine.generate(_reqs(SamplingParams(max_new_tokens=3), PROMPTS[:2]))
    assert all(c.finish_reason == "length" and c.completion_tokens == 3 for c in out)
    first = out[0].token_ids[0]
    engine.eos_ids = (first,)  # make the first greedy token an EOS
    got = engine.generate(_reqs(SamplingParams(max_new_tokens=3), PROMPTS[:1]))[0]
    assert got.finish_reason == "eos" and got.token_ids == [first] and got.text == ""


def test_logprobs_match_log_softmax_of_reference_logits(checkpoint, engine):
    ref = hf_model(checkpoint(VARIANT))
    got = engine.generate(_reqs(SamplingParams(max_new_tokens=8, logprobs=True)))
    for prompt, c in zip(PROMPTS, got):
        logits = hf_logits(ref, engine.tokenizer, prompt, c.token_ids)
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids).view(-1, 1)).view(-1)
        assert len(c.logprobs) == len(c.token_ids)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)


def test_bad_rows_fail_alone(engine):
    context = engine.spec.max_position_embeddings
    long_prompt = "The quick brown fox " * 200
    reqs = [
        Request("empty", "", SamplingParams(max_new_tokens=4)),
        Request("none", None, SamplingParams(max_new_tokens=4)),
        Request("long", long_prompt, SamplingParams(max_new_tokens=4)),
        Request("ok", "The quick brown fox", SamplingParams(max_new_tokens=4)),
        Request("room", "x", SamplingParams(max_new_tokens=context)),
    ]
    out = {c.id: c for c in engine.generate(reqs)}
    assert out["empty"].finish_reason == "error" and "empty" in out["empty"].error
    assert out["none"].finish_reason == "error" and "not a string" in out["none"].error
    assert out["long"].finish_reason == "error" and "truncate" in out["long"].error
    assert out["room"].finish_reason == "error" and "max_new_tokens" in out["room"].error
    assert out["ok"].finish_reason == "length" and out["ok"].completion_tokens == 4
    left = engine.generate(reqs[2:3], truncate="left")[0]
    assert left.finish_reason == "length" and left.prompt_tokens == context - 4


def test_teacher_forced_logprobs_match_the_reference_forward(checkpoint, engine):
    from tests.engine.teacher_forcing import continuation_logprobs

    ref = hf_model(checkpoint(VARIANT))
    text = PROMPTS[3]
    got = continuation_logprobs(engine, [text], prefix_tokens=2)[0]
    ids = engine.tokenizer(text)["input_ids"]
    prompt = engine.tokenizer.decode(ids[:2])
    assert engine.tokenizer(prompt)["input_ids"] == ids[:2]
    logits = hf_logits(ref, engine.tokenizer, prompt, ids[2:])
    expected = logits.log_softmax(-1).gather(-1, torch.tensor(ids[2:]).view(-1, 1)).view(-1)
    assert torch.allclose(torch.tensor(got), expected, atol=1e-4)
