"""Type checks of a job's own options (`RunConfig`; the engine's options are declared on their fields, checked by
engine/options.py) for callers of the Python API, where nothing has parsed the values: a value of the wrong type is refused with a `ConfigError` naming it and the fix, before
it can mean something else (the string "no" is true) or fail deep inside a run with a bare TypeError."""

from __future__ import annotations

import math
import os
from numbers import Integral, Real

from pipeline.errors import ConfigError


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is invalid: expected True or False")


def whole_number(name: str, value, low: int, what: str, optional: bool = False) -> int | None:
    """`value` as an int (numpy integers too) of at least `low`; None where `optional`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        none = ", or None" if optional else ""
        raise ConfigError(f"{name}={value!r} is invalid: expected {what} (a whole number >= {low}{none})")
    return int(value)


def number_at_least(name: str, value, low: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < low:
        raise ConfigError(f"{name}={value!r} is invalid: expected {what} (a number >= {low:g})")
    return float(value)


def check_path(name: str, value, what: str, optional: bool = False) -> None:
    """A path or URI: a str or os.PathLike, not empty."""
    if value is None and optional:
        return
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        none = ", or None" if optional else ""
        raise ConfigError(f"{name}={value!r} is invalid: expected {what} (a str or pathlib.Path{none})")


def check_optional_text(name: str, value, what: str) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{name}={value!r} is invalid: expected {what} (a str), or None")
