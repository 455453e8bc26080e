"""A bad row fails alone, everywhere rows become prompts: a chat template that raises, recurses or renders nothing,
inside the planning sample or outside it; Parquet strings and batch-file lines that are not UTF-8; token ids
outside the vocabulary. Each is that row's error, every other row completes, no shard fails, and the output
verifies. Ids shared by two rows, a column name given twice and a Parquet file passed as a batch file are refused
before any model loads."""

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline.job
from engine.request import SamplingParams
from pipeline import RunConfig, prepare_job, run_job
from pipeline.errors import InputError
from pipeline.input.sample import take_sample
from pipeline.output.verify import verify_output
from tests.engine.test_prompt_ids import FAULTY_TEMPLATE
from tests.pipeline.parquet_files import read_rows, write_parquet

MESSAGE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def _config(tmp_path, model, input, **kw):
    return RunConfig(model=model, input=str(input), output=tmp_path / "out", dtype="float32", use_ray=False,
                     params=SamplingParams(max_new_tokens=2), **kw)


def _not_utf8(values: list) -> pa.Array:
    """A string column holding the given bytes as they are (Arrow does not check a file's strings are UTF-8)."""
    return pa.array(values, pa.binary()).view(pa.string())


@pytest.fixture
def faulty_model(chat_checkpoint, tmp_path):
    folder = shutil.copytree(chat_checkpoint("qwen2"), tmp_path / "faulty")
    (folder / "chat_template.jinja").write_text(FAULTY_TEMPLATE)
    return folder


@pytest.fixture
def small_sample(monkeypatch):
    """The job plans from its first 4 rows, so that later rows are first seen by their shard's worker."""
    monkeypatch.setattr(pipeline.job, "take_sample", lambda *a, **kw: take_sample(*a, **{**kw, "limit": 4}))


def test_chat_template_failures_inside_and_outside_the_sample_fail_their_rows(tmp_path, faulty_model, small_sample):
    texts = [f"hello {i}" for i in range(10)]
    texts[1], texts[6], texts[8] = "boom", "deep", "empty"  # row 1 is in the planning sample, 6 and 8 are not
    f = write_parquet(tmp_path / "in" / "c.parquet", messages=pa.array(
        [[{"role": "user", "content": t}] for t in texts], MESSAGE))
    summary = run_job(_config(tmp_path, faulty_model, f, shard_rows=4))
    assert summary.failed_shards == () and summary.rows == 10 and summary.error_rows == 3
    rows = [r for part in summary.parts for r in read_rows(part)]
    errors = {r["id"]: r["error"] for r in rows if r["error"]}
    assert sorted(errors) == ["c:1", "c:6", "c:8"]
    assert "ZeroDivisionError: division by zero" in errors["c:1"] and "recursed without end" in errors["c:6"]
    assert "empty prompt" in errors["c:8"]
    assert all(r["completion_tokens"] >= 1 for r in rows if not r["error"])
    assert verify_output(tmp_path / "out").ok


def test_parquet_strings_that_are_not_utf8_fail_their_rows(tmp_path, tiny_llama_dir):
    f = write_parquet(tmp_path / "in" / "a.parquet", id=_not_utf8([b"x\xff", b"x\xfe", b"ok", None]),
                      prompt=_not_utf8([b"hello", b"world", b"caf\xe9", b"fine"]))
    summary = run_job(_config(tmp_path, tiny_llama_dir, f))
    rows = pq.read_table(tmp_path / "out" / "a.parquet", columns=["id", "error"]).to_pylist()  # prompts as given
    assert summary.failed_shards == () and [r["id"] for r in rows] == ["x\\xff", "x\\xfe", "ok", "a:3"]
    assert [bool(r["error"]) for r in rows] == [True, True, True, False]
    assert "id column 'id' holds bytes that are not UTF-8" in rows[0]["error"] and "0xff" in rows[0]["error"]
    assert "column 'prompt' holds bytes that are not UTF-8" in rows[2]["error"] and "0xe9" in rows[2]["error"]
    assert verify_output(tmp_path / "out").ok


def test_batch_lines_not_utf8_or_with_ids_outside_the_vocabulary_fail_alone_and_a_bom_is_read(tmp_path,
                                                                                              tiny_llama_dir):
    def line(cid: bytes, prompt) -> bytes:
        body = json.dumps({"prompt": prompt, "max_tokens": 2}).encode()
        return b'{"custom_id": "' + cid + b'", "method": "POST", "url": "/v1/completions", "body": ' + body + b"}"

    lines = [line(b"first", "hello"), line(b"x\xff", "caf\u00e9"), line(b"x\xfe", "hi"), line(b"big", [1, 2, 10**8]),
             line(b"neg", [-1, 2]), line(b"last", [5, 6])]
    (tmp_path / "r.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines) + b"\r\n")
    summary = run_job(_config(tmp_path, tiny_llama_dir, tmp_path / "r.jsonl", shard_rows=3))
    out = [json.loads(t) for part in summary.parts for t in part.read_text().splitlines()]
    assert summary.failed_shards == () and [o["custom_id"] for o in out] == ["first", None, None, "big", "neg", "last"]
    assert [o["error"] is None for o in out] == [True, False, False, False, False, True]
    assert "line 2 is not UTF-8" in out[1]["error"]["message"] and "line 3 is not UTF-8" in out[2]["error"]["message"]
    assert "outside the model's vocabulary" in out[3]["error"]["message"]
    assert "never negative" in out[4]["error"]["message"]
    assert verify_output(tmp_path / "out").ok


@pytest.mark.parametrize(("columns", "named"), [
    ({"id": ["x", "x", "y"]}, "'x' (a.parquet row 0, a.parquet row 1)"),
    ({"id": [float("nan"), 1.0, float("nan")]}, "'nan' (a.parquet row 0, a.parquet row 2)"),
    ({"id": [None, "a:0", "b"]}, "'a:0' (a.parquet row 0, a.parquet row 1)"),  # a null gets the made id a:0
])
def test_ids_shared_by_two_rows_are_refused_before_the_model_loads(tmp_path, tiny_llama_dir, no_model_load,
                                                                   columns, named):
    f = write_parquet(tmp_path / "in" / "a.parquet", prompt=["p", "q", "r"], **columns)
    with pytest.raises(InputError, match="make the 'id' column unique, or drop it") as e:
        prepare_job(_config(tmp_path, tiny_llama_dir, f))
    assert named in str(e.value)


def test_a_given_id_equal_to_another_files_made_id_is_refused(tmp_path, tiny_llama_dir, no_model_load):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["p", "q"])
    write_parquet(tmp_path / "in" / "b.parquet", prompt=["r"], id=["a:1"])
    with pytest.raises(InputError, match=r"'a:1' \(b.parquet row 0, a.parquet row 1\)"):
        prepare_job(_config(tmp_path, tiny_llama_dir, tmp_path / "in"))
    write_parquet(tmp_path / "in" / "b.parquet", prompt=["r"], id=["a:2"])  # past a.parquet's rows: no clash
    assert prepare_job(_config(tmp_path, tiny_llama_dir, tmp_path / "in")).files[1].num_rows == 1


def test_batch_files_with_a_shared_custom_id_or_parquet_bytes_are_refused(tmp_path, tiny_llama_dir, no_model_load):
    line = '{"custom_id": "%s", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}'
    (tmp_path / "r.jsonl").write_text("\n".join(line % c for c in ("a", "b", "a", "c", "b")) + "\n")
    with pytest.raises(InputError, match=r"2 custom_ids appear on more than one line: 'a' \(lines 1, 3\); "
                                         r"'b' \(lines 2, 5\); give each line its own custom_id"):
        prepare_job(_config(tmp_path, tiny_llama_dir, tmp_path / "r.jsonl"))
    f = write_parquet(tmp_path / "p.parquet", prompt=["x"])
    with pytest.raises(InputError, match="is a Parquet file, not an OpenAI Batch file; pass --format parquet"):
        prepare_job(_config(tmp_path, tiny_llama_dir, f, format="openai"))


def test_a_column_name_given_twice_is_refused(tmp_path, tiny_llama_dir, no_model_load):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["prompt", "prompt"]),
                   tmp_path / "in" / "a.parquet")
    with pytest.raises(InputError, match=r"column names \['prompt'\] appear more than once; rename or drop"):
        prepare_job(_config(tmp_path, tiny_llama_dir, tmp_path / "in"))


def test_the_planning_sample_counts_ids_outside_the_vocabulary_as_a_failed_row(tmp_path, tiny_llama_dir):
    """The sample the job plans from follows the same rule as the engine: a line of ids outside the vocabulary
    has no prompt ids there (its row fails in its shard) instead of its length skewing the plan."""
    lines = [{"custom_id": c, "method": "POST", "url": "/v1/completions", "body": {"prompt": p, "max_tokens": 2}}
             for c, p in (("ok", [5, 6, 7]), ("big", [1, 2, 10**8] * 50))]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    job = prepare_job(_config(tmp_path, tiny_llama_dir, tmp_path / "r.jsonl"))
    assert sorted(job.sample.prompt_lengths) == [0, 3]
