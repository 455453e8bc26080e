"""What every benchmark reports: a line of ours against a baseline, and the JSON report written to disk."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import FlexbatchError
from jobs.common import fail
from planner.microbench import timed_call


@dataclass
class Line:
    """One row of the table: ours against a baseline, ratio = ours / baseline (for memory, lower is better)."""

    id: str
    what: str
    unit: str
    ours: float | None
    baseline: float | None
    target: float | None = None
    detail: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return self.ours / self.baseline if self.ours and self.baseline else None

    @property
    def met(self) -> bool | None:
        return None if self.target is None or self.ratio is None else self.ratio >= self.target

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "ratio": self.ratio, "met": self.met}


def run_and_save(run, cfg, output: Path) -> dict:
    """Run a benchmark, write its JSON report, with the run's wall seconds, to `output` and return it; a user error
    exits 2."""
    try:
        report, seconds = timed_call(lambda: run(cfg))
    except FlexbatchError as e:
        fail(e)
    report["wall_seconds"] = seconds
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1, default=str))
    return report
