"""Refill in ordinary jobs: the workload's generation lengths come from the rows' own max_new_tokens and stop
strings, then from what finished rows really generated; with --refill auto the planner turns refill on for rows
that stop early, and the completions equal those of --refill off token for token."""

import pyarrow as pa
import pytest

from engine.policy import Policy
from engine.request import SamplingParams
from pipeline import RunConfig, run_job
from pipeline.input.sample import take_sample
from pipeline.plan.planning import (
    STOP_PRIOR,
    generation_lengths,
    measured_workload,
    refill_choice,
    workload_from_sample,
)
from pipeline.plan.settings import EngineSettings
from planner.hardware import save_hardware
from planner.workload import Workload
from tests.pipeline.parquet_files import read_rows, write_parquet
from tests.planner.specs import LLAMA_300M, server_cpu


@pytest.fixture
def hardware_file(tmp_path):
    return save_hardware(server_cpu(), tmp_path / "hw.json")


def test_row_lengths_come_from_the_rows_own_columns(tmp_path, tiny_llama_dir):
    from engine.spec import load_model_spec
    from engine.tokenizer import load_tokenizer
    from pipeline.job import inspect_job_inputs

    path = write_parquet(tmp_path / "in.parquet", prompt=["a", "b", "c", "d"], max_new_tokens=[10, None, 30, -2],
                         stop=pa.array([["\n"], None, [], None], pa.list_(pa.string())))
    files, _ = inspect_job_inputs(str(path))
    tok = load_tokenizer(tiny_llama_dir)
    rows = list(take_sample(files, "prompt", tok, gen_len=20, stop=()).row_lengths)
    assert rows == [(10, True), (20, False), (30, False), (20, False)]  # a bad value counts as the job's
    assert take_sample(files, "prompt", tok, gen_len=20, stop=(".",)).row_lengths[1] == (20, True)  # the job's stop
    spec = load_model_spec(tiny_llama_dir)
    longest, expected = generation_lengths(rows, spec)
    assert longest == 30 and expected == pytest.approx((10 * STOP_PRIOR + 20 + 30 + 20) / 4)
    work = workload_from_sample(take_sample(files, "prompt", tok, gen_len=20, stop=()), spec, "float32", 4)
    assert (work.gen_len, work.expected_gen_len) == (30, pytest.approx(expected))
    assert work.block_gen_len == pytest.approx((10 + 20 + 30 + 20) / 4)  # blocks group rows by max_new_tokens


def test_the_measured_length_decides_refill(hardware_file):
    settings = EngineSettings(hardware=hardware_file)
    work = Workload(64, 256, 512)  # rows that run to their max_new_tokens: nothing to refill
    policy = Policy(gbs=16, num_gb=1)
    assert not refill_choice(settings, work, LLAMA_300M, policy).refill
    early = measured_workload(work, rows=32, tokens=32 * 12)
    assert early.expected_gen_len == 12.0 and refill_choice(settings, early, LLAMA_300M, policy).refill
    pinned = EngineSettings(hardware=hardware_file, pins={"refill": False})
    assert pinned.pins["refill"] is False and not refill_choice(pinned, early, LLAMA_300M, policy).refill
    assert measured_workload(work, rows=0, tokens=0) is work


def test_a_job_of_rows_that_stop_early_refills_and_equals_refill_off(tmp_path, tiny_llama_dir, hardware_file):
    prompts = [f"Row {i}: the {'quick ' * (i % 5)}brown fox" for i in range(12)]
    write_parquet(tmp_path / "in" / "a.parquet", prompt=prompts, max_new_tokens=[40] * 12,
                  stop=[["e", " "] if i % 4 else None for i in range(12)])

    def run(name: str, **pins):
        config = RunConfig(model=tiny_llama_dir, input=str(tmp_path / "in"), output=tmp_path / name, dtype="float32",
                           use_ray=False, hardware=hardware_file, params=SamplingParams(max_new_tokens=40, logprobs=True),
                           pins={"gbs": 2, "num_gb": 1, **pins})
        return run_job(config), read_rows(tmp_path / name / "a.parquet")

    auto, auto_rows = run("auto")
    off, off_rows = run("off", refill=False)
    assert auto.workers[0]["policy"]["refill"] is True and off.workers[0]["policy"]["refill"] is False
    assert sum(r["finish_reason"] == "stop" for r in auto_rows) >= 6  # most rows with a stop string end early
    assert [r["token_ids"] for r in auto_rows] == [r["token_ids"] for r in off_rows]
    assert [r["id"] for r in auto_rows] == [f"a:{i}" for i in range(12)]
