"""`flexbatch helm` / `python -m jobs.helm`: a HELM-style benchmark suite run through the pipeline.

User errors (a bad spec, scenario file or option) print one line `flexbatch: error: ...` and exit with code 2;
a run whose shards failed every try exits with code 1 after the summary."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from engine.errors import FlexbatchError
from jobs.common import fail, setup_logging
from jobs.engine_options import engine_options, engine_settings

FAILED_RUNS_EXIT = 1


@click.command("helm", short_help="Run a HELM-style benchmark suite; write HELM run folders and a summary.")
@click.option("--spec", type=click.Path(path_type=Path), default=None,
              help="YAML spec of the runs (scenario, model, adapter, metrics per entry); see examples/helm/demo.yaml.")
@click.option("--scenario-state", "scenario_states", type=click.Path(path_type=Path), multiple=True,
              metavar="FILE", help="Repeatable: a scenario_state.json of a HELM run; its requests are re-run with "
                                   "our engine and scored with the metrics of the run_spec.json beside it.")
@click.option("--suite", required=True, help="Suite name: runs are written to OUTPUT/runs/SUITE/<run>/.")
@click.option("--output", required=True, type=click.Path(path_type=Path), help="Output folder (HELM's benchmark_output).")
@click.option("--max-eval-instances", type=click.IntRange(min=1), default=None, metavar="N",
              help="Evaluate at most N instances per run (drawn with a fixed seed).  [default: the spec's, else all]")
@click.option("--model", type=click.Path(path_type=Path), default=None,
              help="Checkpoint folder for every run, instead of the spec's models.  [default: the spec's, else the "
                   "demo model in examples/demo-model]")
@click.option("--skip-completed-runs", is_flag=True,
              help="Skip runs whose folder already holds all of HELM's output files (their results still appear "
                   "in the summary).")
@click.option("--constrain/--no-constrain", default=True, show_default=True,
              help="multiple_choice_joint runs: the answer is one of the request's letters (' A', ' B', ...), "
                   "enforced while decoding, so every answer names a choice; --no-constrain lets the model write "
                   "anything (an answer that is no letter scores 0).")
@engine_options
@click.pass_context
def helm_command(ctx, spec, scenario_states, suite, output, max_eval_instances, model, skip_completed_runs,
                 constrain, **engine_opts) -> None:
    """Run the benchmark runs of --spec (and of each --scenario-state), score them with HELM's metrics, and
    write HELM's run folders, OUTPUT/runs/SUITE/<run>/ with run_spec.json, scenario.json, scenario_state.json,
    per_instance_stats.json and stats.json. Prints the suite summary (metric means with counts, chance, tokens/s
    and the plan of each run), also saved as flexbatch_summary.md and flexbatch_summary.json in OUTPUT/runs/SUITE/.

    Rerunning the same command resumes an interrupted run (its committed shards are skipped).

    \b
    Examples:
      flexbatch helm --spec examples/helm/demo.yaml --suite demo --output out/helm
      flexbatch helm --spec examples/helm/demo.yaml --suite demo-4bit --output out/helm \\
          --compress-weight --compress-cache
      flexbatch helm --scenario-state benchmark_output/runs/v1/RUN/scenario_state.json --suite rerun --output out/helm
    """
    from jobs.helm.suite import HelmOptions, run_suite

    setup_logging()
    try:
        engine = engine_settings(ctx, engine_opts)
        options = HelmOptions(output=output, suite=suite, skip_completed_runs=skip_completed_runs, engine=engine,
                              constrain=constrain)
        runs = _load(spec, scenario_states, model, max_eval_instances, engine.pinned("compress_weight"),
                     engine.pinned("compress_cache"))
        result = run_suite(runs, options)
    except FlexbatchError as e:
        fail(e)
    click.echo(result.table, nl=False)
    for run in result.runs:
        if run.error:
            click.echo(f"run {run.name} failed: {run.error}")
    click.echo(f"summary: {result.markdown} and {result.json}")
    click.echo(f"HELM's tables: helm-summarize --suite {suite} -o {output} --schema-path {result.schema}")
    if not result.ok:
        sys.exit(FAILED_RUNS_EXIT)


def _load(spec_path, scenario_states, model, max_eval_instances, compress_weight, compress_cache):
    from jobs.helm.errors import SpecError
    from jobs.helm.run_entries import HelmSpec, entry_from_dict, load_spec, with_overrides

    if spec_path is None and not scenario_states:
        raise SpecError("nothing to run: give --spec FILE (a YAML spec) and/or --scenario-state FILE")
    entries = load_spec(spec_path).entries if spec_path is not None else ()
    for path in scenario_states:
        if not Path(path).is_file():
            raise SpecError(f"--scenario-state {path}: no such file; give a HELM run's scenario_state.json")
        entries += (entry_from_dict({"scenario_state": str(Path(path).resolve())}, Path.cwd()),)
    return with_overrides(HelmSpec(path=spec_path, entries=entries), model=model,
                          max_eval_instances=max_eval_instances, compress_weight=compress_weight,
                          compress_cache=compress_cache)

