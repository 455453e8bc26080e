"""`flexbatch run`'s exit code says whether rows failed: 0 every row completed, 4 some rows failed, 5 every row
failed (each after the summary, which names the first row error); an empty stop string is refused (2)."""

from jobs.common import ALL_ROWS_FAILED_EXIT, ROW_ERRORS_EXIT
from tests.jobs.test_cli import assert_user_error, invoke
from tests.pipeline.parquet_files import write_parquet


def test_every_row_failed_exits_5_and_some_rows_4(tmp_path, tiny_llama_dir):
    f = write_parquet(tmp_path / "a.parquet", prompt=["hello", "world"], max_new_tokens=[10**9, 10**9])
    args = ["--model", tiny_llama_dir, "--input", f, "--dtype", "float32"]
    result = invoke(*args, "--output", tmp_path / "all")  # each row's own max_new_tokens: the job's is checked
    assert result.exit_code == ALL_ROWS_FAILED_EXIT == 5, result.output
    assert "rows: 2 in 1 files, 2 with errors" in result.stdout
    assert "every row failed, the first: [a:0] max_new_tokens=1000000000 leaves no room" in result.stdout
    g = write_parquet(tmp_path / "b.parquet", prompt=["hello", None])
    result = invoke("--model", tiny_llama_dir, "--input", g, "--dtype", "float32", "--output", tmp_path / "some",
                    "--max-new-tokens", 2)
    assert result.exit_code == ROW_ERRORS_EXIT == 4, result.output
    assert "first row error: [b:1] prompt column 'prompt' is null" in result.stdout


def test_an_empty_stop_string_is_refused(tmp_path, tiny_llama_dir, no_model_load):
    f = write_parquet(tmp_path / "a.parquet", prompt=["hello"])
    assert_user_error(invoke("--model", tiny_llama_dir, "--input", f, "--output", tmp_path / "out", "--stop", ""),
                      "stop=''", "non-empty string")
