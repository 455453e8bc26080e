"""The one runner of the benchmarks' side-by-side lines. A line is a name and a callable: one run of the line, its
figures as a dict (seconds, tokens/s, ...), whether it computes here or drives a process of its own. This machine
is shared and noisy, so the lines run interleaved: an untimed warm-up of each line that has one, then `repeats`
rounds, each line once a round in the order given, and per line the median of each figure over the rounds."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


def side_by_side(lines: Mapping[str, Callable[[], dict]], repeats: int,
                 warm_up: Mapping[str, Callable[[], object]] | None = None) -> dict[str, dict]:
    """Each line's `warm_up` callable (untimed; the lines without one have none), in the lines' order, then every
    line once a round for `repeats` rounds. Per line, `summarize` of its rounds and, under "warm_up", what its
    warm-up returned (None without one)."""
    warm_up = warm_up or {}
    assert set(warm_up) <= set(lines), f"warm-ups {sorted(set(warm_up) - set(lines))} of no line"
    warmed = {}
    for name in (n for n in lines if n in warm_up):
        warmed[name] = warm_up[name]()
        log.info("warm-up %s%s", name, said(warmed[name]))
    runs: dict[str, list[dict]] = {name: [] for name in lines}
    for r in range(repeats):
        for name, run in lines.items():
            runs[name].append(run())
            log.info("round %d %s%s", r + 1, name, said(runs[name][-1]))
    return {name: summarize(rs) | {"warm_up": warmed.get(name)} for name, rs in runs.items()}


def summarize(runs: list[dict]) -> dict:
    """Per figure (a key whose value is a number or None): the median over the runs that give it a number, the
    largest for a peak (a figure named peak_...), the value itself where every run gives the same, None where none
    gives a number; the runs themselves under "runs"."""
    names = dict.fromkeys(k for r in runs for k, v in r.items() if v is None or is_number(v))
    out = {}
    for name in names:
        values = [r[name] for r in runs if is_number(r.get(name))]
        pick = max if name.startswith("peak_") else statistics.median
        out[name] = None if not values else values[0] if len(set(values)) == 1 else pick(values)
    return out | {"runs": runs}


def is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def said(figures) -> str:
    """A run's seconds and tokens/s, where it has them, for the log."""
    if not isinstance(figures, dict):
        return ""
    shown = [f"{figures['seconds']:.2f} s"] if is_number(figures.get("seconds")) else []
    shown += [f"{figures['tokens_per_s']:.1f} tokens/s"] if is_number(figures.get("tokens_per_s")) else []
    return ": " + ", ".join(shown) if shown else ""
