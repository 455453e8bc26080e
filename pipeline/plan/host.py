"""`EngineHost`: the one path from engine settings and a workload to a loaded engine and the policy its calls run.
A job's worker (pipeline/execution/worker.py) and the Ray Data stage (flexbatch/ray.py) each hold one; `flexbatch
plan` decides by the same `choose_policy`.

The host plans (or takes the settings' policy with --no-plan), loads the engine, or keeps the one it holds where
the new policy keeps what the load fixed (`load_key`), and warms it. Each engine call runs the host's policy,
passed to `Engine.generate`; as rows finish, refill is chosen again from what they really generated."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.batching import call_rows
from engine.request import Completion, Request, SamplingParams
from pipeline.plan.planning import choose_policy, plan_budgets, refill_after
from pipeline.plan.settings import EngineSettings

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.policy import Policy
    from engine.spec import ModelSpec
    from planner.predict import Prediction
    from planner.workload import Workload

log = logging.getLogger(__name__)


def load_key(model: Path, settings: EngineSettings, policy: Policy, budgets: dict, num_layers: int) -> tuple:
    """What a loaded engine fixes: the model, dtype, kernels, budgets and offload folder, and what the policy fixes
    at load (`Policy.fixed_at_load`). Hosts with equal keys can keep one engine."""
    return (str(model), settings.dtype, settings.backend, sorted(budgets.items()), str(settings.offload_dir),
            sorted(policy.fixed_at_load(num_layers).items()))


class EngineHost:
    """One engine (loaded on `take`), the policy its calls run, and what its finished rows generated."""

    def __init__(self, node_engines: int = 1):
        self.node_engines = node_engines  # engines that start together on this node and share its memory
        self.engine: Engine | None = None
        self.policy: Policy | None = None
        self.prediction: Prediction | None = None
        self.budgets: dict = {}
        self._settings: EngineSettings | None = None
        self._spec: ModelSpec | None = None
        self._key, self._given_budgets = None, None
        self.measured = (0, 0)  # rows finished since `take`, and the tokens they generated

    def take(self, model: Path, spec: ModelSpec, settings: EngineSettings, work: Workload | None) -> bool:
        """Plan for `work` (with settings.plan; else run the settings' policy) and load the engine, keeping the one
        held where the load would be the same; returns whether it was kept."""
        self._settings, self._spec, self.measured = settings, spec, (0, 0)
        self.budgets = self._budgets(settings)
        if settings.plan:
            if work is None:
                raise ValueError("a planned engine needs the workload it plans for")
            plan = choose_policy(settings, work, spec, budgets=self.budgets)
            # the planner prices the format's kernel (a pin) but counts 4-bit bytes; the user's format is what runs
            self.policy = dataclasses.replace(plan.policy, weight_format=settings.pinned("weight_format"))
            self.prediction = plan.prediction
        else:
            self.policy, self.prediction = settings.policy, None
        key = load_key(model, settings, self.policy, self.budgets, spec.num_layers)
        if key == self._key:
            return True
        self.close()
        self.engine = load_engine(model, settings, self.policy, self.budgets)
        self._key, self._given_budgets = key, settings.budgets
        warm_up(self.engine)
        return False

    def _budgets(self, settings: EngineSettings) -> dict:
        """The budgets to plan and load within: one reading of the memory room for plan and engine, and for a
        loaded engine the reading it loaded with (so that a next job with the same budget options may keep it)."""
        if self.engine is not None and self._given_budgets == settings.budgets:
            return self.budgets
        return plan_budgets(settings.budgets, engines=self.node_engines)

    def next_call_rows(self) -> int:
        """Rows to hand the engine in the next call (`engine.batching.call_rows`)."""
        return call_rows(self.policy.block_size, self.measured[0])

    def generate(self, requests: list[Request], truncate: str) -> list[Completion]:
        """Complete `requests` under the host's policy, then count what the finished rows generated and, when
        planned without a refill pin, choose refill again for the rows to come with that measured length."""
        out = self.engine.generate(requests, self.policy, truncate=truncate)
        if len(out) != len(requests):
            raise RuntimeError(f"engine returned {len(out)} completions for {len(requests)} requests")
        ok = [c for c in out if c.finish_reason != "error"]
        self.measured = (self.measured[0] + len(ok), self.measured[1] + sum(c.completion_tokens for c in ok))
        if self.prediction is not None and ok:
            self.policy = refill_after(self._settings, self.prediction.workload, self._spec, self.policy,
                                       *self.measured)
        return out

    def close(self) -> None:
        engine, self.engine, self._key = self.engine, None, None
        if engine is not None:
            engine.weights.close()


def load_engine(model: Path, settings: EngineSettings, policy: Policy, budgets: dict) -> Engine:
    """The engine of `policy`, within `budgets` (`plan_budgets`: the same with or without planning)."""
    from engine.engine import Engine  # torch is imported only when a job runs, not for --help

    started = time.perf_counter()
    engine = Engine.load(model, dtype=settings.dtype, policy=policy, budgets=budgets,
                         offload_dir=settings.offload_dir, backend=settings.backend)
    log.info("loaded %s as %s in %.1f s", model, engine.dtype, time.perf_counter() - started)
    return engine


def warm_up(engine: Engine) -> None:
    """One tiny generation, so that one-time kernel setup is part of the setup, not of the first shard."""
    engine.generate([Request(id="warm-up", prompt="Hello", params=SamplingParams(max_new_tokens=2))],
                    truncate="left")
