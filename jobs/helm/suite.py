"""The HELM-style benchmark job: for each run of the spec, adapt its scenario (or take a HELM run's requests),
complete the requests through the pipeline, evaluate them with HELM's metrics, and write HELM's run folder; then
write the suite summary.

Every run is checked (spec, scenario files, scenario states, model folders) before any model is loaded. The runs
of one invocation share one Ray connection and its engines (`pipeline.execution.driver.WorkerPool`: a run keeps the loaded
model where its model, settings and weight placement equal the last run's). A run whose shards failed every try is reported and its HELM files
are not written; rerunning the same command resumes it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from jobs.helm.adapter import adapt
from jobs.helm.echo_requests import SCORING_METHODS
from jobs.helm.errors import SpecError
from jobs.helm.evaluate import evaluate
from jobs.helm.execute import attach_results, read_completions, run_requests
from jobs.helm.metrics import EXACT_MATCH_METRICS
from jobs.helm.output import (
    INFO_FILE,
    RunSummary,
    helm_metric_specs,
    is_run_completed,
    metric_summaries,
    plan_text,
    read_run_summary,
    write_run,
    write_summary,
)
from jobs.helm.run_entries import HelmSpec, RunEntry, check_suite
from jobs.helm.scenarios import BUILTIN, CORRECT_TAG, downsample_eval, load_instances, scenario_path
from jobs.helm.schema import run_groups, write_suite_schema
from jobs.helm.state import (
    downsample_states,
    read_scenario_state,
    renamed_model,
    source_file,
    source_metrics,
)
from pipeline.execution.driver import WorkerPool
from pipeline.plan.settings import EngineSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HelmOptions:
    output: Path
    suite: str
    engine: EngineSettings = field(default_factory=EngineSettings)
    skip_completed_runs: bool = False
    constrain: bool = True  # multiple_choice_joint answers are one of the letters, enforced while decoding

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", Path(self.output).expanduser().resolve())
        check_suite(self.suite)

    @property
    def suite_dir(self) -> Path:
        return self.output / "runs" / self.suite


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to execute: its request states (no results yet) and what its HELM files say about it."""

    entry: RunEntry
    run_dir: Path
    states: list
    state_head: dict  # scenario_state.json's fields other than request_states: adapter_spec, ...
    metrics: tuple[str, ...]
    run_spec: dict
    scenario: dict
    chance: float | None


@dataclass(frozen=True)
class SuiteResult:
    runs: tuple[RunSummary, ...]
    table: str
    markdown: Path
    json: Path
    schema: Path  # HELM's schema of the suite's groups, for helm-summarize --schema-path

    @property
    def ok(self) -> bool:
        return all(r.status != "failed" for r in self.runs)


def run_suite(spec: HelmSpec, options: HelmOptions) -> SuiteResult:
    """Run every entry of `spec` not skipped as completed, then write the suite summary."""
    done: dict[str, RunSummary] = {}
    todo = []
    for entry in spec.entries:
        run_dir = options.suite_dir / entry.run_name
        if options.skip_completed_runs and is_run_completed(run_dir):
            log.info("skipping run %s: completed earlier (all of its output files exist)", entry.run_name)
            done[entry.run_name] = read_run_summary(run_dir)
        else:
            todo.append(prepare_run(entry, run_dir))
    with _ray_session(options.engine, bool(todo)), WorkerPool() as pool:
        for prepared in todo:
            done[prepared.entry.run_name] = execute_run(prepared, options.engine, pool, options.constrain)
    runs = tuple(done[e.run_name] for e in spec.entries)
    table, md, js = write_summary(options.suite_dir, options.suite, list(runs))
    schema = write_suite_schema(options.suite_dir, run_groups([options.suite_dir / e.run_name for e in spec.entries]))
    return SuiteResult(runs=runs, table=table, markdown=md, json=js, schema=schema)


def prepare_run(entry: RunEntry, run_dir: Path) -> PreparedRun:
    try:
        if entry.scenario_state is not None:
            return _prepare_from_state(entry, run_dir)
        return _prepare_from_scenario(entry, run_dir)
    except SpecError as e:
        raise SpecError(f"run {entry.run_name}: {e}") from None


def _prepare_from_scenario(entry: RunEntry, run_dir: Path) -> PreparedRun:
    label = entry.model.name
    adapter = dataclasses.replace(entry.adapter, model=entry.adapter.model or label,
                                  model_deployment=entry.adapter.model_deployment or label)
    documents = adapter.method == "language_modeling"  # the input is scored, its references are not used
    instances = downsample_eval(load_instances(entry.scenario, answers=not documents), adapter.max_eval_instances,
                                adapter.splits_evaluated)
    states = adapt(adapter, instances, label, entry.model)
    metrics = entry.metrics or default_metrics(adapter.method)
    path = scenario_path(entry.scenario)
    builtin = BUILTIN.get(entry.scenario)
    class_name = "jobs.helm.scenarios.BuiltinScenario" if builtin else "jobs.helm.scenarios.FileScenario"
    args = {"name": entry.scenario} if builtin else {"path": str(path)}
    scenario = {"name": entry.scenario_label, "description": builtin.description if builtin else f"instances of {path}",
                "tags": [], "definition_path": str(path)}
    return PreparedRun(entry=entry, run_dir=run_dir, states=states, state_head={"adapter_spec": adapter.to_helm()},
                       metrics=metrics,
                       run_spec=_run_spec(entry, {"class_name": class_name, "args": args}, adapter.to_helm(), metrics,
                                          [entry.scenario_label]),
                       scenario=scenario, chance=_chance(entry, adapter.method, states))


def _prepare_from_state(entry: RunEntry, run_dir: Path) -> PreparedRun:
    """A HELM run's request states; its run_spec.json and scenario.json, when beside it, name the scenario."""
    path = entry.scenario_state
    state = renamed_model(downsample_states(read_scenario_state(path), entry.adapter.max_eval_instances),
                          entry.model.name)
    method = state["adapter_spec"].get("method", "generation")
    metrics = entry.metrics or (default_metrics(method) if method in SCORING_METHODS else source_metrics(path))
    source = source_file(path, "run_spec.json")
    scenario_spec = source.get("scenario_spec") or {"class_name": "jobs.helm.state.ScenarioStateFile",
                                                    "args": {"path": str(path)}}
    scenario = source_file(path, "scenario.json") or {
        "name": entry.scenario_label, "description": f"the requests of the HELM run in {path.parent}", "tags": [],
        "definition_path": str(path)}
    head = {k: v for k, v in state.items() if k != "request_states"}
    return PreparedRun(entry=entry, run_dir=run_dir, states=state["request_states"], state_head=head,
                       metrics=metrics, run_spec=_run_spec(entry, scenario_spec, head["adapter_spec"], metrics,
                                                           source.get("groups") or []),
                       scenario=scenario, chance=_chance(entry, method, state["request_states"]))


def default_metrics(method: str) -> tuple[str, ...]:
    """The metrics a run shows when its entry names none: HELM's exact-match set; none for language modelling
    (its stats are HELM's logprob, perplexity and bits per byte); exact_match for the choices of
    `multiple_choice_separate_*` (HELM's reference metric computes it)."""
    if method == "language_modeling":
        return ()
    return ("exact_match",) if method.startswith("multiple_choice_separate") else EXACT_MATCH_METRICS


def _run_spec(entry: RunEntry, scenario_spec: dict, adapter_spec: dict, metrics, groups: list) -> dict:
    method = adapter_spec.get("method", "generation")
    reference_metric = method.startswith("multiple_choice_separate")  # HELM's BasicReferenceMetric scores them
    return {"name": entry.run_name, "scenario_spec": scenario_spec, "adapter_spec": adapter_spec,
            "metric_specs": helm_metric_specs(() if reference_metric else metrics, method),
            "groups": list(groups)}


def _chance(entry: RunEntry, method: str, states: list[dict]) -> float | None:
    """The spec's `chance`; for multiple choice, the mean share of right choices; for a built-in scenario, its
    recorded chance; else unknown."""
    if entry.chance is not None:
        return float(entry.chance)
    if method.startswith("multiple_choice") and states:
        shares = [sum(CORRECT_TAG in r.get("tags", []) for r in refs) / len(refs)
                  for refs in (s["instance"]["references"] for s in states)]
        return sum(shares) / len(shares)
    builtin = BUILTIN.get(entry.scenario)
    return builtin.chance if builtin else None


def execute_run(run: PreparedRun, engine: EngineSettings, pool: WorkerPool | None = None,
                constrain: bool = True) -> RunSummary:
    """Complete the run's requests (on `pool`'s engines, shared by the suite's runs), evaluate them, write its HELM
    files; a run with failed shards writes none."""
    entry = run.entry
    engine = dataclasses.replace(engine, pins=engine.pins.with_(compress_weight=entry.compress_weight,
                                                               compress_cache=entry.compress_cache))
    log.info("run %s: %d requests of %s on %s", entry.run_name, len(run.states), entry.scenario_label, entry.model)
    summary = run_requests(run.run_dir, run.states, entry.model, engine, pool, constrain)
    tokens_per_s, plan = summary.job_tokens_per_s, plan_text(summary.workers)
    if not summary.run_completion_tokens:  # every shard was committed earlier: keep what that run measured
        tokens_per_s, plan = _earlier_measure(run.run_dir, tokens_per_s, plan)
    base = {"name": entry.run_name, "model": str(entry.model), "chance": run.chance, "error_rows": summary.error_rows,
            "tokens_per_s": tokens_per_s, "plan": plan}
    if not summary.ok:
        error = f"{len(summary.failed_shards)} shards failed every try (see {summary.output}); rerun to retry them"
        return RunSummary(status="failed", error=error, **base)
    from engine.tokenizer import load_tokenizer

    states = attach_results(run.states, read_completions(summary), load_tokenizer(entry.model))
    per_instance, stats = evaluate(states, run.metrics, run.state_head["adapter_spec"], entry.model)
    info = {**base, "metrics": list(run.metrics), "dtype": engine.dtype, "compress_weight": engine.pinned("compress_weight"),
            "compress_cache": engine.pinned("compress_cache"), "rows": summary.rows, "prompt_tokens": summary.prompt_tokens,
            "completion_tokens": summary.completion_tokens, "workers": list(summary.workers)}
    write_run(run.run_dir, {"run_spec.json": run.run_spec, "scenario.json": run.scenario,
                            "scenario_state.json": {**run.state_head, "request_states": states},
                            "stats.json": stats, "per_instance_stats.json": per_instance}, info)
    return RunSummary(status="done", metrics=metric_summaries(per_instance, run.metrics),
                      instances=len({p["instance_id"] for p in per_instance}), **base)


def _earlier_measure(run_dir: Path, tokens_per_s: float, plan: str) -> tuple[float, str]:
    try:
        info = json.loads((run_dir / INFO_FILE).read_text())
        return float(info["tokens_per_s"]), str(info["plan"])
    except (OSError, ValueError, KeyError, TypeError):
        return tokens_per_s, plan


@contextmanager
def _ray_session(engine: EngineSettings, needed: bool):
    """One Ray connection for all runs (each run's job then neither starts nor stops Ray)."""
    if not (needed and engine.use_ray):
        yield
        return
    from pipeline.execution.ray_runtime import connect

    where, joined = connect(engine.address)
    log.info("the runs share %s", where)
    try:
        yield
    finally:
        if joined:
            import ray

            ray.shutdown()
