import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.request import DEFAULT_MAX_NEW_TOKENS
from jobs import cli, common
from tests.pipeline.parquet_files import read_rows, write_corrupt, write_parquet, write_unsupported_model

REPO = Path(__file__).resolve().parents[2]


def invoke(*args):
    """`flexbatch run` in this process (--no-ray); the Ray runs are tested in tests/pipeline/execution/test_driver_ray.py."""
    return CliRunner().invoke(cli.main, ["run", "--no-ray", *map(str, args)])


def assert_user_error(result, *fragments):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("flexbatch: error: ")]
    assert len(errors) == 1, lines
    for fragment in fragments:
        assert fragment in errors[0]
    assert result.stdout == ""


def test_help_teaches_every_option_and_its_default():
    result = CliRunner().invoke(cli.main, ["run", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for option in ("--model", "--input", "--output", "--prompt-column", "--max-new-tokens", "--temperature",
                   "--top-p", "--top-k", "--stop", "--seed", "--logprobs", "--dtype", "--batch-size",
                   "--truncate", "--overwrite", "--gbs", "--num-gb", "--percent", "--compress-weight",
                   "--compress-cache", "--cpu-attention", "--prefill-device", "--decode-device", "--gpu-mem",
                   "--cpu-mem", "--disk-mem", "--offload-dir", "--no-ray", "--address", "--workers",
                   "--shard-rows", "--max-shard-retries"):
        assert option in text
    assert f"[default: {DEFAULT_MAX_NEW_TOKENS}]" in text and "[default: prompt]" in text
    assert "Examples: flexbatch run --input" in text


def test_missing_prompt_column(tmp_path, tiny_llama_dir, no_model_load):
    f = write_parquet(tmp_path / "a.parquet", text=["hi"])
    result = invoke("--model", tiny_llama_dir, "--input", f, "--output", tmp_path / "out")
    assert_user_error(result, str(f), "'prompt'", "['text']")


def test_prompt_column_option_is_used(tmp_path, tiny_llama_dir, no_model_load):
    f = write_parquet(tmp_path / "a.parquet", text=["hi"])
    result = invoke("--model", tiny_llama_dir, "--input", f, "--output", tmp_path / "out", "--prompt-column", "text")
    assert isinstance(result.exception, AssertionError) and "model was loaded" in str(result.exception)


def test_corrupt_parquet_file(tmp_path, tiny_llama_dir, no_model_load):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["hi"])
    bad = write_corrupt(tmp_path / "in" / "b.parquet")
    result = invoke("--model", tiny_llama_dir, "--input", tmp_path / "in", "--output", tmp_path / "out")
    assert_user_error(result, str(bad), "not a readable Parquet file")


@pytest.mark.parametrize("spec", ["nothing.parquet", "*.parquet", "empty"])
def test_no_input_files_matched(tmp_path, tiny_llama_dir, no_model_load, spec):
    (tmp_path / "empty").mkdir()
    result = invoke("--model", tiny_llama_dir, "--input", tmp_path / spec, "--output", tmp_path / "out")
    assert_user_error(result, "no input files matched")


def test_missing_model_folder(tmp_path, no_model_load):
    f = write_parquet(tmp_path / "a.parquet", prompt=["hi"])
    result = invoke("--model", tmp_path / "no-model", "--input", f, "--output", tmp_path / "out")
    assert_user_error(result, "no-model", "does not exist")


def test_missing_demo_model_when_no_model_is_given(tmp_path, monkeypatch, no_model_load):
    monkeypatch.setattr(common, "demo_model_dir", lambda: tmp_path / "gone")
    f = write_parquet(tmp_path / "a.parquet", prompt=["hi"])
    result = invoke("--input", f, "--output", tmp_path / "out")
    assert_user_error(result, "demo model is missing", "--model")


def test_unknown_model_type(tmp_path, no_model_load):
    f = write_parquet(tmp_path / "a.parquet", prompt=["hi"])
    model = write_unsupported_model(tmp_path / "bert")
    result = invoke("--model", model, "--input", f, "--output", tmp_path / "out")
    assert_user_error(result, "'bert'", "not supported")


def test_output_folder_with_foreign_files(tmp_path, tiny_llama_dir, no_model_load):
    f = write_parquet(tmp_path / "a.parquet", prompt=["hi"])
    write_parquet(tmp_path / "out" / "theirs.parquet", x=[1])
    result = invoke("--model", tiny_llama_dir, "--input", f, "--output", tmp_path / "out")
    assert_user_error(result, "theirs.parquet", "--overwrite")


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [("--temperature", "-1", "--temperature=-1.0"), ("--top-p", "0", "--top-p=0.0"),
     ("--max-new-tokens", "0", "--max-new-tokens=0"), ("--cpu-mem", "lots", "--cpu-mem='lots'"), ("--decode-device", "split", "decode_split_layer >= 1")],
)
def test_bad_option_values(tmp_path, tiny_llama_dir, no_model_load, option, value, fragment):
    f = write_parquet(tmp_path / "a.parquet", prompt=["hi"])
    result = invoke("--model", tiny_llama_dir, "--input", f, "--output", tmp_path / "out", option, value)
    assert_user_error(result, fragment)


@pytest.mark.parametrize("args", [["--batch-size", "0"], ["--dtype", "float16"], ["--truncate", "right"], [],
                                  ["--compress-weight", "int3"],
                                  ["--batch-size", "2", "--gbs", "2"]])
def test_usage_errors_exit_2(tmp_path, args, no_model_load):
    result = CliRunner().invoke(cli.main, ["run", "--input", str(tmp_path), *args])
    assert result.exit_code == 2 and "Error" in result.stderr


def test_run_prints_a_summary_and_refuses_another_job_unless_overwrite(tmp_path, tiny_llama_dir):
    f = write_parquet(tmp_path / "a.parquet", prompt=["hello", None], max_new_tokens=[2, None])
    args = ["--model", tiny_llama_dir, "--input", f, "--output", tmp_path / "out", "--dtype", "float32"]
    result = invoke(*args, "--stop", "\n", "--stop", "Q:")
    assert result.exit_code == 4, result.stderr  # one row failed (ROW_ERRORS_EXIT)
    assert "rows: 2 in 1 files, 1 with errors" in result.stdout and f"output: {tmp_path / 'out'}" in result.stdout
    assert "tokens/s" in result.stdout
    assert json.loads((tmp_path / "out" / "_job.json").read_text())["config"]["params"]["stop"] == ["\n", "Q:"]

    assert_user_error(invoke(*args, "--seed", "1"), "another job's output", "--overwrite")
    assert invoke(*args, "--seed", "1", "--overwrite").exit_code == 4


def test_python_m_jobs_run_end_to_end(tmp_path, tiny_llama_dir, shared_ray):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["hello", "world"], id=["a", "b"])
    write_parquet(tmp_path / "in" / "b.parquet", prompt=["x"] * 3)
    command = [sys.executable, "-m", "jobs.run", "--model", str(tiny_llama_dir), "--input", str(tmp_path / "in"),
               "--output", str(tmp_path / "out"), "--max-new-tokens", "3", "--logprobs", "--dtype", "float32",
               "--address", shared_ray.address]  # on Ray: the suite's shared cluster
    env = {**shared_ray.env, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rows: 5 in 2 files, 0 with errors" in done.stdout
    a, b = read_rows(tmp_path / "out" / "a.parquet"), read_rows(tmp_path / "out" / "b.parquet")
    assert [r["id"] for r in a] == ["a", "b"] and [r["id"] for r in b] == ["b:0", "b:1", "b:2"]
    assert all(1 <= r["completion_tokens"] <= 3 and len(r["logprobs"]) == r["completion_tokens"] for r in a + b)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_bad_input_through_python_m_jobs_run_exits_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "jobs.run", "--input", str(tmp_path / "none.parquet"),
                           "--output", str(tmp_path / "out"), "--model", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("flexbatch: error: no input files matched")


def test_a_shard_that_fails_every_try_exits_1_and_is_listed(tmp_path, tiny_llama_dir, monkeypatch):
    import pipeline.execution.worker

    def broken(shard):
        raise OSError(f"cannot read {shard.path}")

    monkeypatch.setattr(pipeline.execution.worker, "read_shard", broken)
    f = write_parquet(tmp_path / "a.parquet", prompt=["hello"])
    result = invoke("--model", tiny_llama_dir, "--input", f, "--output", tmp_path / "out", "--no-plan",
                    "--max-shard-retries", "0")
    assert result.exit_code == 1, result.output
    assert "failed shard 0 (a.parquet, 1 rows) after 1 tries: OSError: cannot read" in result.stdout
