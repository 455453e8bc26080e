"""How large and how deeply nested an answer constraint may be, and how long its compile may take (CPU seconds of
its own, so that a busy machine slows a compile without failing it).

Each bound keeps one row's constraint from taking down its shard or its job: Python's `json` recurses once per
level (RecursionError past ~1,000), xgrammar's parsers recurse in C++ (deep enough, the process's stack would
overflow), and xgrammar's compile time grows much faster than the constraint (an object with 2,000 optional
properties compiles for ~11 s, 4,000 for ~40 s). Depth and size are measured without recursion, before anything
parses the constraint; every refusal names the limit."""

from __future__ import annotations

import re

from engine.errors import InvalidParamsError

MAX_CHARS = 1_000_000  # a constraint's text (a 10,000-value enum is ~150,000)
MAX_NESTING = 256  # JSON levels of a schema or guided value (a 100-level schema is ~200), or a regex's groups
MAX_OPTIONAL_PROPERTIES = 1_000  # per object schema: ~1 s to compile; 2,000 take ~11 s
COMPILE_SECONDS = 30.0  # one constraint's compile, in its thread's own CPU time (engine/loop/compile_jobs.py); a
# string of maxLength 8,192 takes ~23 s, the longest compile that the size bounds above let through
COMPILE_WAIT_FACTOR = 4  # and at most this many times as long by the clock: a machine so busy that the compile's
# thread gets under a quarter of a core fails the constraint rather than holding its rows without end

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")
_REGEX_ATOMS = re.compile(r"\\.|\[(?:[^\]\\]|\\.)*\]", re.S)  # escapes and character classes
_GRAMMAR_ATOMS = re.compile(r'\\.|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]', re.S)  # also quoted terminals


def json_text_nesting(text: str) -> int:
    """How many levels of arrays and objects a JSON text opens at most (strings skipped)."""
    return _running_max(_BRACKETS.findall(_JSON_STRING.sub("", text)), "[{")


def value_nesting(value, limit: int = MAX_NESTING) -> int:
    """How many levels of dicts and lists a Python value has (counting stops just past `limit`)."""
    top, stack = 0, [(value, 1)]
    while stack and top <= limit:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else None
        if children is None:
            continue
        top = max(top, depth)
        stack.extend((child, depth + 1) for child in children)
    return top


def group_nesting(text: str, grammar: bool = False) -> int:
    """How deeply the parentheses of a regex (or of an EBNF grammar) nest, escapes, classes and strings skipped."""
    atoms = _GRAMMAR_ATOMS if grammar else _REGEX_ATOMS
    return _running_max(re.findall(r"[()]", atoms.sub("", text)), "(")


def _running_max(tokens: list[str], opening: str) -> int:
    depth = top = 0
    for t in tokens:
        depth += 1 if t in opening else -1
        top = max(top, depth)
    return top


def check_text(what: str, text: str, nesting: int) -> None:
    """Refuse a constraint text past MAX_CHARS characters or MAX_NESTING levels, naming the limit."""
    if len(text) > MAX_CHARS:
        raise InvalidParamsError(f"{what} has {len(text):,} characters; the limit is {MAX_CHARS:,}: give a "
                                 "shorter constraint")
    if nesting > MAX_NESTING:
        raise InvalidParamsError(f"{what} nests {nesting} levels deep; the limit is {MAX_NESTING}: give a flatter "
                                 "constraint")


def check_json_text(what: str, text: str) -> None:
    """A JSON text's size and nesting, checked before it is parsed."""
    check_text(what, text, json_text_nesting(text[: MAX_CHARS + 1]))


def check_value(what: str, value) -> None:
    """A parsed value's nesting, checked before it is serialized or walked."""
    depth = value_nesting(value)
    if depth > MAX_NESTING:
        raise InvalidParamsError(f"{what} nests more than {MAX_NESTING} levels deep; the limit is {MAX_NESTING}: give a flatter "
                                 "constraint")
