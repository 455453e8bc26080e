"""Constrained decoding (engine/guided.py, engine/loop/grammar.py): answers that parse, on a random-weight model
and the demo model, greedy and sampled, under every kind of schedule; greedy equals transformers' generate with
xgrammar's own logits processor; unconstrained rows keep their tokens; a bad constraint fails its row alone."""

import json
import re

import jsonschema
import pytest
import torch

from engine.engine import Engine
from engine.guided import Guided
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.engine.reference import PROMPTS, hf_model

VARIANT = "llama_gqa_llama3"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog"]},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "kind", "ok"],
}
CHOICES = [" Yes", " No", " maybe not"]


def _params(guided, sampled: bool, max_new: int = 64):
    return SamplingParams(max_new_tokens=max_new, temperature=0.9 if sampled else 0.0, seed=7, guided=guided)


@pytest.fixture(scope="module")
def tiny(checkpoint):
    return Engine.load(checkpoint(VARIANT), dtype="float32")


@pytest.fixture(scope="module")
def demo(demo_model_dir):
    return Engine.load(demo_model_dir, dtype="float32")


@pytest.mark.parametrize("which", ["tiny", "demo"])
def test_every_json_schema_row_gives_json_that_validates(request, which):
    engine = request.getfixturevalue(which)
    reqs = [Request(f"{i}-{s}", p, _params({"json_schema": SCHEMA}, s)) for i, p in enumerate(PROMPTS)
            for s in (False, True)]
    got = engine.generate(reqs, batch_size=4)
    for c in got:
        assert c.finish_reason == "eos", (c.id, c.text, c.finish_reason)
        jsonschema.validate(json.loads(c.text), SCHEMA)
    assert len({c.text for c in got}) > 1, "every row gave the same answer: the test would not see a bad mask"


def test_json_object_and_regex_rows_parse(demo):
    reqs = [Request("obj", "Q: Pick a color. A:", _params({"json_object": True}, False, 48)),
            Request("num", "Q: What is 12 plus 30? A:", _params({"regex": r" \d{1,3}"}, False, 8)),
            Request("num-s", "Q: What is 12 plus 30? A:", _params({"regex": r" \d{1,3}"}, True, 8))]
    obj, num, num_s = demo.generate(reqs)
    assert isinstance(json.loads(obj.text), dict), obj.text
    assert re.fullmatch(r" \d{1,3}", num.text) and re.fullmatch(r" \d{1,3}", num_s.text), (num.text, num_s.text)


def _hf_guided(model, tokenizer, prompt, compiled, max_new, eos_ids):
    import xgrammar as xgr

    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                             pad_token_id=eos_ids[0], eos_token_id=list(eos_ids),
                             logits_processor=[xgr.contrib.hf.LogitsProcessor(compiled)])
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("guided", [{"json_schema": SCHEMA}, {"choice": CHOICES}, {"regex": r"[a-z]{2,5}!"}])
def test_greedy_with_a_constraint_equals_transformers_with_xgrammars_processor(checkpoint, tiny, guided):
    ref = hf_model(checkpoint(VARIANT))
    compiled = tiny.grammars().compiled(Guided.from_mapping(guided))
    expected = [_hf_guided(ref, tiny.tokenizer, p, compiled, 40, tiny.eos_ids) for p in PROMPTS]
    got = tiny.generate([Request(str(i), p, _params(guided, False, 40)) for i, p in enumerate(PROMPTS)])
    assert [c.token_ids for c in got] == expected


def test_choice_rows_answer_a_choice_and_free_rows_keep_their_tokens(tiny):
    free = [Request(f"f{i}", p, SamplingParams(max_new_tokens=10)) for i, p in enumerate(PROMPTS)]
    alone = [c.token_ids for c in tiny.generate(free)]
    chosen = [Request(f"c{i}-{s}", p, _params({"choice": CHOICES}, s, 16)) for i, p in enumerate(PROMPTS)
              for s in (False, True)]
    mixed = tiny.generate([r for pair in zip(free, chosen) for r in pair] + chosen[len(free):])
    by_id = {c.id: c for c in mixed}
    assert [by_id[r.id].token_ids for r in free] == alone
    assert all(by_id[r.id].text in CHOICES and by_id[r.id].finish_reason == "eos" for r in chosen)


REFILL = Policy(gbs=2, num_gb=1, refill=True)
SIM_GPU = Policy(gbs=3, num_gb=2, weight_gpu=0.5, weight_cpu=0.5, cache_gpu=0.5, cache_cpu=0.5,
                 prefill_device="gpu", decode_device="gpu")


@pytest.mark.parametrize("policy", [REFILL, SIM_GPU], ids=["refill", "simulated-gpu"])
def test_constrained_rows_give_the_same_tokens_under_every_schedule(checkpoint, tiny, tmp_path, policy):
    """Rows of different lengths (some finish early, so rows enter by refill) with a mix of constraints."""
    kinds = [{"json_schema": SCHEMA}, {"choice": CHOICES}, None, {"regex": r"\d{1,9}"}]
    reqs = [Request(str(i), p, _params(kinds[i % 4], i % 3 == 0, 12 + 9 * (i % 3)))
            for i, p in enumerate(PROMPTS * 2)]
    expected = [c.token_ids for c in tiny.generate(reqs, batch_size=1)]
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=policy, simulate_gpu=True,
                         offload_dir=tmp_path)
    got = engine.generate(reqs)
    assert [c.token_ids for c in got] == expected
    if policy.refill:
        assert engine.schedule_counts["refilled_rows"] > 0


def test_a_bad_constraint_fails_its_row_alone(tiny):
    bad = {"regex": "(a", "json_schema": '{"type": "nonsense"}', "choice": [], "grammar": "root ::= ",
           "json_schema ": "{not json"}
    reqs = [Request("ok", "x", SamplingParams(max_new_tokens=5))]
    reqs += [Request(k, "x", SamplingParams(max_new_tokens=5, guided={k.strip(): v})) for k, v in bad.items()]
    reqs.append(Request("forced", "x", SamplingParams(max_new_tokens=2, guided={"choice": ["a"]}), forced_ids=(5,)))
    got = {c.id: c for c in tiny.generate(reqs)}
    assert got["ok"].finish_reason == "length" and got["ok"].error is None
    for k in [*bad, "forced"]:
        assert got[k].finish_reason == "error" and got[k].completion_tokens == 0, k
    assert "parenthesis" in got["regex"].error and "fix the regular expression" in got["regex"].error
    assert "nonsense" in got["json_schema"].error
    assert "empty list" in got["choice"].error
    assert "not JSON" in got["json_schema "].error
    assert "forced_ids" in got["forced"].error


def test_guided_is_read_from_the_ways_callers_spell_it():
    assert Guided.from_mapping('{"choice": ["a", "b"]}') == Guided(choice=("a", "b"))
    vllm = {"json": {"type": "object"}, "regex": None, "choice": None, "backend": None,
            "disable_any_whitespace": False}
    assert Guided.from_mapping(vllm).json_schema == '{"type": "object"}'
    with pytest.raises(ValueError, match="exactly one"):
        Guided.from_mapping({"choice": ["a"], "regex": "b"})
    with pytest.raises(ValueError, match="not supported"):
        Guided.from_mapping({"choices": ["a"]})


def test_a_constrained_rows_logprobs_are_the_models_own(tiny):
    """The mask decides the token, not its reported log-probability: the same tokens forced without a
    constraint have the same logprobs."""
    params = SamplingParams(max_new_tokens=12, logprobs=True, guided={"choice": CHOICES})
    (guided,) = tiny.generate([Request("g", PROMPTS[0], params)])
    (forced,) = tiny.generate([Request("f", PROMPTS[0], SamplingParams(max_new_tokens=12, logprobs=True),
                                       forced_ids=tuple(guided.token_ids))])
    assert guided.text in CHOICES and forced.token_ids == guided.token_ids
    assert forced.logprobs == pytest.approx(guided.logprobs, abs=1e-5)


def test_without_xgrammar_a_constrained_row_fails_alone_naming_the_extra(tiny, monkeypatch):
    import sys

    from engine.loop import grammar

    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar raises ImportError
    grammar.tokenizer_info.cache_clear()
    reqs = [Request("ok", "x", SamplingParams(max_new_tokens=3)),
            Request("c", "x", SamplingParams(max_new_tokens=3, guided={"choice": ["yes", "no"]}))]
    got = {c.id: c for c in tiny.generate(reqs)}
    grammar.tokenizer_info.cache_clear()
    assert got["ok"].error is None and got["ok"].completion_tokens == 3
    assert got["c"].finish_reason == "error" and "pip install 'flexbatch[grammar]'" in got["c"].error
