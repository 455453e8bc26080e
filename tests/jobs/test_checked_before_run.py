"""What a job refuses before any work, in one line and exit 2 (pipeline/preflight.py): a --hardware file of the wrong
shape, an offload folder that cannot be written, a job-wide constraint that does not compile; and a plan that does
not fit names the options of the command that asked for it."""

import json

import pytest

from jobs import cli
from planner.errors import PlanInfeasible
from tests.jobs.test_cli import assert_user_error, invoke
from tests.pipeline.parquet_files import write_parquet


@pytest.fixture
def job(tmp_path, tiny_llama_dir):
    f = write_parquet(tmp_path / "a.parquet", prompt=["hi", "there"])
    return ["--model", tiny_llama_dir, "--input", f, "--output", tmp_path / "out"]


@pytest.mark.parametrize("content", ["[]", "null", '"fast"', '{"name": "x", "cpu": []}',
                                     '{"name": "x", "cpu": {"memory_bytes": "8GB"}}'])
def test_a_hardware_file_of_the_wrong_shape_is_one_line_and_exit_2(tmp_path, job, no_model_load, content):
    hw = tmp_path / "hw.json"
    hw.write_text(content)
    assert_user_error(invoke(*job, "--hardware", hw), f"hardware spec '{hw}' cannot be used", "flexbatch profile")
    from click.testing import CliRunner

    result = CliRunner().invoke(cli.main, ["plan", "--model", job[1], "--hardware", str(hw)])
    assert_user_error(result, f"hardware spec '{hw}' cannot be used")


def test_an_offload_folder_that_is_a_file_is_one_line_and_exit_2(tmp_path, job, no_model_load):
    taken = tmp_path / "taken"
    taken.write_text("")
    for folder, why in ((taken, "it is a file"), (taken / "offload", "Not a directory")):
        assert_user_error(invoke(*job, "--offload-dir", folder), f"the offload folder {folder} cannot be written "
                          f"({why})", "give --offload-dir a folder this user may write")
    assert not (tmp_path / "out").exists()


def test_an_offload_folder_this_user_cannot_write_is_one_line_and_exit_2(tmp_path, job, no_model_load, monkeypatch):
    """Mode 0500 for another user (the tests may run as root, whom a mode does not stop): writing a file fails."""
    import tempfile

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    assert_user_error(invoke(*job, "--offload-dir", tmp_path / "ro"), f"the offload folder {tmp_path / 'ro'} cannot "
                      "be written (Permission denied)")


@pytest.mark.parametrize("option", [["--regex", r"(a)\1"], ["--json-schema", "schema.json"]])
def test_a_job_wide_constraint_that_does_not_compile_is_refused_before_the_run(tmp_path, job, no_model_load, option):
    (tmp_path / "schema.json").write_text(json.dumps({"type": "string", "pattern": r"(a)\1"}))
    if option[0] == "--json-schema":
        option = [option[0], tmp_path / option[1]]
    result = invoke(*job, *option)
    assert_user_error(result, f"{option[0]} cannot constrain this job's answers", "does not compile")
    assert not (tmp_path / "out").exists()


def test_a_plan_that_does_not_fit_names_the_options_of_run_too():
    text = str(PlanInfeasible("cpu", 5 << 20, 1000))
    assert "--max-new-tokens" in text and "`flexbatch plan`" in text
