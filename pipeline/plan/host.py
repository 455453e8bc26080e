"""`EngineHost`: the engine service every caller of an engine goes through: a job's worker
(pipeline/execution/worker.py), the Ray Data stage (flexbatch/ray.py) and the lm-eval model (flexbatch/lm_eval.py)
each hold one and only adapt their rows to it; `flexbatch plan` decides by the same `choose_policy`.

The host plans (from a job's sample, or on the first rows it is handed; the settings' policy with --no-plan), loads
the engine, or keeps the one it holds where the new policy keeps what the load fixed (`load_key`), and warms it.
It then completes rows in engine calls as long as `engine.batching.call_rows` says, each under the host's
policy; as rows finish, refill is chosen again from what they really generated."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.batching import call_rows
from engine.request import Completion, Request, SamplingParams
from pipeline.input.sample import requests_sample, with_prompt_ids
from pipeline.plan.planning import (
    choose_policy,
    plan_budgets,
    planned_policy,
    refill_after,
    unplanned_policy,
    workload_dtype,
    workload_from_sample,
)
from pipeline.plan.settings import EngineSettings

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.policy import Policy
    from engine.spec import ModelSpec
    from planner.predict import Prediction
    from planner.workload import Workload

log = logging.getLogger(__name__)
SHARING_COUNTS = ("shared_tokens", "saved_tokens")  # of `Engine.schedule_counts`, summed over a run's calls


@dataclass(frozen=True)
class Completed:
    """What `EngineHost.complete` did: one completion per item, in order, the seconds its engine calls took, and
    what shared prefixes saved in them (engine/loop/shared_prefix.py)."""

    completions: list[Completion]
    seconds: float
    shared_tokens: int = 0  # shared prefixes' tokens, computed once per block
    saved_tokens: int = 0  # prompt tokens rows did not compute because their block's prefix was shared


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
            self.policy, self.prediction = planned_policy(settings, plan.policy), plan.prediction
        else:
            self.policy, self.prediction = unplanned_policy(settings, spec), None
        key = load_key(model, settings, self.policy, self.budgets, spec.num_layers)
        if key == self._key:
            return True
        self.close()
        self.engine = load_engine(model, settings, self.policy, self.budgets)
        self._key, self._given_budgets = key, settings.budgets
        warm_up(self.engine)
        return False

    def take_first(self, model: Path, spec: ModelSpec, settings: EngineSettings, items: list,
                   default: SamplingParams | None = None) -> list:
        """`take`, planned (with settings.plan) on the first rows a caller has, for calls shaped like them: `items`
        (requests, and rows already failed) sampled as a job samples its input (`requests_sample`; `default`'s
        lengths where no row runs). Returns `items`, each request carrying the token ids planning measured, so
        that the engine does not tokenize a prompt twice."""
        work = None
        if settings.plan:
            from engine.tokenizer import load_tokenizer

            items = with_prompt_ids(items, load_tokenizer(model), spec.vocab_size)
            runs = sum(isinstance(item, Request) for item in items)
            work = workload_from_sample(requests_sample(items, default or SamplingParams()), spec,
                                        workload_dtype(settings.dtype), max(1, runs))
        self.take(model, spec, settings, work)
        return items

    def _budgets(self, settings: EngineSettings) -> dict:
        """The budgets to plan and load within: one reading of the memory room for plan and engine, and for a
        loaded engine the reading it loaded with (so that a next job with the same budget options may keep it)."""
        if self.engine is not None and self._given_budgets == settings.budgets:
            return self.budgets
        return plan_budgets(settings.budgets, engines=self.node_engines)

    def complete(self, items: list, truncate: str, label: str = "") -> Completed:
        """Complete the requests among `items` (a row already failed, a `Completion`, is kept as it is): one
        completion per item, in order. Calls are as long as `engine.batching.call_rows` says: one block until a
        block's rows have finished (refill is then chosen from what they generated), then several; with more than
        one call, each is logged as `label`'s progress."""
        slots = [i for i, item in enumerate(items) if isinstance(item, Request)]
        done, seconds, counts = list(items), 0.0, dict.fromkeys(SHARING_COUNTS, 0)
        start = 0
        while start < len(slots):
            chunk = slots[start : start + call_rows(self.policy.block_size, self.measured[0])]
            began = time.perf_counter()
            out = self._generate([items[i] for i in chunk], truncate)
            seconds += time.perf_counter() - began
            for name in counts:
                counts[name] += self.engine.schedule_counts.get(name, 0)
            for i, completion in zip(chunk, out):
                done[i] = completion
            start += len(chunk)
            if len(slots) > len(chunk):
                log.info("%s: %d/%d rows done", label or "engine", start, len(slots))
        return Completed(done, seconds, **counts)

    def _generate(self, requests: list[Request], truncate: str) -> list[Completion]:
        """One engine call under the host's policy; then count what the finished rows generated and, when planned
        without a refill pin, choose refill again for the rows to come with that measured length."""
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
