import dataclasses

import pyarrow as pa
import pytest

from engine.engine import Engine
from engine.errors import InvalidParamsError
from engine.request import SamplingParams
from pipeline import RunConfig, prepare_job, run_job
from pipeline.errors import ConfigError, InputError, OutputFolderError
from tests.pipeline.parquet_files import read_rows, write_parquet

LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 40  # several hundred tokens; context is 256


def _config(tmp_path, model, **kw):
    kw.setdefault("input", str(tmp_path / "in"))
    kw.setdefault("output", tmp_path / "out")
    kw.setdefault("dtype", "float32")
    kw.setdefault("use_ray", False)
    return RunConfig(model=model, **kw)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("dtype", "float16", "dtype='float16'"), ("truncate", "right", "truncate='right'"), ("pins", "fast", "pins"), ("pins", {"gbs": 0}, "gbs=0"),
     ("prompt_column", "", "prompt_column=''"), ("input", "", "input")],
)
def test_run_config_rejects_bad_options(tmp_path, field, value, message):
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, tmp_path / "m", **{field: value})


def test_an_input_inside_the_output_folder_is_refused(tmp_path, tiny_llama_dir, no_model_load):
    write_parquet(tmp_path / "out" / "a.parquet", prompt=["x"])
    with pytest.raises(InputError, match="lies in the output folder"):
        run_job(_config(tmp_path, tiny_llama_dir, input=str(tmp_path / "out")))


def test_plan_checks_everything_without_loading_or_writing(tmp_path, tiny_llama_dir, no_model_load):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["x", "y"])
    job = prepare_job(_config(tmp_path, tiny_llama_dir))
    assert [f.num_rows for f in job.files] == [2] and job.spec.model_type == "llama"
    assert str(job.folder) == str(tmp_path / "out") and not (tmp_path / "out").exists()


def test_job_over_several_files_keeps_every_row(tmp_path, tiny_llama_dir):
    write_parquet(tmp_path / "in" / "d1" / "x.parquet",
                  prompt=pa.array(["Q: What is 12 plus 30? A:", None, "", "def add(a, b):", LONG_PROMPT]),
                  max_new_tokens=[3, None, None, None, None])
    write_parquet(tmp_path / "in" / "d2" / "x.parquet",
                  prompt=["Product A: red kettle", "hello", "The quick"],
                  temperature=[None, -1.0, 0.8], id=[100, 101, None])
    write_parquet(tmp_path / "in" / "d2" / "empty.parquet", prompt=pa.array([], pa.string()))
    config = _config(tmp_path, tiny_llama_dir, input=f"{tmp_path}/in/**/*.parquet",
                     params=SamplingParams(max_new_tokens=6, logprobs=True), pins={"gbs": 2, "num_gb": 1})
    summary = run_job(config)

    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["0-x.parquet", "1-empty.parquet", "2-x.parquet", "_SUCCESS",
                                                     "_job.json", "_manifest.jsonl"]  # parts in input order
    first, second, empty = read_rows(out / "0-x.parquet"), read_rows(out / "2-x.parquet"), read_rows(out / "1-empty.parquet")
    assert (len(first), len(second), len(empty)) == (5, 3, 0)
    assert [r["id"] for r in first] == [f"0-x:{i}" for i in range(5)]
    assert [r["id"] for r in second] == ["100", "101", "2-x:2"]
    assert [r["finish_reason"] for r in first][1:] == ["error", "error", "length", "error"]
    assert "is null" in first[1]["error"] and "is empty" in first[2]["error"]
    assert "context of 256" in first[4]["error"] and first[4]["prompt_tokens"] > 256
    assert first[0]["completion_tokens"] <= 3 and first[3]["completion_tokens"] == 6
    assert second[1]["finish_reason"] == "error" and "temperature=-1.0" in second[1]["error"]
    assert second[1]["temperature"] == -1.0  # input columns are carried unchanged
    for row in first + second:
        ok = row["finish_reason"] != "error"
        assert (row["error"] is None) == ok
        assert (len(row["logprobs"]) == row["completion_tokens"]) if ok else row["logprobs"] is None
        assert (len(row["token_ids"]) == row["completion_tokens"]) if ok else row["token_ids"] is None

    assert (summary.files, summary.rows, summary.error_rows) == (3, 8, 4)
    assert summary.completion_tokens == sum(r["completion_tokens"] for r in first + second)
    assert summary.tokens_per_s > 0 and summary.output == out


def test_truncate_left_keeps_the_last_tokens_of_a_long_prompt(tmp_path, tiny_llama_dir):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=[LONG_PROMPT, "short"])
    run_job(_config(tmp_path, tiny_llama_dir, truncate="left", params=SamplingParams(max_new_tokens=4)))
    rows = read_rows(tmp_path / "out" / "a.parquet")
    assert [r["finish_reason"] for r in rows] == ["length", "length"]
    assert rows[0]["prompt_tokens"] <= 256 - 4 and rows[0]["error"] is None


def test_sampled_rows_differ_and_a_rerun_is_identical(tmp_path, tiny_llama_dir):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["The quick"] * 3, seed=[None, None, 11])
    config = _config(tmp_path, tiny_llama_dir, params=SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))
    run_job(config)
    first = read_rows(tmp_path / "out" / "a.parquet")
    assert first[0]["completion"] != first[1]["completion"]
    assert run_job(config).skipped_shards == 1  # same config: the committed part is kept
    assert read_rows(tmp_path / "out" / "a.parquet") == first
    # Neither the batch size nor how the input is spelled changes the completions, so the folder is reused.
    run_job(dataclasses.replace(config, pins={"gbs": 1, "num_gb": 1}, input=str(tmp_path / "in" / "a.parquet")))
    assert read_rows(tmp_path / "out" / "a.parquet") == first


def test_another_jobs_output_is_refused_before_loading_then_overwritten(tmp_path, tiny_llama_dir, monkeypatch):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["hello"])
    run_job(_config(tmp_path, tiny_llama_dir, params=SamplingParams(max_new_tokens=2)))
    other = _config(tmp_path, tiny_llama_dir, params=SamplingParams(max_new_tokens=3))
    with monkeypatch.context() as m:
        m.setattr(Engine, "load", lambda *a, **k: pytest.fail("loaded"))
        with pytest.raises(OutputFolderError, match=r"another job's output .*\['params'\]"):
            run_job(other)
    run_job(dataclasses.replace(other, overwrite=True))
    assert read_rows(tmp_path / "out" / "a.parquet")[0]["completion_tokens"] == 3


def test_a_checkpoint_changed_in_place_is_another_job(tmp_path, tiny_llama_dir, monkeypatch):
    """The same command after the weights at the model's path were replaced: the folder of the old completions
    refuses the new job (naming what changed), instead of reporting its rows as done."""
    import shutil

    model = shutil.copytree(tiny_llama_dir, tmp_path / "model")
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["hello"])
    config = _config(tmp_path, model, params=SamplingParams(max_new_tokens=2))
    run_job(config)
    weights = next(model.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes() + b" ")  # another checkpoint at the same path
    with monkeypatch.context() as m:
        m.setattr(Engine, "load", lambda *a, **k: pytest.fail("loaded"))
        with pytest.raises(OutputFolderError, match=r"another job's output .*\['model_files'\]"):
            run_job(config)


def test_a_planned_job_with_a_split_pinned_without_its_layer_is_checked_and_recorded(tmp_path, tiny_llama_dir):
    """With planning, pins need not make a whole policy (the search picks a pinned split's layer): the job's checks
    and its record read the pins, not a policy built from them."""
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["x"])
    config = _config(tmp_path, tiny_llama_dir, pins={"prefill_device": "split", "compress_weight": True,
                                                     "weight_format": "int8"})
    job = prepare_job(config)
    assert job.record["config"]["compress_weight"] is True and job.record["config"]["weight_format"] == "int8"
    assert job.record["run"]["pins"]["prefill_device"] == "split"
    with pytest.raises(InvalidParamsError, match="split_layer"):  # without planning: a whole policy
        _config(tmp_path, tiny_llama_dir, plan=False, pins={"prefill_device": "split"})


def test_the_output_folder_is_checked_once_under_the_lock_and_shards_are_cut_once(tmp_path, tiny_llama_dir,
                                                                                  monkeypatch):
    import pipeline.execution.driver as driver

    calls = []

    def spied(name, real):
        def spy(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return spy

    for name in ("check_output", "make_shards", "lock_output"):
        monkeypatch.setattr(driver, name, spied(name, getattr(driver, name)))
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["x", "y", "z"])
    config = _config(tmp_path, tiny_llama_dir, params=SamplingParams(max_new_tokens=2), shard_rows=1)
    assert run_job(config).shards == 3
    assert calls == ["lock_output", "check_output", "make_shards"]
    calls.clear()
    assert run_job(config).skipped_shards == 3  # resumed: the recorded layout, nothing cut again
    assert calls == ["lock_output", "check_output"]
