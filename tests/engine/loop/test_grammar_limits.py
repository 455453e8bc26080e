"""Bounds on constraints (engine/guided_limits.py, engine/loop/compile_jobs.py, engine/loop/schema_rules.py):
a constraint too deep, too large or too slow to compile fails its row naming the limit, the plain rows beside it
run; a schema keyword xgrammar would not enforce is refused naming it; a length-bounded string stays a JSON
string."""

import json
import time

import pytest

from engine.engine import Engine
from engine.errors import InvalidParamsError
from engine.guided import Guided
from engine.loop import grammar
from engine.request import Request, SamplingParams
from tests.engine.reference import PROMPTS

VARIANT = "llama_gqa_llama3"


@pytest.fixture(scope="module")
def tiny(checkpoint):
    return Engine.load(checkpoint(VARIANT), dtype="float32")


def _deep_schema(levels: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _optional(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def _rows(engine, guided_values, max_new=4):
    reqs = [Request("plain", PROMPTS[0], SamplingParams(max_new_tokens=max_new))]
    reqs += [Request(str(i), PROMPTS[1], SamplingParams(max_new_tokens=max_new, guided=g))
             for i, g in enumerate(guided_values)]
    return {c.id: c for c in engine.generate(reqs)}


def test_a_value_nested_a_thousand_deep_is_refused_naming_the_limit():
    text = '{"json_schema": ' + '{"a": ' * 1000 + "1" + "}" * 1001
    with pytest.raises(InvalidParamsError, match="nests 1001 levels deep; the limit is 256"):
        Guided.from_mapping(text)
    deep: dict = {}
    for _ in range(1000):
        deep = {"a": deep}
    with pytest.raises(InvalidParamsError, match="the limit"):
        Guided.from_mapping({"json_schema": deep})
    with pytest.raises(InvalidParamsError, match="the limit is 256"):
        Guided(regex="(" * 1000 + "a" + ")" * 1000)
    with pytest.raises(InvalidParamsError, match="the limit is 1,000,000"):
        Guided(regex="a" * 1_000_001)


def test_a_hundred_level_schema_still_runs(tiny):
    got = _rows(tiny, [{"json_schema": _deep_schema(100)}], max_new=3)
    assert got["0"].error is None and got["0"].text.startswith('{"a'), got["0"]


def test_many_optional_properties_are_refused_at_once_and_the_plain_rows_run(tiny):
    began = time.perf_counter()
    got = _rows(tiny, [{"json_schema": _optional(2000)}, {"json_schema": _optional(8000)}])
    assert time.perf_counter() - began < 5  # it compiled for 11 s (2,000) and minutes (8,000)
    assert got["plain"].error is None and got["plain"].completion_tokens == 4
    for k in ("0", "1"):
        assert got[k].finish_reason == "error" and "the limit is 1,000" in got[k].error, got[k].error


def test_a_compile_past_its_time_limit_fails_its_rows_and_is_not_compiled_again(tiny, monkeypatch):
    monkeypatch.setattr(grammar, "COMPILE_SECONDS", 0.05)
    monkeypatch.setattr(grammar, "SETTLE_SECONDS", 0.01)
    monkeypatch.setattr("engine.engine.SETTLE_SECONDS", 0.01)
    slow = {"json_schema": _optional(1000)}  # ~0.8 s to compile
    alone = tiny.generate([Request("plain", PROMPTS[0], SamplingParams(max_new_tokens=4))])[0]
    got = _rows(tiny, [slow, slow, {"choice": [" yes", " no"]}])
    assert got["plain"].token_ids == alone.token_ids
    assert got["2"].text in (" yes", " no")
    for k in ("0", "1"):
        assert got[k].finish_reason == "error"
        assert "within 0.05 s (the limit per constraint, in the compile's CPU time" in got[k].error
    began = time.perf_counter()
    again = _rows(tiny, [slow])
    assert "within 0.05 s" in again["0"].error and time.perf_counter() - began < 0.5
    from engine.loop import compile_jobs

    compile_jobs._TOO_SLOW.clear()


def test_a_length_bounded_string_keeps_jsons_string_rules():
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    for n in (100, 10_000):
        schema = grammar.bounded_strings_as_patterns({"type": "string", "minLength": 1, "maxLength": n})
        g = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
        assert _is_grammar_accept_string(g, '"plain text"')
        for bad in ('"a\nb"', '"a"b"', '"a\\"'):
            assert not _is_grammar_accept_string(g, bad), (n, bad)


UNENFORCED = [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "contains"),
    ({"type": "integer", "if": {"minimum": 5}, "then": {"maximum": 7}}, "keyword if"),
    ({"type": "integer", "not": {"const": 3}}, "keyword not"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}, "required names 'b'"),
    ({"allOf": [{"type": "integer"}, {"type": "string"}]}, "allOf"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ({"type": "string", "format": "iri"}, "format 'iri'"),
    ({"type": "string", "pattern": "^a+$", "minLength": 2}, "minLength/maxLength beside pattern"),
    ({"maxLength": 2}, "maxLength without a type"),
    ({"type": "integer", "enum": ["a", 1]}, "enum value 'a'"),
    ({"type": "integer", "enum": [1, 5], "minimum": 3}, "minimum beside enum"),
    ({"type": "string", "pattern": "a^b"}, "anchor ^"),
    ({"type": "object", "properties": {"x": {"type": "array", "uniqueItems": True}}}, "#/properties/x"),
]


def test_keywords_xgrammar_does_not_enforce_are_refused_naming_them(tiny):
    got = _rows(tiny, [{"json_schema": s} for s, _ in UNENFORCED] + [{"regex": "a^b"}, {"regex": "a$b"}])
    assert got["plain"].error is None
    for i, (_, keyword) in enumerate(UNENFORCED):
        c = got[str(i)]
        assert c.finish_reason == "error" and keyword in c.error and "json_schema refused" in c.error, (keyword, c)
    n = len(UNENFORCED)
    assert "anchor ^" in got[str(n)].error and "anchor $" in got[str(n + 1)].error


ENFORCED = [
    {"type": "array", "items": {"type": "integer"}, "uniqueItems": False, "minItems": 1, "maxItems": 2},
    {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
    {"oneOf": [{"type": "integer"}, {"type": "string"}]},
    {"$defs": {"Cat": {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]},
               "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]}},
     "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]},
    {"allOf": [{"type": "integer", "maximum": 3}], "title": "small"},
    {"type": "string", "enum": ["a", "b"], "description": "a letter"},
    {"type": "string", "format": "date"},
    {"type": "string", "pattern": "^a$|^b$"},
    {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
]


def test_schemas_xgrammar_enforces_still_run(tiny):
    got = _rows(tiny, [{"json_schema": s} for s in ENFORCED], max_new=2)
    for i in range(len(ENFORCED)):
        assert got[str(i)].error is None, (ENFORCED[i], got[str(i)].error)
