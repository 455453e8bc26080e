"""`flexbatch run` with chat rows and OpenAI Batch files: the options in --help, a run on the bundled batch file,
--show for both formats, and a chat job on a checkpoint without a chat template refused in one line."""

import json

import pyarrow as pa
from click.testing import CliRunner

from jobs import cli
from tests.jobs.test_cli import REPO, assert_user_error, invoke
from tests.pipeline.parquet_files import write_parquet


def test_help_shows_the_formats_and_chat():
    text = " ".join(CliRunner().invoke(cli.main, ["run", "--help"]).output.split())
    assert "--format [auto|parquet|openai]" in text and "--chat [auto|on|off]" in text
    assert "OpenAI Batch" in text and "requests.jsonl" in text


def test_the_bundled_batch_file_runs_on_the_demo_model(tmp_path):
    requests = REPO / "examples" / "requests.jsonl"
    result = invoke("--input", requests, "--output", tmp_path / "out", "--max-new-tokens", 8, "--show", 3,
                    "--dtype", "float32")
    assert result.exit_code == 0, (result.output, result.exception)
    lines = [json.loads(t) for t in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    ids = [json.loads(t)["custom_id"] for t in requests.read_text().splitlines()]
    assert [o["custom_id"] for o in lines] == ids and all(o["error"] is None for o in lines)
    assert len(lines[-1]["response"]["body"]["choices"]) == 2
    assert "[facts-test-0000]  -> " in result.stdout and f"rows: {len(ids)} in 1 files" in result.stdout


def test_chat_rows_show_their_last_message(tmp_path, chat_checkpoint):
    messages = pa.array([[{"role": "user", "content": "What is 12 plus 30?"}]],
                        pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))
    f = write_parquet(tmp_path / "c.parquet", messages=messages)
    result = invoke("--model", chat_checkpoint("qwen2"), "--input", f, "--output", tmp_path / "out",
                    "--max-new-tokens", 3, "--show", 1, "--dtype", "float32")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "[c:0] What is 12 plus 30? -> " in result.stdout


def test_chat_lines_on_a_model_without_chat_template_exit_2(tmp_path, tiny_llama_dir, no_model_load):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                             "body": {"messages": [{"role": "user", "content": "hi"}]}}) + "\n")
    assert_user_error(invoke("--model", tiny_llama_dir, "--input", f, "--output", tmp_path / "out"),
                      "no chat template", "--chat off")


def test_the_bundled_chats_run_on_a_chat_checkpoint_and_are_refused_by_the_demo_model(tmp_path, chat_checkpoint):
    chats = REPO / "examples" / "chats.parquet"
    result = invoke("--model", chat_checkpoint("qwen2"), "--input", chats, "--output", tmp_path / "out",
                    "--max-new-tokens", 2, "--dtype", "float32")
    assert result.exit_code == 0 and "rows: 6 in 1 files, 0 with errors" in result.stdout, result.output
    assert_user_error(invoke("--input", chats, "--output", tmp_path / "demo"), "no chat template")
