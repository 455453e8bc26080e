"""A command that runs many small jobs keeps its engines between them (`WorkerPool`): the next job is planned
in the same worker, which keeps the loaded model where the job's model, settings and weight placement are the
same, and loads it again where they are not; the completions are those of a job run on its own."""

import dataclasses

import pytest

from engine.engine import Engine
from engine.request import SamplingParams
from pipeline import RunConfig, run_job
from pipeline.execution.driver import WorkerPool
from planner.hardware import save_hardware
from tests.pipeline.parquet_files import read_rows, write_parquet
from tests.planner.specs import server_cpu


@pytest.fixture
def loads(monkeypatch):
    """How many times a model was loaded."""
    count, load = [0], Engine.load.__func__

    def spy(cls, *args, **kwargs):
        count[0] += 1
        return load(cls, *args, **kwargs)

    monkeypatch.setattr(Engine, "load", classmethod(spy))
    return count


def test_jobs_in_a_pool_share_one_loaded_engine_and_complete_as_alone(tmp_path, tiny_llama_dir, loads):
    hw = save_hardware(server_cpu(), tmp_path / "hw.json")

    def config(name, **pins):
        write_parquet(tmp_path / name / "in.parquet", prompt=[f"{name} row {i}: the quick brown fox" for i in range(5)])
        return RunConfig(model=tiny_llama_dir, input=str(tmp_path / name / "in.parquet"), output=tmp_path / name / "out",
                         dtype="float32", use_ray=False, hardware=hw, params=SamplingParams(max_new_tokens=4,
                         logprobs=True), pins={"gbs": 2, "num_gb": 1, **pins})

    jobs = [config("a"), config("b"), config("c", compress_weight=True)]
    with WorkerPool() as pool:
        summaries = [run_job(c, pool) for c in jobs]
    assert [s.workers[0]["engine_reused"] for s in summaries] == [False, True, False]  # c's weights are 4-bit
    assert loads[0] == 2 and len({s.workers[0]["pid"] for s in summaries}) == 1
    pooled = read_rows(tmp_path / "b" / "out" / "in.parquet")
    alone = run_job(dataclasses.replace(jobs[1], output=tmp_path / "b" / "alone"))
    assert alone.workers[0]["engine_reused"] is False and loads[0] == 3
    assert [r["token_ids"] for r in pooled] == [r["token_ids"] for r in read_rows(tmp_path / "b" / "alone" / "in.parquet")]
