"""A Batch request's answer constraint: OpenAI's `response_format` (`text`, `json_object`, `json_schema` with its
`schema` and `strict`) and vLLM's `guided_choice` / `guided_regex` / `guided_json` / `guided_grammar` body fields,
as an engine `Guided` (enforced while decoding: engine/loop/grammar.py).

`strict` is accepted either way: the schema is always enforced (as vLLM does); OpenAI's strict mode also forbids
properties the schema does not list, which the engine does too (xgrammar's strict mode)."""

from __future__ import annotations

from engine.errors import InvalidParamsError
from engine.guided import Guided

VLLM_FIELDS = {"guided_choice": "choice", "guided_regex": "regex", "guided_json": "json_schema",
               "guided_grammar": "grammar"}
BODY_FIELDS = ("response_format", *VLLM_FIELDS)
_TYPES = ("text", "json_object", "json_schema")


def body_guided(body: dict) -> Guided | None:
    """The body's constraint, None when it sets none; raises InvalidParamsError naming the bad field."""
    given = {VLLM_FIELDS[k]: body[k] for k in VLLM_FIELDS if body.get(k) is not None}
    fmt = _response_format(body.get("response_format"))
    if fmt is not None:
        given["json_schema" if fmt.json_schema else "json_object"] = fmt.json_schema or True
    if len(given) > 1:
        raise InvalidParamsError(f"the body sets {len(given)} answer constraints ({', '.join(sorted(given))}); "
                                 "give one of response_format, guided_choice, guided_regex, guided_json, "
                                 "guided_grammar")
    return Guided.from_mapping(given) if given else None


def _response_format(value) -> Guided | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in _TYPES:
        raise InvalidParamsError(f"response_format={value!r} is invalid: give {{\"type\": \"text\"}}, "
                                 "{\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": "
                                 "{\"name\": ..., \"schema\": {...}}}")
    if kind == "text":
        return None
    if kind == "json_object":
        return Guided(json_object=True)
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise InvalidParamsError(f"response_format json_schema={spec!r} is invalid: give "
                                 "{\"name\": \"...\", \"schema\": {...a JSON schema...}, \"strict\": true}")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidParamsError(f"response_format json_schema strict={strict!r} is invalid: use true or false")
    return Guided(json_schema=spec["schema"])
