"""Answer constraints through a job: a Parquet `guided` column (struct or JSON text), the job-wide --choice /
--regex / --json-schema options, and a Batch line's response_format (json_object, json_schema with strict) or
vLLM's guided_* fields. A bad constraint fails its row or line alone."""

import json
import re

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from engine.request import SamplingParams
from jobs import cli
from pipeline import RunConfig, run_job

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "sure": {"type": "boolean"}}, "required": ["answer", "sure"]}
PROMPT = "Q: What is 12 plus 30? A:"


def _run(tmp_path, model, table, **params):
    pq.write_table(table, tmp_path / "in.parquet")
    config = RunConfig(model=model, input=str(tmp_path / "in.parquet"), output=tmp_path / "out", dtype="float32",
                       use_ray=False, params=SamplingParams(max_new_tokens=40, **params))
    run_job(config)
    return pq.read_table(tmp_path / "out" / "in.parquet").to_pylist()


def test_a_guided_column_constrains_its_rows_and_the_job_option_the_rest(tmp_path, demo_model_dir):
    guided = [json.dumps({"json_schema": SCHEMA}), json.dumps({"regex": r" \d{1,3}"}), None,
              '{"regex": "(unclosed"}', json.dumps({"choice": [" 42", " 41"]})]
    table = pa.table({"prompt": [PROMPT] * 5, "guided": guided})
    rows = _run(tmp_path, demo_model_dir, table, guided={"choice": [" yes", " no"]})
    schema_row, regex_row, default_row, bad_row, choice_row = rows
    jsonschema.validate(json.loads(schema_row["completion"]), SCHEMA)
    assert re.fullmatch(r" \d{1,3}", regex_row["completion"])
    assert default_row["completion"] in (" yes", " no")
    assert bad_row["finish_reason"] == "error" and "regular expression" in bad_row["error"]
    assert choice_row["completion"] in (" 42", " 41") and choice_row["error"] is None


def test_a_struct_guided_column_mixes_kinds(tmp_path, demo_model_dir):
    kind = pa.struct([("choice", pa.list_(pa.string())), ("regex", pa.string())])
    column = pa.array([{"choice": [" A", " B"], "regex": None}, {"choice": None, "regex": " [a-z]{3}"}, None], kind)
    rows = _run(tmp_path, demo_model_dir, pa.table({"prompt": [PROMPT] * 3, "guided": column}))
    assert rows[0]["completion"] in (" A", " B")
    assert re.fullmatch(" [a-z]{3}", rows[1]["completion"])
    assert rows[2]["finish_reason"] == "length" and rows[2]["error"] is None  # unconstrained


def _line(cid, body):
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": {"prompt": PROMPT, **body}})


def test_batch_lines_take_response_format_and_vllm_guided_fields(tmp_path, demo_model_dir):
    strict = {"type": "json_schema", "json_schema": {"name": "sum", "schema": SCHEMA, "strict": True}}
    lines = [_line("schema", {"response_format": strict, "max_tokens": 40}),
             _line("object", {"response_format": {"type": "json_object"}, "max_tokens": 60}),
             _line("text", {"response_format": {"type": "text"}, "max_tokens": 3}),
             _line("choice", {"guided_choice": [" 42", " 24"], "max_tokens": 8}),
             _line("bad", {"response_format": {"type": "xml"}}),
             _line("two", {"response_format": {"type": "json_object"}, "guided_regex": "a"})]
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    run_job(RunConfig(model=demo_model_dir, input=str(tmp_path / "requests.jsonl"), output=tmp_path / "out",
                      dtype="float32", use_ray=False))
    out = {d["custom_id"]: d for d in map(json.loads, (tmp_path / "out" / "requests.jsonl").read_text().splitlines())}
    text = {k: v["response"]["body"]["choices"][0]["text"] for k, v in out.items() if v["error"] is None}
    jsonschema.validate(json.loads(text["schema"]), SCHEMA)
    obj = out["object"]["response"]["body"]["choices"][0]
    assert text["object"].startswith("{")  # any object: a small model may still be writing one at max_tokens
    assert obj["finish_reason"] == "length" or isinstance(json.loads(text["object"]), dict)
    assert text["choice"] in (" 42", " 24") and "text" in text
    assert "response_format" in out["bad"]["error"]["message"]
    assert "give one of" in out["two"]["error"]["message"]


def test_the_job_options_make_one_constraint(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    runner = CliRunner()
    both = runner.invoke(cli.main, ["run", "--no-ray", "--input", "x.parquet", "--output", str(tmp_path / "o"),
                                    "--choice", "a", "--regex", "b"])
    assert both.exit_code == 2 and "--choice and --regex" in both.output
    wrong = runner.invoke(cli.main, ["run", "--no-ray", "--input", "x.parquet", "--output", str(tmp_path / "o"),
                                     "--json-schema", str(bad)])
    assert wrong.exit_code == 2 and "holds a JSON list" in wrong.output
    from jobs.guided_options import guided_from_options

    assert json.loads(guided_from_options((), None, schema).json_schema) == SCHEMA
    assert guided_from_options((" Yes", " No"), None, None).choice == (" Yes", " No")


@pytest.mark.parametrize("fmt", [{"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": 3}},
                                 {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}, "json"])
def test_bad_response_formats_name_the_fix(fmt):
    from pipeline.input.openai_batch import parse_line

    line = parse_line(_line("c", {"response_format": fmt}), 0, "f", SamplingParams(), chat=True)
    assert line.error is not None and "response_format" in line.error["message"] and not line.requests


def test_the_ray_data_stage_reads_vllms_guided_decoding(demo_model_dir):
    from flexbatch.ray import Processor

    processor = Processor(model=demo_model_dir, dtype="float32", max_new_tokens=40)
    sampling = [{"guided_decoding": {"json": SCHEMA, "backend": None, "choice": None}},
                {"structured_outputs": {"choice": [" 42", " 24"]}, "max_tokens": 8},
                {"guided_decoding": {"regex": "(bad"}}]
    out = processor({"id": ["a", "b", "c"], "prompt": [PROMPT] * 3, "sampling_params": sampling})
    jsonschema.validate(json.loads(out["generated_text"][0]), SCHEMA)
    assert out["generated_text"][1] in (" 42", " 24")
    assert out["finish_reason"][2] == "error" and "regular expression" in out["error"][2]
