"""An option a user gives flexbatch, declared once: as metadata on the dataclass field it sets (`option()`), the
field's default being the option's default, or as a module-level `Option` where no field holds it alone. A
declaration says the option's kind, bounds or choices, help and command-line flag; the click options, the checks of
the Python API, the Ray Data stage and lm-eval's model_args, and HELM's entry fields are all made from it, so that a
bad value is one `OptionError` wherever it came in, naming the option as that caller spelled it."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass
from numbers import Integral, Real

from engine.errors import ConfigError, InvalidParamsError

# where an option can come in: a command-line flag, a keyword of flexbatch.run, a keyword of the Ray Data stage
# (spelled as in Python), lm-eval's --model_args
SURFACES = ("cli", "python", "ray", "model_args")
OPTION_DEFAULT = object()  # a Flag's default where it is the option's own


@dataclass(frozen=True)
class Flag:
    """How the command line spells an option: `name` ("--gbs", or a pair "--plan/--no-plan"). `words` are the
    values the flag takes when they are not the option's own (--refill on -> True; a word mapped to None pins
    nothing), `word_field` a second field the word itself sets (--compress-weight int8 -> weight_format),
    `flag_value` the word of the flag given alone. `default` is the flag's own default where it differs (None:
    the planner chooses unless the flag is given), `default_text` the help's "[default: ...]" for it. `checked`:
    click refuses a value out of bounds itself (a usage error before anything runs)."""

    name: str
    metavar: str | None = None
    words: tuple[tuple[str, object], ...] = ()
    word_field: str = ""
    flag_value: str | None = None
    default: object = OPTION_DEFAULT
    default_text: str | None = None
    checked: bool = False
    nargs: int = 1


@dataclass(frozen=True)
class Option:
    """One option: its keyword `name`, `default`, `kind` (int, number, bool, choice, texts, text, path, location: a
    path or a URI, size), bounds (`low`, `high`; `low_open` leaves `low` out) or `choices`, whether None is a value
    (`optional`), the help, and its `flag`. `keyword` is its Python spelling where that is not `name` (budgets['cpu'],
    guided['choice']); `via` the flag that sets it together with others where it has none of its own (--percent).
    `absent` says, per surface, why the option is deliberately not taken there."""

    name: str
    kind: str
    help: str
    default: object = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple = ()
    optional: bool = False
    hint: str = ""
    flag: Flag | None = None
    keyword: str = ""
    via: str = ""
    absent: tuple[tuple[str, str], ...] = ()

    def check(self, value):
        """`value` if it suits this option (whole numbers as int, strings as a tuple), else an `OptionError`."""
        if value is None and self.optional:
            return None
        good, value = _CHECKS[self.kind](self, value)
        if not good:
            raise OptionError(self, value)
        return value

    def expected(self, surface: str = "python") -> str:
        """What a good value is, in words (None too where it is one and the caller can write it)."""
        text = _EXPECTED[self.kind](self)
        text += f" ({self.hint})" if self.hint else ""
        return text + (", or None" if self.optional and surface != "cli" else "")

    def spelled(self, surface: str) -> str:
        """The option's name as a caller on `surface` writes it."""
        if surface == "cli" and (self.flag or self.via):
            return self.flag.name.split("/")[0] if self.flag else self.via
        if surface == "model_args":
            return f"model_args {self.name}"
        return self.keyword or self.name

    def takes(self, surface: str) -> bool:
        return surface not in dict(self.absent)


class OptionError(ConfigError, InvalidParamsError):
    """A bad value of a declared option: the message names the option as the caller spelled it (`surface`), the
    value, and what is expected instead."""

    def __init__(self, option: Option, value, surface: str = "python"):
        self.option, self.value, self.surface = option, value, surface
        super().__init__(f"{option.spelled(surface)}={value!r} is invalid: expected {option.expected(surface)}")

    def given(self, surface: str) -> OptionError:
        """The same error, named as a caller on `surface` spelled the option."""
        return OptionError(self.option, self.value, surface)


def option(default, **declared) -> dataclasses.Field:
    """A dataclass field declared as an option (`Option`'s arguments but its name and default, which are the
    field's); `default=dataclasses.MISSING` makes it a required field (and a required flag)."""
    return dataclasses.field(default=default, metadata={"option": declared})


def option_field(declared: Option) -> dataclasses.Field:
    """A dataclass field that holds the module-level option `declared` (declared where the code that reads the value
    lives, e.g. the dtype in engine/dtypes.py); the field's name must be the option's."""
    return dataclasses.field(default=declared.default, metadata={"option": declared})


@functools.cache
def options_of(cls) -> dict[str, Option]:
    """The options declared on `cls`'s fields, by field name, in field order."""
    out = {}
    for f in dataclasses.fields(cls):
        declared = f.metadata.get("option")
        if isinstance(declared, Option):
            assert declared.name == f.name, (declared.name, f.name)
            out[f.name] = declared
        elif declared is not None:
            out[f.name] = Option(name=f.name, default=f.default, **declared)
    return out


def check_fields(obj) -> None:
    """Check every declared field of the frozen dataclass `obj`, storing what the checks normalise."""
    for name, opt in options_of(type(obj)).items():
        object.__setattr__(obj, name, opt.check(getattr(obj, name)))


def _int(o: Option, v):
    good = isinstance(v, Integral) and not isinstance(v, bool) and _within(o, v)
    return good, int(v) if good else v


def _number(o: Option, v):
    good = isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) and _within(o, v)
    return good, v


def _within(o: Option, v) -> bool:
    above = o.low is None or (v > o.low if o.low_open else v >= o.low)
    return above and (o.high is None or v <= o.high)


def _texts(o: Option, v):
    """A list of non-empty strings as a tuple; a bad one is named alone (stop='' rather than the whole list)."""
    if not isinstance(v, (list, tuple)):
        return False, v
    bad = [s for s in v if not isinstance(s, str) or not s]
    return not bad, bad[0] if bad else tuple(v)


def _size(o: Option, v):
    if isinstance(v, bool) or not isinstance(v, (str, Real)):
        return False, v
    try:
        size = parse_bytes(v)
    except InvalidParamsError:
        return False, v
    if size is not None and not (math.isfinite(size) and size > 0):
        return False, v
    return True, size


_CHECKS = {
    "int": _int,
    "number": _number,
    "bool": lambda o, v: (isinstance(v, bool), v),
    "choice": lambda o, v: (isinstance(v, str) and v in o.choices, v),
    "texts": _texts,
    "text": lambda o, v: (isinstance(v, str) and bool(v), v),
    "path": lambda o, v: (isinstance(v, (str, os.PathLike)) and bool(os.fspath(v)), v),
    "location": lambda o, v: (isinstance(v, (str, os.PathLike)) and bool(os.fspath(v)), v),
    "size": _size,
}


def _expected_number(o: Option) -> str:
    if o.low is not None and o.high is not None:
        return f"a number in {'(' if o.low_open else '['}{o.low:g}, {o.high:g}]"
    return f"a number {'>' if o.low_open else '>='} {o.low:g}" if o.low is not None else "a number"


_EXPECTED = {
    "int": lambda o: (f"a whole number in [{o.low:g}, {o.high:d}]" if o.low is not None and o.high is not None
                      else f"a whole number >= {o.low:g}" if o.low is not None else "a whole number"),
    "number": _expected_number,
    "bool": lambda o: "True or False",
    "choice": lambda o: f"one of {', '.join(o.choices)}",
    "texts": lambda o: "a list of non-empty strings, e.g. ['\\n']",
    "text": lambda o: "a non-empty string",
    "path": lambda o: "a non-empty path (a str or pathlib.Path)",
    "location": lambda o: "a path or a URI such as s3://bucket/prefix (a str or pathlib.Path)",
    "size": lambda o: "a size in bytes, e.g. 8GiB, 512MB or 2e9",
}

_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str | float | int | None, name: str = "memory") -> float | None:
    """'24GiB', '512MB', '1e9' -> bytes; None or '' -> None (no limit)."""
    if text is None or text == "":
        return None
    if isinstance(text, (int, float)):
        return float(text)
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num):]
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise InvalidParamsError(f"{name}={text!r} is not a size; write e.g. 512MiB, 4GiB or 2e9") from None
    if value <= 0:
        raise InvalidParamsError(f"{name}={text!r} must be positive")
    return value
