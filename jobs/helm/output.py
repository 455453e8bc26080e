"""HELM's output layout, and the suite summary.

`<output>/runs/<suite>/<run>/` holds HELM's files, with HELM's field names: `run_spec.json`, `scenario.json`,
`scenario_state.json`, `stats.json` and `per_instance_stats.json` (a run is complete when all five exist, as
HELM's `--skip-completed-runs` checks), plus flexbatch's own `flexbatch.json` (model, compression, tokens/s,
each engine's plan), `requests.parquet` and the pipeline job's `completions/`. The suite summary, one row per
run, is written to `<output>/runs/<suite>/flexbatch_summary.md` and `flexbatch_summary.json`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

RUN_FILES = ("run_spec.json", "scenario.json", "scenario_state.json", "stats.json", "per_instance_stats.json")
INFO_FILE = "flexbatch.json"
# helm-summarize writes summary.json (and groups.json, runs.json ...) in the suite folder: ours are named apart
SUMMARY_MD = "flexbatch_summary.md"
SUMMARY_JSON = "flexbatch_summary.json"


@dataclass(frozen=True)
class MetricSummary:
    name: str
    mean: float | None
    count: int


@dataclass(frozen=True)
class RunSummary:
    """One row of the suite summary. `status` is `done`, `skipped` (completed by an earlier invocation) or
    `failed` (shards failed every try; the run's HELM files are not written)."""

    name: str
    model: str
    status: str
    metrics: tuple[MetricSummary, ...] = ()
    chance: float | None = None
    instances: int = 0
    error_rows: int = 0
    tokens_per_s: float = 0.0
    plan: str = ""
    error: str | None = None


BASIC_METRICS = "helm.benchmark.metrics.basic_metrics."


def helm_metric_specs(names, method: str = "generation") -> list[dict]:
    """run_spec.json's `metric_specs` for HELM's basic metrics with these reference metrics (HELM's
    `get_basic_metric_specs` + `get_generic_metric_specs`: what jobs/helm/evaluate.py computes); for
    `language_modeling`, HELM's `get_language_modeling_metric_specs`."""
    if method == "language_modeling":
        return [{"class_name": "helm.benchmark.metrics.language_modeling_metrics.LanguageModelingMetric",
                 "args": {"names": list(names)}}]
    return [{"class_name": BASIC_METRICS + "BasicGenerationMetric", "args": {"names": list(names)}},
            {"class_name": BASIC_METRICS + "BasicReferenceMetric", "args": {}},
            {"class_name": BASIC_METRICS + "InstancesPerSplitMetric", "args": {}}]


def write_json(path: Path, obj) -> None:
    """Atomically: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def is_run_completed(run_dir: Path) -> bool:
    return all((run_dir / name).is_file() for name in RUN_FILES)


def write_run(run_dir: Path, files: dict[str, object], info: dict) -> None:
    """The five HELM files (`files` maps each name to its content) and flexbatch.json; stats.json and
    per_instance_stats.json last, so that a run interrupted while writing is not complete."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / INFO_FILE, info)
    for name in RUN_FILES:
        write_json(run_dir / name, files[name])


def metric_summaries(per_instance: list[dict], names: tuple[str, ...]) -> tuple[MetricSummary, ...]:
    """Each metric's mean over every (instance, train trial) of the run, with the number of values."""
    out = []
    for name in names:
        values = [s["sum"] for rec in per_instance for s in rec["stats"] if s["name"]["name"] == name]
        out.append(MetricSummary(name, sum(values) / len(values) if values else None, len(values)))
    return tuple(out)


def read_run_summary(run_dir: Path) -> RunSummary:
    """The summary row of a run completed earlier, from its files."""
    info = json.loads((run_dir / INFO_FILE).read_text()) if (run_dir / INFO_FILE).is_file() else {}
    per_instance = json.loads((run_dir / "per_instance_stats.json").read_text())
    names = tuple(info.get("metrics") or _metric_names(run_dir))
    return RunSummary(name=run_dir.name, model=info.get("model", "?"), status="skipped",
                      metrics=metric_summaries(per_instance, names), chance=info.get("chance"),
                      instances=len({r["instance_id"] for r in per_instance}), error_rows=info.get("error_rows", 0),
                      tokens_per_s=info.get("tokens_per_s", 0.0), plan=info.get("plan", ""))


def _metric_names(run_dir: Path) -> list[str]:
    spec = json.loads((run_dir / "run_spec.json").read_text())
    return [n for m in spec.get("metric_specs", []) for n in (m.get("args") or {}).get("names", [])]


def plan_text(workers: tuple[dict, ...] | list[dict]) -> str:
    """The engines' policies in a few words: `2 engines: cpu/cpu, block 8x2, 4-bit w+kv`."""
    if not workers:
        return ""
    texts = sorted({_policy_text(w.get("policy") or {}) for w in workers})
    count = f"{len(workers)} engine{'s' if len(workers) > 1 else ''}"
    return f"{count}: {'; '.join(texts)}"


def _policy_text(p: dict) -> str:
    text = f"{p.get('prefill_device', 'cpu')}/{p.get('decode_device', 'cpu')}, block {p.get('gbs')}x{p.get('num_gb')}"
    tiers = [f"{kind} {round(100 * p.get(f'{kind}_gpu', 0))}% gpu" for kind in ("weight", "cache")
             if p.get(f"{kind}_gpu")]
    disk = [f"{kind} {round(100 * (1 - p.get(f'{kind}_gpu', 0) - p.get(f'{kind}_cpu', 1)))}% disk"
            for kind in ("weight", "cache") if p.get(f"{kind}_gpu", 0) + p.get(f"{kind}_cpu", 1) < 0.999]
    compressed = "+".join(n for n, k in (("w", "compress_weight"), ("kv", "compress_cache")) if p.get(k))
    return ", ".join([text, *tiers, *disk] + ([f"4-bit {compressed}"] if compressed else []))


def summary_markdown(runs: list[RunSummary]) -> str:
    """One row per run: each metric's mean (count), chance, error rows, tokens/s and the plan."""
    names = list(dict.fromkeys(m.name for r in runs for m in r.metrics))
    header = ["run", "status", *names, "chance", "errors", "tokens/s", "plan"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in runs:
        by_name = {m.name: m for m in r.metrics}
        cells = [_metric_cell(by_name.get(n)) for n in names]
        chance = f"{r.chance:.3f}" if r.chance is not None else "-"
        status = r.status if not r.error else f"{r.status}: {r.error}"
        lines.append("| " + " | ".join([r.name, status, *cells, chance, str(r.error_rows), f"{r.tokens_per_s:.1f}",
                                        r.plan or "-"]) + " |")
    return "\n".join(lines) + "\n"


def _metric_cell(m: MetricSummary | None) -> str:
    if m is None or m.mean is None:
        return "-"
    return f"{m.mean:.3f} ({m.count})"


def write_summary(suite_dir: Path, suite: str, runs: list[RunSummary]) -> tuple[str, Path, Path]:
    """Write the suite summary (Markdown and JSON) in the suite folder; returns the Markdown and both paths."""
    suite_dir.mkdir(parents=True, exist_ok=True)
    text = summary_markdown(runs)
    md, js = suite_dir / SUMMARY_MD, suite_dir / SUMMARY_JSON
    md.write_text(f"# Suite {suite}\n\n{text}")
    write_json(js, {"suite": suite, "runs": [asdict(r) for r in runs]})
    return text, md, js
