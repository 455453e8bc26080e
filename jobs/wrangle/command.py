"""`flexbatch wrangle` / `python -m jobs.wrangle`: the data-wrangling tasks of fm_data_tasks (entity matching,
data imputation, error detection) as a flexbatch job.

The job reads the task's tables (jobs/wrangle/data.py), writes one prompt per example to
`<output>/prompts.parquet` (prompts from jobs/wrangle/tasks.py), completes them with the pipeline (greedy,
short, stopped at a newline) into `<output>/completions/`, then parses the answers and writes
`<output>/predictions.parquet` and `<output>/metrics.json` (jobs/wrangle/metrics.py). Rerunning the same
command resumes the generation: committed shards are not redone.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click
import pyarrow as pa
from click.core import ParameterSource

from engine.errors import FlexbatchError
from engine.guided import Guided
from engine.request import SamplingParams
from jobs.common import FAILED_SHARDS_EXIT, default_model, fail, setup_logging
from jobs.engine_options import engine_options, engine_settings
from jobs.wrangle.data import SPLITS, TASKS, Example, WrangleInputError, check_task, load_split
from jobs.wrangle.files import COMPLETIONS_DIR, read_completions, write_parquet, write_prompts
from jobs.wrangle.metrics import binary_metrics, imputation_metrics, is_correct
from jobs.wrangle.paper_command import PAPER_OPTIONS, paper_config, paper_options, run_dataset_mode
from jobs.wrangle.tasks import (
    DEFAULT_TEMPLATE,
    Template,
    get_template,
    parse_answer,
    read_prefix,
    render,
    sample_shots,
    shots_prefix,
)
from pipeline import JobSummary, RunConfig, run_job
from pipeline.plan.settings import EngineSettings

log = logging.getLogger(__name__)
DEFAULT_MAX_NEW_TOKENS = 8  # "Yes"/"No" or a short value, then a newline
STOP = ("\n",)
PROMPTS_FILE = "prompts.parquet"
PREDICTIONS_FILE, METRICS_FILE = "predictions.parquet", "metrics.json"


@dataclass(frozen=True)
class WrangleConfig:
    """One data-wrangling run: which task, data and split, how prompts are made, and how the pipeline runs."""

    task: str
    data: Path
    output: Path
    model: Path
    split: str = "test"
    template: str | None = None  # None: DEFAULT_TEMPLATE[task]
    k_shot: int = 0
    prefix: Path | None = None  # a hand-written few-shot prefix instead of k random train examples
    seed: int = 0
    impute_column: str | None = None
    limit: int | None = None  # the first N rows of the split only
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    overwrite: bool = False
    engine: EngineSettings = field(default_factory=EngineSettings)
    constrain: bool = True  # closed answer sets (matching, error detection): only the template's two words

    def __post_init__(self) -> None:
        check_task(self.task)
        for name in ("data", "output", "model"):
            object.__setattr__(self, name, Path(getattr(self, name)).expanduser().resolve())
        if self.split not in SPLITS[1:]:
            raise WrangleInputError(f"--split {self.split!r} is invalid: expected valid or test (train holds "
                                    f"the few-shot examples)")
        get_template(self.task, self.template)
        if self.k_shot < 0:
            raise WrangleInputError(f"--k-shot {self.k_shot} is invalid: expected 0 or more examples")
        if self.prefix is not None and self.k_shot:
            raise WrangleInputError(f"--prefix {self.prefix} and --k-shot {self.k_shot} both give a few-shot "
                                    f"prefix; pass only one of them")
        if self.limit is not None and self.limit < 1:
            raise WrangleInputError(f"--limit {self.limit} is invalid: expected a positive number of rows")
        if self.max_new_tokens < 1:
            raise WrangleInputError(f"--max-new-tokens {self.max_new_tokens} is invalid: expected 1 or more")
        if self.task == "data_imputation" and not self.impute_column:
            raise WrangleInputError("data_imputation needs the column to impute; pass --impute-column NAME")

    @property
    def target(self) -> str | None:
        return self.impute_column if self.task == "data_imputation" else None


@dataclass(frozen=True)
class WrangleResult:
    metrics: dict
    predictions: Path
    metrics_path: Path
    summary: JobSummary


def build_prompts(config: WrangleConfig) -> tuple[Template, list[Example], list[str], str]:
    """The template, the examples of the split (the first `limit`), their prompts and the common prefix."""
    template = get_template(config.task, config.template)
    examples = load_split(config.data, config.task, config.split, config.impute_column)
    if not examples:
        raise WrangleInputError(f"the {config.split} split in {config.data} has no rows; add rows or pass "
                                f"--split with another split")
    queries = [render(e, template, config.target) for e in examples]
    if config.prefix is not None:
        prefix = read_prefix(config.prefix)
    elif config.k_shot:
        train = load_split(config.data, config.task, "train", config.impute_column)
        shots = sample_shots(train, config.k_shot, config.seed, template, config.target, set(queries))
        prefix = shots_prefix(shots, template, config.target)
    else:
        prefix = ""
    n = config.limit or len(examples)
    return template, examples[:n], [prefix + q for q in queries[:n]], prefix


def answer_constraint(config: WrangleConfig, template: Template) -> Guided | None:
    """For a task whose answer is one of two words (entity matching, error detection), with `constrain`: the
    answer is " <positive>" or " <negative>", enforced while decoding; None otherwise (imputation's values are
    open)."""
    if not config.constrain or config.task == "data_imputation":
        return None
    return Guided(choice=(f" {template.positive}", f" {template.negative}"))


def _prediction_rows(examples, prompts, completions, template) -> list[dict]:
    rows = []
    for example, prompt in zip(examples, prompts):
        done = completions.get(example.id, {"completion": None, "finish_reason": "error",
                                            "error": "its shard failed every try; rerun to complete it"})
        pred = parse_answer(done["completion"], template)
        rows.append({"id": example.id, **dict(example.keys), "prompt": prompt, "completion": done["completion"],
                     "prediction": pred, "gold": example.gold, "correct": is_correct(example.gold, pred),
                     "finish_reason": done["finish_reason"], "error": done["error"]})
    return rows


def task_metrics(task: str, rows: list[dict]) -> dict:
    golds, preds = [r["gold"] for r in rows], [r["prediction"] for r in rows]
    return imputation_metrics(golds, preds) if task == "data_imputation" else binary_metrics(golds, preds)


def _record(config: WrangleConfig, template: Template, prefix: str, metrics: dict, summary: JobSummary) -> dict:
    return {
        "task": config.task, "split": config.split, "data": str(config.data), "model": str(config.model),
        "template": template.name, "template_prompt": template.prompt, "serialization": template.style,
        "k_shot": config.k_shot, "prefix_file": str(config.prefix) if config.prefix else None,
        "seed": config.seed, "impute_column": config.target, "limit": config.limit, "prefix": prefix,
        "constrained": answer_constraint(config, template) is not None,
        **metrics, "error_rows": summary.error_rows, "failed_shards": len(summary.failed_shards),
        "completion_tokens_per_s": summary.job_tokens_per_s, "workers": len(summary.workers),
    }


def run_wrangle(config: WrangleConfig) -> WrangleResult:
    """Build the prompts, complete them with the pipeline, parse and evaluate; write predictions and metrics."""
    template, examples, prompts, prefix = build_prompts(config)
    prompts_path = config.output / PROMPTS_FILE
    write_prompts(prompts_path, [e.id for e in examples], prompts, config.overwrite)
    log.info("%s: %d %s rows, template %s, prompts in %s", config.task, len(examples), config.split,
             template.name, prompts_path)
    summary = run_job(RunConfig.for_job(
        config.engine, input=str(prompts_path), output=config.output / COMPLETIONS_DIR, model=config.model,
        params=SamplingParams(max_new_tokens=config.max_new_tokens, temperature=0.0, stop=STOP,
                              guided=answer_constraint(config, template)),
        overwrite=config.overwrite))
    rows = _prediction_rows(examples, prompts, read_completions(summary), template)
    metrics = task_metrics(config.task, rows)
    predictions = config.output / PREDICTIONS_FILE
    write_parquet(pa.Table.from_pylist(rows), predictions)
    metrics_path = config.output / METRICS_FILE
    metrics_path.write_text(json.dumps(_record(config, template, prefix, metrics, summary), indent=2) + "\n")
    log.info("%s: accuracy %.3f on %d rows; predictions in %s", config.task, metrics["accuracy"], metrics["n"],
             predictions)
    return WrangleResult(metrics, predictions, metrics_path, summary)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def metrics_lines(task: str, split: str, template: str, m: dict) -> list[str]:
    """What the command prints: the metrics and the chance level (always the most frequent gold answer)."""
    head = f"{task} on {split} (template {template}): n={m['n']}, {m['unparsed']} answers unparsed"
    chance = f"chance: accuracy {_pct(m['majority_accuracy'])} (always the most frequent answer)"
    if task == "data_imputation":
        return [head, f"accuracy {_pct(m['accuracy'])} ({m['correct']}/{m['n']} exact after normalization)", chance]
    return [head, f"accuracy {_pct(m['accuracy'])}, precision {_pct(m['precision'])}, recall {_pct(m['recall'])}, "
                  f"F1 {_pct(m['f1'])}  (TP {m['tp']}, FP {m['fp']}, FN {m['fn']}, TN {m['tn']})",
            f"{chance}, F1 {_pct(m['always_positive_f1'])} (always positive)"]


_DEFAULTS = sorted(set(DEFAULT_TEMPLATE.values()))
_DEFAULT_HELP = _DEFAULTS[0] if len(_DEFAULTS) == 1 else ", ".join(f"{v} for {k}" for k, v in DEFAULT_TEMPLATE.items())
_TEMPLATE_HELP = ("Prompt template: paper (the paper's wording, rows as 'attr: value. attr: value') or demo (the "
                  f"formats the demo model was trained on, for the bundled data).  [default: {_DEFAULT_HELP}]")


@click.command("wrangle", short_help="Entity matching, imputation or error detection on tables, scored.")
@click.option("--task", default=None, metavar="TASK", help=f"Bundled-table mode: one of {', '.join(TASKS)}.")
@click.option("--data", default=None, type=click.Path(path_type=Path),
              help="Bundled-table mode: folder with the task's tables (Parquet or CSV).")
@click.option("--output", required=True, type=click.Path(path_type=Path),
              help="Folder for prompts.parquet, completions/, predictions.parquet and metrics.json "
                   "(and with --data-dir summary.tsv and helm/).")
@click.option("--split", default="test", show_default=True, metavar="SPLIT", help="Split to score: valid or test.")
@click.option("--template", default=None, metavar="NAME", help=_TEMPLATE_HELP)
@click.option("--k-shot", type=int, default=0, show_default=True, metavar="N",
              help="Few-shot prefix of N random train examples (never one equal to a scored row).")
@click.option("--prefix", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="A hand-written few-shot prefix (text file) instead of --k-shot.")
@click.option("--seed", type=int, default=None,
              help="Seed of the few-shot sample.  [default: 1234 with --data-dir (the paper's), else 0]")
@click.option("--impute-column", default=None, metavar="NAME", help="data_imputation: the column to impute.")
@click.option("--limit", type=int, default=None, metavar="N", help="Score only the split's first N rows.")
@click.option("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, show_default=True,
              help="Most tokens per answer (generation also stops at a newline).")
@click.option("--model", type=click.Path(path_type=Path), default=None,
              help="Checkpoint folder.  [default: the demo model in examples/demo-model]")
@click.option("--overwrite", is_flag=True, help="Replace the completions of another job in --output.")
@click.option("--constrain/--no-constrain", default=True, show_default=True,
              help="Entity matching and error detection: the answer is one of the template's two words (' Yes' "
                   "or ' No'), enforced while decoding, so every answer parses; --no-constrain lets the model "
                   "write anything (an answer that is neither word counts as wrong). Imputation is never "
                   "constrained.")
@paper_options
@engine_options
def wrangle_command(**opts) -> None:
    """Run a data-wrangling task (fm_data_tasks layout) through the pipeline and score the answers.

    \b
    Examples:
      flexbatch wrangle --task entity_matching --data examples/wrangle/entity_matching --output out/em
      flexbatch wrangle --task data_imputation --data examples/wrangle/data_imputation \\
          --impute-column country --output out/di
      flexbatch wrangle --task error_detection --data examples/wrangle/error_detection --output out/ed
      flexbatch wrangle --data-dir data/datasets/entity_matching/structured/Beer --k 3 \\
          --class-balanced --nan-tok "" --do-test --output out/beer
      flexbatch wrangle --data-dir data/datasets --all --k 0 --add-task-instruction --output out/all
    """
    setup_logging()
    try:
        settings = engine_settings(click.get_current_context(), opts)
        model = opts["model"] or default_model()
        _check_mode(opts)
        if opts["data_dir"] is not None:
            ok = run_dataset_mode(paper_config(opts, opts["output"], opts["seed"]), model, settings,
                                  opts["overwrite"], opts["dry_run"])
        else:
            ok = _run_tables(opts, model, settings)
    except FlexbatchError as e:
        fail(e)
    if not ok:
        click.echo("some shards failed; their rows count as wrong: rerun the same command to complete them")
        sys.exit(FAILED_SHARDS_EXIT)


_TABLE_ONLY = ("task", "data", "split", "template", "k_shot", "prefix", "impute_column", "limit", "max_new_tokens",
               "constrain")
_DATASET_ONLY = tuple(name for name in PAPER_OPTIONS if name != "data_dir")


def _given(names: tuple[str, ...]) -> list[str]:
    ctx = click.get_current_context()
    return [f"--{n.replace('_', '-')}" for n in names
            if ctx.get_parameter_source(n if n != "all" else "all_datasets") == ParameterSource.COMMANDLINE]


def _check_mode(opts: dict) -> None:
    """Bundled-table mode (--task, --data) and dataset mode (--data-dir) take their own options."""
    if opts["data_dir"] is not None:
        wrong = _given(_TABLE_ONLY)
        if wrong:
            raise WrangleInputError(f"{', '.join(wrong)} belong to bundled-table mode, not to --data-dir; the "
                                    f"paper's flags are --k, --num-run, --do-test, --max-tokens (see --help)")
        return
    wrong = _given(_DATASET_ONLY)
    if wrong:
        raise WrangleInputError(f"{', '.join(wrong)} need --data-dir (dataset mode); pass it, or drop them")
    if opts["task"] is None or opts["data"] is None:
        raise WrangleInputError("pass --task and --data (bundled tables) or --data-dir (the paper's datasets)")


def _run_tables(opts: dict, model: Path, engine: EngineSettings) -> bool:
    task, split, template = opts["task"], opts["split"], opts["template"]
    config = WrangleConfig(task=task, data=opts["data"], output=opts["output"], split=split, template=template,
                           k_shot=opts["k_shot"], prefix=opts["prefix"], seed=opts["seed"] or 0,
                           impute_column=opts["impute_column"], limit=opts["limit"],
                           max_new_tokens=opts["max_new_tokens"], overwrite=opts["overwrite"], model=model,
                           engine=engine, constrain=opts["constrain"])
    result = run_wrangle(config)
    for line in metrics_lines(task, split, get_template(task, template).name, result.metrics):
        click.echo(line)
    click.echo(f"predictions: {result.predictions}")
    click.echo(f"metrics: {result.metrics_path}")
    return result.summary.ok
