"""`Guided`: a constraint on what a request may answer (one of some choices, a regular expression, a JSON schema,
any JSON object, or an EBNF grammar), enforced while decoding (engine/loop/grammar.py).

This file only says what a constraint is and reads the ways callers spell one; whether it compiles (a valid
regex, schema or grammar, a non-empty choice list) is decided per row when the engine prepares the row, so a bad
constraint fails that row alone."""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass

from engine.errors import InvalidParamsError
from engine.guided_limits import check_json_text, check_text, check_value, group_nesting

GUIDED_KINDS = ("choice", "regex", "json_schema", "json_object", "grammar")
# the names vLLM's GuidedDecodingParams / StructuredOutputsParams use for the same kinds (Ray Data LLM passes
# them through): "json" is a JSON schema
ALIASES = {"json": "json_schema"}
# vLLM fields that tune its backends rather than say what to produce: accepted when unset (None/False/"")
IGNORED_WHEN_UNSET = ("backend", "whitespace_pattern", "disable_fallback", "disable_any_whitespace",
                      "disable_additional_properties", "structural_tag", "_backend", "_backend_was_auto")
BACKENDS = (None, "", "auto", "xgrammar")
FORMATS_HINT = ('use exactly one of {"choice": ["a", "b"]}, {"regex": "..."}, {"json_schema": {...}}, '
                '{"json_object": true} or {"grammar": "root ::= ..."}')


@dataclass(frozen=True)
class Guided:
    """Exactly one of: `choice` (the answer is one of these strings), `regex` (the answer matches it in full),
    `json_schema` (JSON text of a schema; the answer is JSON that validates), `json_object` (any JSON object),
    `grammar` (an EBNF grammar as xgrammar reads it, start rule `root`)."""

    choice: tuple[str, ...] | None = None
    regex: str | None = None
    json_schema: str | None = None
    json_object: bool = False
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice):
                raise InvalidParamsError(f"guided choice={reprlib.repr(self.choice)} is invalid: use a list of strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        if isinstance(self.json_schema, (dict, bool)):  # a schema given as an object: kept as its JSON text
            check_value("guided json_schema", self.json_schema)
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        for name in ("regex", "json_schema", "grammar"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidParamsError(f"guided {name}={reprlib.repr(value)} is invalid: use a string")
        given = [k for k in GUIDED_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise InvalidParamsError(f"a guided constraint sets {', '.join(given) or 'nothing'}: {FORMATS_HINT}")
        self._check_bounds()

    def _check_bounds(self) -> None:
        """Size and nesting within engine/guided_limits.py's bounds, measured before anything parses the text."""
        kind, text = self.key
        if kind == "json_schema":
            check_json_text("guided json_schema", text)
        elif kind in ("regex", "grammar"):
            check_text(f"guided {kind}", text, group_nesting(text, grammar=kind == "grammar"))
        elif kind == "choice":
            check_text("guided choice", text, 0)

    @property
    def kind(self) -> str:
        return next(k for k in GUIDED_KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the constraint's compiled grammar: its kind and its text."""
        value = getattr(self, self.kind)
        return self.kind, json.dumps(value) if self.kind == "choice" else str(value)

    def describe(self, limit: int = 80) -> str:
        text = self.key[1]
        return f"{self.kind} {text if len(text) <= limit else text[:limit] + '...'}"

    @classmethod
    def from_mapping(cls, value) -> Guided:
        """A constraint from a mapping (a Parquet struct, parsed JSON, vLLM's guided_decoding dict), or from JSON
        text of one. Keys set to None are ignored, so a struct column whose rows use different kinds works."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            check_json_text("guided", value)
            try:
                value = json.loads(value)
            except RecursionError:  # the nesting check above makes this unreachable for valid JSON
                raise InvalidParamsError("guided nests too deeply for the JSON parser: give a flatter "
                                         "constraint") from None
            except ValueError as e:
                raise InvalidParamsError(f"guided={value[:80]!r} is not JSON ({e}): {FORMATS_HINT}") from None
        if not isinstance(value, dict):
            raise InvalidParamsError(f"guided={reprlib.repr(value)} is invalid: {FORMATS_HINT}")
        check_value("guided", value)
        fields = {}
        for key, v in value.items():
            if v is None or (key in IGNORED_WHEN_UNSET and v in (False, "")):
                continue
            if key == "backend" and v in BACKENDS:
                continue
            name = ALIASES.get(key, key)
            if name not in GUIDED_KINDS:
                raise InvalidParamsError(f"guided key {key!r}={reprlib.repr(v)} is not supported: {FORMATS_HINT}")
            fields[name] = v
        return cls(**fields)
