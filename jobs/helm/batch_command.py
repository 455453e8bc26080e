"""`flexbatch helm-batch`: the requests of HELM's own runs, computed in bulk by the pipeline.

The workflow on any HELM run entry E (HELM's adapters, prompt fitting, perturbations and metrics; flexbatch's
batched execution):

    flexbatch helm-batch --suite S --model DIR    # registers flexbatch/<DIR name> in prod_env/
    helm-run --run-entries E --suite S --dry-run  # HELM writes the requests
    flexbatch helm-batch --suite S --model DIR    # runs every pending request of suite S, stores the results
    helm-run --run-entries E --suite S            # HELM's metrics on them

where E names the deployment, e.g. `simple1:model=flexbatch/demo-model,model_deployment=flexbatch/demo-model`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from engine.errors import FlexbatchError
from jobs.common import fail, setup_logging
from jobs.engine_options import engine_options, engine_settings
from jobs.helm.command import FAILED_RUNS_EXIT


@click.command("helm-batch", short_help="Run the requests of HELM's runs of a suite in bulk, for helm-run to read.")
@click.option("--suite", required=True, help="HELM suite whose runs' requests are computed (benchmark_output/runs/S).")
@click.option("--helm-output", type=click.Path(path_type=Path), default=Path("benchmark_output"), show_default=True,
              help="HELM's output folder (helm-run -o).")
@click.option("--local-path", type=click.Path(path_type=Path), default=Path("prod_env"), show_default=True,
              help="HELM's configuration folder (helm-run --local-path): the flexbatch deployment is written there.")
@click.option("--store", type=click.Path(path_type=Path), default=None,
              help="Results store folder.  [default: HELM-OUTPUT/flexbatch_store]")
@click.option("--model", type=click.Path(path_type=Path), default=None,
              help="Checkpoint folder.  [default: the demo model in examples/demo-model]")
@engine_options
@click.pass_context
def helm_batch_command(ctx, suite, helm_output, local_path, store, model, **engine_opts) -> None:
    """Write the deployment flexbatch/<model folder name> into LOCAL-PATH (client: answers from the store),
    then complete every request of HELM-OUTPUT/runs/SUITE/*/scenario_state.json that the store lacks, as one
    pipeline job (rerunning resumes it), and add the results to the store. A following `helm-run` of the same
    run entries with model=flexbatch/<model folder name> reads them, without running the model.
    """
    from jobs.helm.deployment import write_deployment
    from jobs.helm.run_entries import check_suite, resolve_model
    from jobs.helm.store import run_pending

    setup_logging()
    try:
        check_suite(suite)
        engine = engine_settings(ctx, engine_opts)
        model = resolve_model(str(model) if model else None, Path.cwd())
        store = (store or helm_output / "flexbatch_store").resolve()
        name = write_deployment(local_path, model, store)
        click.echo(f"deployment {name} (results from {store}) written to {local_path}/")
        if not (helm_output / "runs" / suite).is_dir():
            click.echo(f"no HELM runs in {helm_output / 'runs' / suite} yet: run helm-run --run-entries ENTRY "
                       f"--suite {suite} --dry-run (ENTRY with model={name},model_deployment={name}), then this "
                       "command again")
            return
        total, ran, summaries = run_pending(helm_output, suite, store, model, engine)
    except FlexbatchError as e:
        fail(e)
    click.echo(f"suite {suite}: {total} distinct requests, {ran} computed now, {total - ran} already stored")
    failed = [s for s in summaries if not s.ok]
    for summary in failed:
        click.echo(f"{len(summary.failed_shards)} shards failed every try (see {summary.output}); rerun to retry")
    if failed:
        sys.exit(FAILED_RUNS_EXIT)
    click.echo(f"next: helm-run --run-entries ENTRY --suite {suite}, the same entries without --dry-run (HELM's "
               "metrics on these results)")
