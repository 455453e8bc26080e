"""Parquet rows carrying `messages`: --chat auto/on/off, bad conversations as row errors, and a checkpoint without
a chat template refused before any weights load."""

import pyarrow as pa
import pytest

from engine.engine import Engine
from engine.request import Request, SamplingParams
from pipeline import RunConfig, prepare_job, run_job
from pipeline.errors import ConfigError, InputError
from pipeline.input.requests import build_requests
from tests.pipeline.parquet_files import read_rows, write_parquet

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string())])
GOOD = [
    [{"role": "user", "content": "What is 12 plus 30?", "name": None}],
    [{"role": "system", "content": "Answer briefly.", "name": None},
     {"role": "user", "content": "Product A: red kettle 2L. Same?", "name": "ann"}],
]


def _messages(rows) -> pa.Array:
    return pa.array(rows, pa.list_(MESSAGE))


def _config(tmp_path, model, **kw):
    kw.setdefault("input", str(tmp_path / "in"))
    return RunConfig(model=model, output=tmp_path / "out", dtype="float32", use_ray=False, **kw)


def test_chat_rows_complete_like_the_engine_and_bad_rows_fail_alone(tmp_path, chat_checkpoint):
    model = chat_checkpoint("qwen2")
    write_parquet(tmp_path / "in" / "a.parquet", messages=_messages([GOOD[0], None, [], GOOD[1]]),
                  prompt=["p0", "p1", "p2", "p3"])
    params = SamplingParams(max_new_tokens=5)
    summary = run_job(_config(tmp_path, model, params=params))
    rows = read_rows(tmp_path / "out" / "a.parquet")
    assert [r["id"] for r in rows] == [f"a:{i}" for i in range(4)] and summary.rows == 4
    assert summary.error_rows == 2 and [r["error"] is None for r in rows] == [True, False, False, True]
    assert "messages is null" in rows[1]["error"] and "empty list" in rows[2]["error"]
    engine = Engine.load(model, dtype="float32")
    direct = engine.generate([Request(str(i), "", params, messages=tuple(m)) for i, m in enumerate(GOOD)])
    assert [rows[0]["completion"], rows[3]["completion"]] == [c.text for c in direct]
    assert [rows[0]["prompt_tokens"], rows[3]["prompt_tokens"]] == [c.prompt_tokens for c in direct]


def test_chat_off_reads_the_prompt_column_and_on_needs_messages(tmp_path, chat_checkpoint, no_model_load):
    model = chat_checkpoint("llama3")
    write_parquet(tmp_path / "in" / "a.parquet", messages=_messages([GOOD[0]]), prompt=["plain text"])
    assert prepare_job(_config(tmp_path, model)).chat
    assert prepare_job(_config(tmp_path, model)).column == "messages"
    assert prepare_job(_config(tmp_path, model, chat="off")).column == "prompt"
    write_parquet(tmp_path / "in2" / "b.parquet", prompt=["plain text"])
    assert not prepare_job(_config(tmp_path, model, input=str(tmp_path / "in2"))).chat
    with pytest.raises(InputError, match="no prompt column 'messages'.*--chat off"):
        prepare_job(_config(tmp_path, model, input=str(tmp_path / "in2"), chat="on"))
    with pytest.raises(ConfigError, match="chat='yes' is invalid: expected one of auto, on, off"):
        _config(tmp_path, model, chat="yes")


def test_mixed_files_under_auto_are_refused(tmp_path, chat_checkpoint, no_model_load):
    write_parquet(tmp_path / "in" / "a.parquet", messages=_messages([GOOD[0]]))
    write_parquet(tmp_path / "in" / "b.parquet", prompt=["x"])
    with pytest.raises(InputError, match="pass --chat on or --chat off"):
        prepare_job(_config(tmp_path, chat_checkpoint("llama3")))


def test_a_checkpoint_without_chat_template_is_refused_before_loading(tmp_path, tiny_llama_dir, no_model_load):
    write_parquet(tmp_path / "in" / "a.parquet", messages=_messages([GOOD[0]]))
    with pytest.raises(ConfigError, match="has no chat template.*--chat off"):
        run_job(_config(tmp_path, tiny_llama_dir))
    assert not (tmp_path / "out").exists()


def test_build_requests_reads_the_messages_column_for_chat_rows():
    table = pa.table({"messages": _messages(GOOD)})
    items = build_requests(table, ["x", "y"], "prompt", SamplingParams(), chat=True)
    assert [type(i).__name__ for i in items] == ["Request", "Request"]
    assert items[1].messages[1]["name"] == "ann" and items[0].prompt == ""


def test_the_planner_sees_rendered_chat_prompt_lengths(tmp_path, chat_checkpoint, no_model_load):
    from engine.chat import chat_prompt_ids
    from engine.tokenizer import load_tokenizer
    from pipeline.plan.planning import workload_from_input

    model = chat_checkpoint("llama3")
    write_parquet(tmp_path / "in" / "a.parquet", messages=_messages([GOOD[1]] * 3))
    job = prepare_job(_config(tmp_path, model))
    tok = load_tokenizer(model)
    work = workload_from_input(job.files, job.column, tok, job.spec, 4, "float32")
    # three copies of one conversation: all but its last token is a prefix the rows share, computed once
    assert work.shared_len + work.prompt_len == len(chat_prompt_ids(tok, GOOD[1])) > 20 and work.num_prompts == 3
    assert work.prompt_len == 1


def test_a_system_message_gemma2_refuses_fails_its_row_and_the_job_runs_on(tmp_path, chat_checkpoint):
    """Gemma 2's template raises on a system role: that row's error is the template's own message, on one line;
    the other rows complete and the job succeeds."""
    model = chat_checkpoint("gemma2")
    write_parquet(tmp_path / "in" / "a.parquet", messages=_messages([GOOD[0], GOOD[1], GOOD[0]]))
    summary = run_job(_config(tmp_path, model, params=SamplingParams(max_new_tokens=3)))
    rows = read_rows(tmp_path / "out" / "a.parquet")
    assert summary.rows == 3 and summary.error_rows == 1
    assert [r["error"] is None for r in rows] == [True, False, True]
    assert rows[1]["error"].endswith("the chat template rejected these messages: System role not supported")
    assert "\n" not in rows[1]["error"] and rows[0]["completion_tokens"] == 3
