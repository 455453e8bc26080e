"""`flexbatch submit`: its options and errors (fast), and one job on a real Ray head with token auth (slow)."""

import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from jobs.submit import (
    PROJECT_ROOT,
    UPLOAD_EXCLUDES,
    _follow,
    entrypoint_for,
    load_runtime_env,
    submit_command,
)

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "examples" / "prompts.parquet"
RUN_ARGS = ["--input", "examples/prompts.parquet", "--output", "/tmp/flexbatch-never-written"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def invoke(*args):
    return CliRunner().invoke(submit_command, [str(a) for a in args])


def assert_one_line_error(result, *fragments):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flexbatch: error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_help_teaches_examples_and_token_auth():
    result = invoke("--help")
    assert result.exit_code == 0
    for fragment in ("Examples:", "flexbatch submit --address http://", "-- \\", "RAY_AUTH_MODE=token",
                     "~/.ray/auth_token", "ray get-auth-token", "RAY_AUTH_TOKEN", "--no-wait"):
        assert fragment in result.output, fragment


def test_unreachable_address_is_one_line_error_naming_it():
    address = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = invoke("--address", address, "--", *RUN_ARGS)
    assert_one_line_error(result, address, "cannot reach", "--address http://HEAD:8265")
    assert result.stdout == ""


def test_address_must_be_the_job_server_url():
    assert_one_line_error(invoke("--address", "127.0.0.1:6379", "--", *RUN_ARGS), "'127.0.0.1:6379'", "http://")


def test_run_options_are_required_after_double_dash():
    assert_one_line_error(invoke("--address", "http://127.0.0.1:8265"), "after --")


def test_run_options_are_checked_before_submitting():
    result = invoke("--address", "http://127.0.0.1:8265", "--", "--input", "x.parquet", "--outptu", "out")
    assert_one_line_error(result, "--outptu")
    assert_one_line_error(invoke("--address", "http://127.0.0.1:8265", "--", "--input", "x.parquet"), "--output")


def test_runtime_env_file_must_be_a_mapping_without_working_dir(tmp_path):
    for text, fragment in [("working_dir: /elsewhere\n", "working_dir"), ("- a\n- b\n", "mapping"),
                           ("env_vars: [unclosed\n", "YAML")]:
        path = tmp_path / "env.yaml"
        path.write_text(text)
        result = invoke("--address", "http://127.0.0.1:8265", "--runtime-env", path, "--", *RUN_ARGS)
        assert_one_line_error(result, str(path), fragment)


def test_runtime_env_uploads_the_project_without_venv_and_caches(tmp_path):
    path = tmp_path / "env.yaml"
    path.write_text("env_vars: {A: '1'}\nexcludes: ['/data', '/.venv']\n")
    env = load_runtime_env(path)
    assert env["working_dir"] == str(PROJECT_ROOT) == str(REPO)
    assert env["env_vars"] == {"A": "1"}
    assert env["excludes"] == UPLOAD_EXCLUDES + ["/data"]
    assert {"/.venv", "/.git", "/out"} <= set(env["excludes"])
    default = load_runtime_env(REPO / "infra" / "runtime_env.yaml")
    assert "working_dir" in default and "pip" not in default


def test_entrypoint_runs_jobs_run_with_quoted_options():
    assert entrypoint_for(["--input", "my prompts.parquet", "--stop", "'"]) == \
        "python -m jobs.run --input 'my prompts.parquet' --stop ''\"'\"''"


class FakeClient:
    """The job client's follow methods: the log stream breaks after its first chunk; polling goes on."""

    def __init__(self):
        self.statuses = iter(["RUNNING", "SUCCEEDED"])
        self.logs = "line 1\n"

    async def tail_job_logs(self, job_id):
        yield "line 1\n"
        raise RuntimeError("WebSocket connection closed unexpectedly")

    def get_job_status(self, job_id):
        status = next(self.statuses)
        self.logs += f"{status}\n"
        return type("Status", (), {"value": status})

    def get_job_logs(self, job_id):
        return self.logs


def test_follow_polls_on_where_a_broken_log_stream_stopped(monkeypatch, capsys):
    monkeypatch.setattr("jobs.submit.POLL_S", 0.01)
    assert _follow(FakeClient(), "raysubmit_x") == "SUCCEEDED"
    out = capsys.readouterr()
    assert out.out == "line 1\nRUNNING\nSUCCEEDED\n"  # each line once
    assert "polling" in out.err


# ---- end to end: the suite's Ray head (tests/ray_cluster.py: 127.0.0.1, token auth), the demo job submitted
# and followed ----

def _submit(url: str, env: dict, cwd: Path, *run_args) -> subprocess.Popen:
    """`submit_command` in a fresh process (Ray reads RAY_AUTH_MODE once per process); communicate() waits."""
    command = [sys.executable, "-c", "from jobs.submit import submit_command; submit_command()",
               "--address", url, "--", *map(str, run_args)]
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_submitted_demo_job_writes_one_row_per_input_row(shared_ray, tmp_path):
    url, env = shared_ray.url, shared_ray.env
    out = tmp_path / "out"
    run_args = ["--input", "examples/prompts.parquet", "--output", out, "--max-new-tokens", "4", "--workers", "1"]
    no_mode = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
    wrong_token = {**env, "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    refused_args = [[*run_args[:3], tmp_path / f"refused{i}", *run_args[4:]] for i in range(2)]
    # the job and the two clients without a valid token, at the same time (each client a Python of its own)
    process = _submit(url, env, tmp_path, *run_args)
    refusals = [(_submit(url, no_mode, tmp_path, *refused_args[0]), "requires a token"),
                (_submit(url, wrong_token, tmp_path, *refused_args[1]), "refused this machine's token")]
    for refused, fragment in refusals:
        stdout, stderr = refused.communicate(timeout=60)
        assert refused.returncode == 2, stdout + stderr
        assert stderr.count("flexbatch: error: ") == 1
        assert fragment in stderr and url in stderr and "RAY_AUTH_MODE=token" in stderr

    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stdout + stderr
    assert "submitted job raysubmit_" in stdout and "ray job logs raysubmit_" in stdout
    assert "python -m jobs.run" in stdout  # the job's log, followed
    assert stdout.rstrip().endswith("SUCCEEDED")
    assert (out / "_SUCCESS").is_file()
    parts = sorted(out.glob("*.parquet"))
    assert parts
    ids = [i for part in parts for i in pq.read_table(part, columns=["id"]).column("id").to_pylist()]
    expected = pq.read_table(PROMPTS, columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == sorted(expected) and len(ids) == len(set(ids))
    assert not any((tmp_path / f"refused{i}").exists() for i in range(2))
