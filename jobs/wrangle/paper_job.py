"""Dataset mode of `flexbatch wrangle`: the paper's datasets, prompts, flags and metrics, as one pipeline job.

`--data-dir` names one dataset folder (or, with `--all`, the paper's data/datasets folder: every dataset found).
Every prompt of every dataset and trial goes into one `OUTPUT/prompts.parquet` (`id`, `prompt`; id
`<dataset>/<trial>/<row>`, rows in the split's order) and runs as one job into `OUTPUT/completions/` (a rerun
resumes it). Answers are judged by the paper's rules into `OUTPUT/predictions.parquet`, `OUTPUT/metrics.json`
({dataset: per-trial prec/rec/f1/acc and their _avg/_std}) and `OUTPUT/summary.tsv`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from engine.request import SamplingParams
from jobs.wrangle.data import Format, WrangleInputError
from jobs.wrangle.datasets import Dataset, dataset_of, find_datasets
from jobs.wrangle.files import COMPLETIONS_DIR, read_completions, write_parquet, write_prompts
from jobs.wrangle.paper_metrics import compute_metrics, trial_summary
from jobs.wrangle.paper_prompts import (
    SAMPLE_METHODS,
    load_manual_prompts,
    manual_prefix,
    prepare_train,
    query,
    random_prefix,
)
from jobs.wrangle.paper_rows import read_split
from pipeline import JobSummary, RunConfig, run_job
from pipeline.plan.settings import EngineSettings

log = logging.getLogger(__name__)
PROMPTS_FILE = "prompts.parquet"
PREDICTIONS_FILE, METRICS_FILE, SUMMARY_FILE = "predictions.parquet", "metrics.json", "summary.tsv"


@dataclass(frozen=True)
class PaperConfig:
    """The paper's run_inference flags (same names and defaults), plus --all and where the prompts of manual
    mode come from."""

    data_dir: Path
    output: Path
    all: bool = False
    k: int = 1
    sample_method: str = "random"
    class_balanced: bool = False
    num_trials: int = 1
    add_task_instruction: bool = False
    task_instruction_idx: int = 0
    sep_tok: str = "."
    nan_tok: str = "nan"
    seed: int = 1234
    num_run: int = -1
    do_test: bool = False
    max_tokens: int = 3
    stop_token: str = "\n"
    manual_prompts: Path | None = None

    def __post_init__(self) -> None:
        for name in ("data_dir", "output"):
            object.__setattr__(self, name, Path(getattr(self, name)).expanduser().resolve())
        if self.sample_method not in SAMPLE_METHODS:
            raise WrangleInputError(f"--sample-method {self.sample_method!r} is invalid: expected one of "
                                    f"{', '.join(SAMPLE_METHODS)}")
        if self.sample_method == "validation_clusters":
            raise WrangleInputError("--sample-method validation_clusters needs the paper's clusters of validation "
                                    "errors (sentence-t5 embeddings of an earlier run), which this job does not "
                                    "make; use --sample-method random or manual")
        if self.sample_method == "manual" and self.manual_prompts is None:
            raise WrangleInputError("--sample-method manual needs the paper's hand-written prompts; pass "
                                    "--manual-prompts PATH/fm_data_tasks/utils/constants.py (or a JSON file)")
        checks = ((self.k < 0, f"--k {self.k}", "0 or more examples"),
                  (self.num_trials < 1, f"--num-trials {self.num_trials}", "1 or more"),
                  (self.task_instruction_idx != 0, f"--task-instruction-idx {self.task_instruction_idx}",
                   "0 (each dataset has one instruction)"),
                  (self.num_run == 0 or self.num_run < -1, f"--num-run {self.num_run}", "-1 (all) or 1 or more"),
                  (self.max_tokens < 1, f"--max-tokens {self.max_tokens}", "1 or more"),
                  (not 0 <= self.seed < 2**32 - self.num_trials, f"--seed {self.seed}", "0 <= seed < 2**32"),
                  (not self.stop_token, "--stop-token ''", "a non-empty string"))
        for bad, what, expected in checks:
            if bad:
                raise WrangleInputError(f"{what} is invalid: expected {expected}")

    @property
    def split(self) -> str:
        return "test" if self.do_test else "validation"


@dataclass(frozen=True)
class PaperRun:
    """One dataset's evaluated rows: their ids, prompts and gold answers, trial by trial."""

    dataset: Dataset
    folder: Path
    ids: list[str]
    prompts: list[str]
    golds: list[str]
    trials: int
    texts: list[str]  # each evaluated row's own text (without prefix or instruction), once

    @property
    def n(self) -> int:
        return len(self.ids) // self.trials


def datasets_of(config: PaperConfig) -> list[tuple[Dataset, Path]]:
    return find_datasets(config.data_dir) if config.all else [(dataset_of(config.data_dir), config.data_dir)]


def build_run(config: PaperConfig, dataset: Dataset, folder: Path, manual: dict | None) -> PaperRun:
    """The prompts of one dataset, trial by trial."""
    fmt = Format(config.sep_tok, config.nan_tok)
    train = prepare_train(read_split(folder, dataset, "train", fmt), dataset, config.class_balanced)
    rows = read_split(folder, dataset, config.split, fmt)
    rows = rows if config.num_run == -1 else rows[:config.num_run]
    if not rows:
        raise WrangleInputError(f"the {config.split} split of {dataset.name} in {folder} has no rows; add rows")
    instruction = dataset.instruction if config.add_task_instruction else None
    ids, prompts, golds = [], [], []
    for trial in range(config.num_trials):
        prefix = random_prefix(train, config.k, config.seed + trial) if config.sample_method == "random" else None
        for i, row in enumerate(rows):
            ids.append(f"{dataset.name}/{trial}/{i}")
            prompts.append(query(prefix if prefix is not None else manual_prefix(manual, dataset, row), row,
                                 instruction))
            golds.append(row.label_str)
    return PaperRun(dataset, folder, ids, prompts, golds, config.num_trials, [r.text.strip() for r in rows])


def build_runs(config: PaperConfig) -> list[PaperRun]:
    manual = load_manual_prompts(config.manual_prompts) if config.sample_method == "manual" else None
    return [build_run(config, d, folder, manual) for d, folder in datasets_of(config)]


def write_all_prompts(config: PaperConfig, runs: list[PaperRun], overwrite: bool) -> Path:
    path = config.output / PROMPTS_FILE
    write_prompts(path, [i for r in runs for i in r.ids], [p for r in runs for p in r.prompts], overwrite)
    return path


def run_metrics(run: PaperRun, answers: dict[str, str]) -> dict:
    """The paper's metrics of each trial, and their mean and standard deviation."""
    per_trial = []
    for t in range(run.trials):
        span = slice(t * run.n, (t + 1) * run.n)
        per_trial.append(compute_metrics([answers.get(i, "") for i in run.ids[span]], run.golds[span],
                                         run.dataset.task))
    counts = {k: [m[k] for m in per_trial] for k in ("tp", "fp", "fn", "tn", "crc")}
    return {"dataset": run.dataset.name, "task": run.dataset.task, "n": run.n, "trials": run.trials,
            **trial_summary(per_trial), "counts": counts}


def summary_rows(metrics: dict[str, dict]) -> list[dict]:
    """One row per dataset: F1 for the Yes/No tasks, accuracy for imputation (the paper's table)."""
    rows = []
    for m in metrics.values():
        name = "acc" if m["task"] == "data_imputation" else "f1"
        rows.append({"dataset": m["dataset"], "task": m["task"], "n": m["n"], "metric": name,
                     "mean": m[f"{name}_avg"], "std": m[f"{name}_std"], "trials": m["trials"]})
    return rows


def summary_lines(rows: list[dict]) -> list[str]:
    head = "dataset\ttask\tn\tmetric\tmean\tstd\ttrials"
    return [head] + [f"{r['dataset']}\t{r['task']}\t{r['n']}\t{r['metric']}\t{100 * r['mean']:.1f}\t"
                     f"{100 * r['std']:.1f}\t{r['trials']}" for r in rows]


def evaluate_runs(config: PaperConfig, runs: list[PaperRun], summary: JobSummary) -> tuple[list[dict], dict]:
    """Predictions, metrics.json and summary.tsv from the finished job; returns the summary rows and the
    completions by id."""
    done = read_completions(summary)
    answers = {i: (done[i]["completion"] or "") for i in done}
    metrics = {r.dataset.name: run_metrics(r, answers) for r in runs}
    preds = [{"id": i, "dataset": r.dataset.name, "prompt": p, "completion": done.get(i, {}).get("completion"),
              "gold": g.strip(), "error": done.get(i, {"error": "its shard failed every try; rerun"})["error"]}
             for r in runs for i, p, g in zip(r.ids, r.prompts, r.golds)]
    write_parquet(pa.Table.from_pylist(preds), config.output / PREDICTIONS_FILE)
    (config.output / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    rows = summary_rows(metrics)
    (config.output / SUMMARY_FILE).write_text("\n".join(summary_lines(rows)) + "\n")
    return rows, done


def run_paper(config: PaperConfig, model: Path, engine: EngineSettings, overwrite: bool = False,
              dry_run: bool = False):
    """Build and write the prompts; unless `dry_run`, complete them with `model` as one job and evaluate them.
    Returns the runs, the summary rows, the job's summary and the completions by id."""
    runs = build_runs(config)
    path = write_all_prompts(config, runs, overwrite)
    log.info("%d prompts of %d datasets (%s split, %d trials) in %s", sum(len(r.ids) for r in runs), len(runs),
             config.split, config.num_trials, path)
    if dry_run:
        return runs, None, None, {}
    summary = run_job(RunConfig.for_job(
        engine, input=str(path), output=config.output / COMPLETIONS_DIR, model=model, overwrite=overwrite,
        params=SamplingParams(max_new_tokens=config.max_tokens, temperature=0.0, stop=(config.stop_token,))))
    rows, done = evaluate_runs(config, runs, summary)
    return runs, rows, summary, done
