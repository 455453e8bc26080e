"""`flexbatch wrangle --manual-prompts FILE` reads the paper's PREFIXES without running the file: a value that is
computed rather than written out, or a JSON file that is no object, is one error line (exit 2), not a
traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from jobs.wrangle.command import wrangle_command

BEER = Path(__file__).resolve().parents[3] / "examples" / "fm_datasets" / "entity_matching" / "structured" / "Beer"


@pytest.mark.parametrize(("name", "text", "fragment"), [
    ("constants.py", 'PREFIXES = {\n    "a/Beer": "Same? Yes\\n" * 2,\n}\n',
     "line 2: the PREFIXES value 'Same? Yes\\n' * 2 is computed"),
    ("constants.py", 'BASE = "x"\nPREFIXES = {"a/Beer": BASE}\n', "the PREFIXES value BASE is computed"),
    ("constants.py", 'PREFIXES = {"a/Beer": {"k": "".join(["a", "b"])}}\n', "is computed"),
    ("prompts.json", '["Same? Yes"]', "holds a JSON list; expected an object"),
])
def test_a_prefixes_file_that_is_not_literal_is_one_error_line(tmp_path, no_model_load, name, text, fragment):
    prompts = tmp_path / name
    prompts.write_text(text)
    result = CliRunner().invoke(wrangle_command, [*map(str, (
        "--data-dir", BEER, "--sample-method", "manual", "--manual-prompts", prompts, "--dry-run",
        "--output", tmp_path / "out", "--no-ray"))])
    assert result.exit_code == 2, (result.output, result.exception)
    errors = [line for line in result.stderr.splitlines() if line.startswith("flexbatch: error: ")]
    assert len(errors) == 1 and fragment in errors[0] and "Traceback" not in result.output, result.stderr
    assert str(prompts) in errors[0]
