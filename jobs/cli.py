"""The `flexbatch` command line: the root only assembles the commands; each lives in its own module.

User errors (bad input, model or output folder) print one line `flexbatch: error: ...` and exit with code 2."""

from __future__ import annotations

import importlib

import click

from engine.env_settings import EnvSettingError, check_environment
from jobs.common import fail
from jobs.helm.batch_command import helm_batch_command
from jobs.helm.command import helm_command
from jobs.plan_cmd import plan_command, profile_command
from jobs.quick_exit import quick_exit
from jobs.run_cmd import run
from jobs.submit import submit_command
from jobs.verify_cmd import verify_command
from jobs.wrangle.command import wrangle_command


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml's, as pip recorded it)."""
    from importlib import metadata

    try:
        return metadata.version("flexbatch")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed: pip install -e . in the repository)"


def _print_version(ctx: click.Context, param, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"flexbatch {installed_version()}")
        ctx.exit()


@click.group()
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print flexbatch's version and exit.")
def main() -> None:
    """flexbatch: batch LLM inference, Parquet prompts in, Parquet completions out."""
    try:
        check_environment()  # FLEXBATCH_ISA and the like: one line and exit 2, before any command runs
    except EnvSettingError as e:
        fail(e)


class _LazyGroup(click.Group):
    """A group whose commands are imported when used, so that `flexbatch --help` does not import torch."""

    def __init__(self, *args, lazy: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx) -> list[str]:
        return sorted(self._lazy)

    def get_command(self, ctx, name):
        if name not in self._lazy:
            return None
        module, attr = self._lazy[name].split(":")
        return getattr(importlib.import_module(module), attr)


@main.group(cls=_LazyGroup, lazy={"engine": "jobs.bench.engine:engine_command",
                                  "planner": "jobs.bench.planner:planner_command",
                                  "pipeline": "jobs.bench.pipeline:pipeline_command",
                                  "gpu": "jobs.bench.gpu:gpu_command",
                                  "workloads": "jobs.bench.workloads:workloads_command",
                                  "ops": "jobs.bench.op_profile:ops_command",
                                  "prefix": "jobs.bench.shared_prefix:prefix_command",
                                  "guided": "jobs.bench.guided:guided_command",
                                  "score": "jobs.bench.scoring:score_command",
                                  "startup": "jobs.bench.startup:startup_command",
                                  "stops": "jobs.bench.stop_strings:stops_command"})
def bench() -> None:
    """Benchmarks: print a table of ratios measured side by side and write JSON."""


main.add_command(run)
main.add_command(plan_command)
main.add_command(profile_command)
main.add_command(submit_command)
main.add_command(helm_command)
main.add_command(helm_batch_command)
main.add_command(wrangle_command)
main.add_command(verify_command)


def console() -> None:
    """The `flexbatch` console script: `main`, then an exit without the interpreter's teardown (jobs/quick_exit.py).
    An exception that escapes `main` (a bug: user errors are ClickExceptions) takes the normal way out."""
    try:
        main(prog_name="flexbatch")
    except SystemExit as e:
        quick_exit(e.code)
    quick_exit(0)


if __name__ == "__main__":  # python -m jobs.cli: the same CLI where the console script is not installed
    console()
