"""`flexbatch --version` prints the installed distribution's version, as pip recorded it."""

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from click.testing import CliRunner

from jobs import cli

REPO = Path(__file__).resolve().parents[2]


def test_version_is_the_installed_distributions():
    result = CliRunner().invoke(cli.main, ["--version"])
    assert result.exit_code == 0 and result.output == f"flexbatch {metadata.version('flexbatch')}\n"


def test_the_console_command_prints_it_too():
    done = subprocess.run([sys.executable, "-m", "jobs.cli", "--version"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("flexbatch ") and done.stdout.split()[1][0].isdigit()


def test_a_checkout_that_was_never_installed_says_so(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert "not installed" in CliRunner().invoke(cli.main, ["--version"]).output
