"""A constraint nested a thousand levels deep, in a Parquet `guided` column or a Batch line's `guided_json`,
fails its row or line alone naming the limit: the shard and the job go on, every other row is answered."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from engine.request import SamplingParams
from pipeline import RunConfig, run_job

PROMPT = "Q: What is 12 plus 30? A:"
DEEP_TEXT = '{"json_schema": ' + '{"a": ' * 1000 + "1" + "}" * 1001  # ~7 KB
LIMIT = "the limit is 256"


def _deep_schema(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_a_deep_guided_value_fails_its_row_and_the_shard_is_written(tmp_path, demo_model_dir):
    table = pa.table({"prompt": [PROMPT] * 3, "guided": [None, DEEP_TEXT, None]})
    pq.write_table(table, tmp_path / "in.parquet")
    summary = run_job(RunConfig(model=demo_model_dir, input=str(tmp_path / "in.parquet"), output=tmp_path / "out",
                                dtype="float32", use_ray=False, params=SamplingParams(max_new_tokens=3)))
    assert summary.ok and summary.rows == 3 and summary.error_rows == 1
    rows = pq.read_table(tmp_path / "out" / "in.parquet").to_pylist()
    assert [r["finish_reason"] for r in rows] == ["length", "error", "length"]
    assert "per-row parameter" in rows[1]["error"] and LIMIT in rows[1]["error"]


def test_a_deep_guided_json_fails_its_line_and_the_job_runs(tmp_path, demo_model_dir):
    def line(cid, **body):
        return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/completions",
                           "body": {"prompt": PROMPT, "max_tokens": 3, **body}})

    deep_schema = '{"type": "object", "properties": {"a": ' * 600 + '{"type": "integer"}' + "}}" * 600
    deep = line("deep", guided_json="s").replace('"guided_json": "s"', '"guided_json": ' + deep_schema)
    deep_body = line("deep-body", user="u").replace('"user": "u"', '"user": ' + "[" * 1000 + "]" * 1000)
    lines = [line("ok"), deep, deep_body, line("ok2")]
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    summary = run_job(RunConfig(model=demo_model_dir, input=str(tmp_path / "requests.jsonl"),
                                output=tmp_path / "out", dtype="float32", use_ray=False))
    assert summary.ok
    ok, deep, deep_body, ok2 = map(json.loads, (tmp_path / "out" / "requests.jsonl").read_text().splitlines())
    assert ok["error"] is None and ok2["error"] is None and ok2["custom_id"] == "ok2"
    assert "line 2 nests" in deep["error"]["message"] and "the limit is 264" in deep["error"]["message"]
    assert "line 3 nests 1002 levels deep" in deep_body["error"]["message"]


def test_a_guided_json_within_the_line_limit_but_past_the_constraint_limit_fails_its_line(tmp_path):
    from pipeline.input.openai_batch import parse_line

    text = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": PROMPT, "guided_json": _deep_schema(130)}})
    got = parse_line(text, 0, "f", SamplingParams(), chat=False)
    assert got.error is not None and LIMIT in got.error["message"] and not got.requests
