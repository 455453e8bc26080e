"""The options of `flexbatch wrangle --data-dir` (the paper's run_inference flags, same names with dashes and
same defaults) and what the command prints in that mode."""

from __future__ import annotations

from pathlib import Path

import click

from jobs.wrangle.helm_output import write_helm_runs
from jobs.wrangle.paper_job import PROMPTS_FILE, PaperConfig, run_paper, summary_lines
from jobs.wrangle.paper_prompts import SAMPLE_METHODS
from pipeline.plan.settings import EngineSettings

# name -> (click option arguments, keyword arguments); defaults are run_inference's
PAPER_OPTIONS = {
    "data_dir": (("--data-dir",), dict(type=click.Path(path_type=Path), default=None,
                 help="A dataset folder of the paper's layout (e.g. data/datasets/entity_matching/structured/Beer); "
                      "with --all, its data/datasets folder.  Selects dataset mode.")),
    "all": (("--all", "all_datasets"), dict(is_flag=True, help="Every dataset found under --data-dir, one job.")),
    "k": (("--k",), dict(type=int, default=None, help="Examples in the prompt.  [default: 1]")),
    "sample_method": (("--sample-method",), dict(type=click.Choice(SAMPLE_METHODS), default=None,
                      help="How the examples are chosen.  [default: random]")),
    "class_balanced": (("--class-balanced",), dict(is_flag=True, help="Class-balance the train rows first.")),
    "num_trials": (("--num-trials",), dict(type=int, default=None,
                   help="Trials (trial t draws with seed + t); mean and std reported.  [default: 1]")),
    "add_task_instruction": (("--add-task-instruction",), dict(is_flag=True,
                             help="Put the dataset's task instruction before the prompt.")),
    "task_instruction_idx": (("--task-instruction-idx",), dict(type=int, default=None,
                             help="Only 0: each dataset has one instruction.  [default: 0]")),
    "sep_tok": (("--sep-tok",), dict(default=None, help="Separator of attr: value pairs.  [default: .]")),
    "nan_tok": (("--nan-tok",), dict(default=None, help="Text of a blank cell (the paper's runs use '' for "
                                                        "matching).  [default: nan]")),
    "num_run": (("--num-run",), dict(type=int, default=None, help="Rows scored, -1 for all.  [default: -1]")),
    "do_test": (("--do-test",), dict(is_flag=True, help="Score the test split (default: the validation split).")),
    "max_tokens": (("--max-tokens",), dict(type=int, default=None, help="Most tokens per answer.  [default: 3]")),
    "stop_token": (("--stop-token",), dict(default=None, help="Generation stops at it.  [default: newline]")),
    "dry_run": (("--dry-run",), dict(is_flag=True, help="Write OUTPUT/prompts.parquet and run nothing.")),
    "manual_prompts": (("--manual-prompts",), dict(type=click.Path(path_type=Path), default=None, metavar="FILE",
                       help="--sample-method manual: the paper's fm_data_tasks/utils/constants.py (its PREFIXES "
                            "are read, never run) or a JSON file {dataset: prompt or {key: prompt}}.")),
}


def paper_options(fn):
    for args, kwargs in reversed(PAPER_OPTIONS.values()):
        fn = click.option(*args, **kwargs)(fn)
    return fn


def paper_config(opts: dict, output: Path, seed: int | None) -> PaperConfig:
    """The dataset-mode config from the command's options (None: the paper's default)."""
    given = {name: opts[name] for name in ("k", "sample_method", "num_trials", "task_instruction_idx", "sep_tok",
                                           "nan_tok", "num_run", "max_tokens", "stop_token", "manual_prompts")
             if opts[name] is not None}
    return PaperConfig(data_dir=opts["data_dir"], output=output, all=opts["all_datasets"],
                       class_balanced=opts["class_balanced"], add_task_instruction=opts["add_task_instruction"],
                       do_test=opts["do_test"], **({"seed": seed} if seed is not None else {}), **given)


def run_dataset_mode(config: PaperConfig, model: Path, engine: EngineSettings, overwrite: bool,
                     dry_run: bool) -> bool:
    """Run and print; False when some shards failed."""
    runs, rows, summary, done = run_paper(config, model, engine, overwrite, dry_run)
    if dry_run:
        click.echo(f"{sum(len(r.ids) for r in runs)} prompts of {len(runs)} datasets: {config.output / PROMPTS_FILE}")
        return True
    for line in summary_lines(rows):
        click.echo(line)
    click.echo(f"metrics: {config.output / 'metrics.json'}")
    click.echo(f"HELM runs: {write_helm_runs(config, runs, done, Path(model))}")
    return summary.ok
