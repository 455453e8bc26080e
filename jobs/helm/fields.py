"""The types of the HELM fields `helm-batch` reads: a request's decoding fields in scenario_state.json and a
stored RequestResult in the results store. A field of the wrong type would otherwise surface much later as a
ValueError traceback (`float("hot")`) or as dacite's WrongTypeError inside helm-run, naming neither the file nor
the request; here it is one line naming the field and its value (the caller adds the file and the request)."""

from __future__ import annotations

import reprlib

_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_COUNTS = {"num_completions": 1, "top_k_per_token": 0, "max_tokens": 0}  # the least value of each


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def request_problem(request: dict) -> str | None:
    """Why a request's decoding fields cannot be read as HELM's Request types, or None."""
    for name in _NUMBERS:
        value = request.get(name)
        if value is not None and not _is_number(value):
            return f"field {name}={reprlib.repr(value)} is not a number"
    for name, least in _COUNTS.items():
        value = request.get(name)
        if value is not None and (not _is_count(value) or value < least):
            return f"field {name}={reprlib.repr(value)} is not a whole number >= {least}"
    stops = request.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        return f"field stop_sequences={reprlib.repr(stops)} is not a list of strings"
    if request.get("random") is not None and not isinstance(request["random"], str):
        return f"field random={reprlib.repr(request['random'])} is not a string"
    return None


def output_mapping_problem(mapping) -> str | None:
    """Why a request state's output_mapping (answer letter -> choice text) is not one, or None."""
    if mapping is None or (isinstance(mapping, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                             for k, v in mapping.items())):
        return None
    return f"field output_mapping={reprlib.repr(mapping)} is not an object of letters to choice texts"


def result_problem(result) -> str | None:
    """Why a stored result is not HELM's RequestResult as its client reads it (dacite), or None."""
    if not isinstance(result, dict):
        return f"result {reprlib.repr(result)} is not an object"
    for name in ("success", "cached"):
        if not isinstance(result.get(name), bool):
            return f"result field {name}={reprlib.repr(result.get(name))} is not true or false"
    if not isinstance(result.get("embedding"), list) or not all(_is_number(x) for x in result["embedding"]):
        return f"result field embedding={reprlib.repr(result.get('embedding'))} is not a list of numbers"
    for name, check in (("request_time", _is_number), ("batch_request_time", _is_number),
                        ("request_datetime", _is_count), ("batch_size", _is_count)):
        if result.get(name) is not None and not check(result[name]):
            return f"result field {name}={reprlib.repr(result[name])} is not a number"
    if result.get("error") is not None and not isinstance(result["error"], str):
        return f"result field error={reprlib.repr(result['error'])} is not a string"
    flags = result.get("error_flags")
    if flags is not None and (not isinstance(flags, dict) or any(v is not None and not isinstance(v, bool)
                                                                  for v in flags.values())):
        return f"result field error_flags={reprlib.repr(flags)} is not an object of true/false flags"
    completions = result.get("completions")
    if not isinstance(completions, list):
        return f"result field completions={reprlib.repr(completions)} is not a list"
    for i, c in enumerate(completions):
        problem = _output_problem(c)
        if problem:
            return f"result field completions[{i}]{problem}"
    return None


def _output_problem(c) -> str | None:
    if not isinstance(c, dict):
        return f"={reprlib.repr(c)} is not an object"
    if not isinstance(c.get("text"), str):
        return f".text={reprlib.repr(c.get('text'))} is not a string"
    if not _is_number(c.get("logprob")):
        return f".logprob={reprlib.repr(c.get('logprob'))} is not a number"
    if not isinstance(c.get("tokens"), list):
        return f".tokens={reprlib.repr(c.get('tokens'))} is not a list"
    for k, t in enumerate(c["tokens"]):
        if not isinstance(t, dict) or not isinstance(t.get("text"), str) or not _is_number(t.get("logprob")):
            return f".tokens[{k}]={reprlib.repr(t)} is not a token (text and a number logprob)"
    if c.get("finish_reason") is not None and not isinstance(c["finish_reason"], dict):
        return f".finish_reason={reprlib.repr(c['finish_reason'])} is not an object"
    return None
