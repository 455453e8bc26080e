"""Helpers of the HELM job tests: small specs, scenario files, and the command run in this process."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from jobs.helm.command import helm_command

# The demo model's prompt format, short decodes: enough to score the bundled scenarios in a few seconds.
DEMO_ADAPTER = {"input_prefix": "Q: ", "input_suffix": " ", "output_prefix": "A: ", "instance_prefix": "",
                "max_train_instances": 3, "num_outputs": 1, "temperature": 0, "max_tokens": 4,
                "stop_sequences": ["\n"]}


def write_spec(path: Path, entries: list[dict], defaults: dict | None = None) -> Path:
    data = {"entries": entries}
    if defaults is not None:
        data["defaults"] = defaults
    path.write_text(yaml.safe_dump(data))
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def invoke(*args):
    """`flexbatch helm ARGS` in this process."""
    return CliRunner().invoke(helm_command, [str(a) for a in args])


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def assert_user_error(result, *fragments):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.strip().splitlines() if line.startswith("flexbatch: error: ")]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == ""
