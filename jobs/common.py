"""What every command shares: exit codes, the one-line user error, logging set-up and the demo model."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from engine.errors import ModelNotFoundError
from engine.options import OptionError

# Exit codes of a job command. 0: every row completed. The others, most serious first:
FAILED_SHARDS_EXIT = 1  # shards failed every try: their rows have no output
USER_ERROR_EXIT = 2  # bad input, model, options or output folder: nothing ran
OUT_OF_MEMORY_EXIT = 3  # shards failed because their worker was killed for memory
ROW_ERRORS_EXIT = 4  # every shard written, but some rows failed (their error column, or error objects, say why)
ALL_ROWS_FAILED_EXIT = 5  # every shard written, and every row in it failed: no completion at all
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def fail(error: Exception | str) -> None:
    """Print a user error as one line `flexbatch: error: ...` and exit with USER_ERROR_EXIT; a bad option's value
    names its flag."""
    if isinstance(error, OptionError):
        error = error.given("cli")
    message = " ".join(str(error).splitlines())
    click.echo(f"flexbatch: error: {message}", err=True)
    sys.exit(USER_ERROR_EXIT)


def setup_logging() -> None:
    """Library code logs; a command shows INFO and above, with the time and the logger's name, as its workers
    do (pipeline/execution/logs.py)."""
    from pipeline.execution.logs import setup_logging as setup

    setup()


def demo_model_dir() -> Path:
    """The demo checkpoint shipped with the repository, used when --model is not given."""
    return PROJECT_ROOT / "examples" / "demo-model"


def default_model() -> Path:
    """The demo model, or a user error naming the fix when it is missing."""
    path = demo_model_dir()
    if not path.is_dir():
        raise ModelNotFoundError(
            f"no --model given and the demo model is missing at {path} (it ships with the repository's "
            f"examples/); pass --model DIR with a local checkpoint folder"
        )
    return path


def job_exit_code(summary) -> int:
    """The exit code of a finished job (a `JobSummary`): failed shards first, then rows that failed."""
    if not summary.ok:
        return OUT_OF_MEMORY_EXIT if summary.out_of_memory else FAILED_SHARDS_EXIT
    if summary.rows and summary.error_rows == summary.rows:
        return ALL_ROWS_FAILED_EXIT
    return ROW_ERRORS_EXIT if summary.error_rows else 0
