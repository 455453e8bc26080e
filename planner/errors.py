"""User-facing errors of the planner. Each message names the bad value, what was expected, and the fix."""

from __future__ import annotations

from engine.errors import FlexbatchError
from engine.memory.tiers import human


class PlannerError(FlexbatchError):
    """Base class of the planner's errors."""


class HardwareSpecError(PlannerError):
    """A hardware spec file is missing, not JSON, or has a bad or missing figure."""


class PlanInfeasible(PlannerError):
    """No policy fits: `tier` is the memory tier that is short, by `short_bytes` (need - have) at best."""

    def __init__(self, tier: str, need_bytes: float, have_bytes: float, detail: str = ""):
        self._init_args = (tier, need_bytes, have_bytes, detail)
        self.tier, self.need_bytes, self.have_bytes = tier, float(need_bytes), float(have_bytes)
        self.short_bytes = max(0.0, self.need_bytes - self.have_bytes)
        fix = {"gpu": "raise --gpu-mem, pin less to the gpu, or compress",
               "cpu": "raise --cpu-mem, allow disk offloading, or compress weights and cache",
               "disk": "raise --disk-mem or free disk space"}[tier]
        super().__init__(
            f"no policy fits: the {tier} tier is short by {human(self.short_bytes)} (the leanest plan needs "
            f"{human(self.need_bytes)}, it has {human(self.have_bytes)}){'; ' + detail if detail else ''}; "
            f"{fix}, or generate fewer tokens (a job's --max-new-tokens; --gen-len and --num-prompts of "
            "`flexbatch plan`)")

    def __reduce__(self):
        """Pickled by its own arguments, so that it crosses process boundaries (a Ray actor's error)."""
        return (type(self), self._init_args)


class SolverError(PlannerError):
    """The solver failed for a reason other than infeasibility."""
