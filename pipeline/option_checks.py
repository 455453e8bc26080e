"""Type checks of a job's options (`RunConfig`, `EngineSettings`) for callers of the Python API, where nothing
has parsed the values: a value of the wrong type is refused with a `ConfigError` naming it and the fix, before
it can mean something else (the string "no" is true) or fail deep inside a run with a bare TypeError."""

from __future__ import annotations

import math
import os
from numbers import Integral, Real

from engine.errors import InvalidParamsError
from engine.policy import TIERS, parse_bytes
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


def tier_budgets(value) -> dict[str, float | None]:
    """`budgets` as bytes per tier: a dict of tier -> bytes (a number), a size ('16GiB', '512MB') or None (no
    limit), over the tiers gpu, cpu and disk; None is no budgets."""
    if value is None:
        return {}
    example = "e.g. budgets={'cpu': '8GiB', 'gpu': 16e9}"
    if not isinstance(value, dict):
        raise ConfigError(f"budgets={value!r} is invalid: expected a dict of tier -> size; {example}")
    unknown = sorted(str(k) for k in value if k not in TIERS)
    if unknown:
        raise ConfigError(f"budgets names unknown tiers {unknown}: expected the tiers {', '.join(TIERS)}; {example}")
    out = {}
    for tier, size in value.items():
        if isinstance(size, bool) or not (size is None or isinstance(size, (str, Real))):
            raise ConfigError(f"budgets[{tier!r}]={size!r} is invalid: expected bytes, a size such as '8GiB', "
                              f"or None for no limit")
        try:
            out[tier] = parse_bytes(size, f"budgets[{tier!r}]")
        except InvalidParamsError as e:
            raise ConfigError(str(e)) from None
        if out[tier] is not None and not (math.isfinite(out[tier]) and out[tier] > 0):
            raise ConfigError(f"budgets[{tier!r}]={size!r} is invalid: expected a size > 0, or None for no limit")
    return out
