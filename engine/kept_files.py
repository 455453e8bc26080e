"""The one reader of the JSON files flexbatch keeps between runs (the hardware profile, the kernel rates, the weight
files' digests, the converted layers' and the kernel build's records): each is read as untrusted, against a shape
of its kind. A kept file that is not JSON or not of its shape is set aside (renamed with the suffix WRONG_SUFFIX,
one log line) and its content measured or built again; it never stops a run. A file the user names (`--hardware
FILE`) is checked against the same shape by its reader, which refuses it in one line.

A shape is written with Python values: `NUMBER`, `INT`, `TEXT`, `BOOL`, `ANY`; a list `[shape]` (every item of that
shape); a dict `{"field": shape}` (an object whose fields, where present, have their shapes; fields it does not
name are left to the reader; `Needed(shape)` a field that must be there); `Table(shape)` (an object of any keys, each value of `shape`); `Either(a, b, ...)`
(any of them); `None` (JSON null)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
WRONG_SUFFIX = ".wrong"
NUMBER, INT, TEXT, BOOL, ANY = "number", "integer", "text", "true or false", "anything"
_KINDS = {NUMBER: (int, float), INT: (int,), TEXT: (str,), BOOL: (bool,)}


@dataclass(frozen=True)
class Table:
    """An object of any keys, each value of `value`."""

    value: object


@dataclass(frozen=True)
class Needed:
    """A field of an object shape that must be present, of `shape`."""

    shape: object


class Either:
    """Any of `shapes`."""

    def __init__(self, *shapes):
        self.shapes = shapes


def shape_problem(value, shape, root: str = "the file") -> str | None:
    """What in `value` (parsed JSON) does not have `shape`, naming where (its field path, or `root` for the whole),
    or None."""
    stack = [(value, shape, "")]
    while stack:
        value, shape, where = stack.pop()
        name = where or root
        if isinstance(shape, Either):
            if all(shape_problem(value, s, root) for s in shape.shapes):
                return f"{name} is {_kind_of(value)}, not one of the kinds it may be"
        elif shape is None:
            if value is not None:
                return f"{name} is {_kind_of(value)}, expected null"
        elif shape == ANY:
            continue
        elif isinstance(shape, str):
            if isinstance(value, bool) != (shape == BOOL) or not isinstance(value, _KINDS[shape]):
                return f"{name} is {_kind_of(value)}, expected {'an' if shape == INT else 'a'} {shape}"
        elif isinstance(shape, list):
            if not isinstance(value, list):
                return f"{name} is {_kind_of(value)}, expected a list"
            stack.extend((item, shape[0], f"{where}[{i}]") for i, item in enumerate(value))
        else:
            if not isinstance(value, dict):
                return f"{name} is {_kind_of(value)}, expected an object"
            if isinstance(shape, Table):
                stack.extend((v, shape.value, f"{where}[{json.dumps(k)}]") for k, v in value.items())
            else:
                for k, s in shape.items():
                    field_name = f"{where}.{k}" if where else k
                    if k in value:
                        stack.append((value[k], s.shape if isinstance(s, Needed) else s, field_name))
                    elif isinstance(s, Needed):
                        return f"{field_name} is missing"
    return None


def _kind_of(value) -> str:
    if value is None:
        return "null"
    kind = {bool: "true or false", int: "an integer", float: "a number", str: "text", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)
    return f"{kind} ({json.dumps(value)[:40]})" if isinstance(value, (int, float, str)) else kind


def parse(text: str, shape, what: str) -> tuple[object, str | None]:
    """(the value, None), or (None, why it is not JSON of `shape`)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        return None, f"is not JSON ({e})"
    problem = shape_problem(value, shape, what)
    return (None, problem) if problem else (value, None)


def read_kept(path: Path, shape, what: str, again: str = "measured again"):
    """The kept file at `path` parsed and of `shape` (`what` names its kind in messages), or None: where it is
    missing or unreadable, and where it is not JSON of its shape, which is then set aside (`set_aside`)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    value, problem = parse(text, shape, what)
    if problem:
        set_aside(path, problem, again)
    return value


def set_aside(path: Path, why: str, again: str = "measured again") -> None:
    """Rename the kept file at `path` to its name + WRONG_SUFFIX (one such copy is kept, for a look at what was
    wrong), logging why in one line; a file that cannot be renamed is left where it is."""
    path = Path(path)
    aside = path.with_name(path.name + WRONG_SUFFIX)
    try:
        os.replace(path, aside)
    except OSError as e:
        log.warning("%s: %s; it could not be set aside (%s) and is %s", path, why, e, again)
        return
    log.warning("%s: %s; set aside as %s and %s", path, why, aside.name, again)
