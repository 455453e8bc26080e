"""What every command shares: exit codes, the one-line user error, logging set-up and the demo model."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from engine.errors import ModelNotFoundError

USER_ERROR_EXIT = 2
FAILED_SHARDS_EXIT = 1
OUT_OF_MEMORY_EXIT = 3  # shards failed because their worker was killed for memory
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def fail(error: Exception | str) -> None:
    """Print a user error as one line `flexbatch: error: ...` and exit with USER_ERROR_EXIT."""
    message = " ".join(str(error).splitlines())
    click.echo(f"flexbatch: error: {message}", err=True)
    sys.exit(USER_ERROR_EXIT)


def setup_logging() -> None:
    """Library code logs; a command shows INFO and above, with the time and the logger's name."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")


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
