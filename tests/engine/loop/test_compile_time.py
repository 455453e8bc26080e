"""A constraint's compile limit is counted in the compile's own CPU time, so a busy machine slows a compile without
failing it, and the clock cuts off at a multiple of the limit a compile that gets no CPU at all; the plain rows of a
job beside a CPU hog are written whatever its constraints do."""

import json
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

import flexbatch
from engine.loop import grammar
from engine.loop.compile_jobs import CompileJobs
from tests.pipeline.parquet_files import write_parquet


def _jobs(compile_one, seconds: float, wait_factor: float) -> CompileJobs:
    return CompileJobs(compile_one, seconds, lambda s: f"too slow ({s:g} s)", wait_factor)


def test_a_compile_slowed_by_a_busy_machine_is_not_failed():
    """0.6 s by the clock and almost no CPU (its thread waiting for a core, as on a loaded machine): within a
    0.2 s limit of CPU time."""
    jobs = CompileJobs(lambda key: time.sleep(0.6) or "compiled", 0.2, lambda s: "too slow")  # waits 4x at most
    assert jobs.wait(jobs.submit(("regex", "a"))) == "compiled"


def test_a_compile_that_gets_no_cpu_is_cut_off_by_the_clock():
    jobs = _jobs(lambda key: time.sleep(3) or "compiled", seconds=0.1, wait_factor=3)
    began = time.monotonic()
    assert jobs.wait(jobs.submit(("regex", "b"))) == "too slow (0.1 s)"
    assert 0.25 < time.monotonic() - began < 1.5


def test_a_compile_past_its_cpu_time_is_cut_off():
    def spin(key):
        end = time.thread_time() + 2.0
        while time.thread_time() < end:
            pass
        return "compiled"

    jobs = _jobs(spin, seconds=0.2, wait_factor=100)
    began = time.monotonic()
    assert jobs.wait(jobs.submit(("regex", "c"))) == "too slow (0.2 s)"
    assert time.monotonic() - began < 1.5


@pytest.fixture
def cpu_hog():
    """Two processes spinning on the machine's cores for the test's length (a compiler running beside the job)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for p in hogs:
        p.kill()
        p.wait()


def test_a_job_with_a_deep_value_and_a_slow_compile_beside_a_cpu_hog_writes_every_plain_row(
        tmp_path, tiny_llama_dir, cpu_hog, monkeypatch):
    from engine.loop import compile_jobs

    monkeypatch.setattr(grammar, "COMPILE_SECONDS", 5.0)
    deep = '{"json_schema": ' + '{"a": ' * 1500 + "1" + "}" * 1501
    properties = {f"p{i}": {"type": "integer"} for i in range(1000)}  # ~1 s of CPU to compile
    slow = json.dumps({"json_schema": {"type": "object", "properties": properties}})
    f = write_parquet(tmp_path / "a.parquet", id=["plain-0", "deep", "slow", "plain-1"],
                      prompt=["The quick", "def add(", "Once upon", "Hello"], guided=[None, deep, slow, None])
    earlier = set(compile_jobs._RUNNING)  # compiles an earlier test of this process abandoned, still spinning
    began = time.monotonic()
    summary = flexbatch.run(tiny_llama_dir, str(f), str(tmp_path / "out"), use_ray=False, max_new_tokens=3,
                            dtype="float32")
    assert time.monotonic() - began < 60
    rows = {r["id"]: r for r in pq.read_table(summary.parts[0]).to_pylist()}
    assert [rows[k]["completion_tokens"] for k in ("plain-0", "plain-1")] == [3, 3]
    assert "nests 1501 levels deep; the limit is 256" in rows["deep"]["error"]
    assert rows["slow"]["error"] is None and rows["slow"]["completion"].startswith("{")
    assert not compile_jobs._RUNNING - earlier  # none of this job's compiles outlives it
