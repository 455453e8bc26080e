"""The job on Ray, on loopback: two actors over several files, an actor killed mid-shard, the driver killed with
SIGKILL and the job resumed, a rerun with other parameters refused, and one actor per node of a 2-node cluster.
Every check is row by row: every input id exactly once in the output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest

from engine.request import SamplingParams
from pipeline import RunConfig, run_job
from pipeline.errors import OutputFolderError
from pipeline.output.folder import MANIFEST_FILE, SUCCESS_FILE
from pipeline.plan.planning import CPU_BUDGET_SHARE
from tests.pipeline.parquet_files import write_parquet

pytestmark = pytest.mark.slow
WORDS = "the of and to in is was for on with as by at from that this".split()


def _inputs(folder, files=3, rows=8):
    """`files` Parquet files of `rows` distinct prompts each; returns every id the output must hold."""
    ids = []
    for f in range(files):
        prompts = [" ".join(WORDS[(f * 7 + r * 3 + k) % len(WORDS)] for k in range(4 + r % 5)) for r in range(rows)]
        write_parquet(folder / f"f{f}.parquet", prompt=prompts)
        ids += [f"f{f}:{r}" for r in range(rows)]
    return ids


def _output_rows(folder):
    parts = sorted(p for p in folder.iterdir() if p.suffix == ".parquet")
    return [row for p in parts for row in pq.read_table(p).to_pylist()]


def _config(tmp_path, model, **kw):
    kw.setdefault("input", str(tmp_path / "in"))
    kw.setdefault("output", tmp_path / "out")
    kw.setdefault("dtype", "float32")
    kw.setdefault("params", SamplingParams(max_new_tokens=5))
    return RunConfig(model=model, **kw)


@pytest.fixture
def ray_shutdown():
    yield
    import ray

    ray.shutdown()


def test_two_actors_over_three_files_match_a_single_process_run(tmp_path, tiny_llama_dir, ray_address):
    ids = _inputs(tmp_path / "in")
    summary = run_job(_config(tmp_path, tiny_llama_dir, address=ray_address, workers=2, shard_rows=4))
    assert summary.ok and len(summary.workers) == 2 and summary.shards == 6
    assert len({w["pid"] for w in summary.workers}) == 2
    # both engines are on this node: each keeps to half its room (below half of all its memory, whatever is free)
    total = float(open("/proc/meminfo").read().split("MemTotal:")[1].split()[0]) * 1024
    assert all(w["node_engines"] == 2 and 0 < w["cpu_budget"] <= CPU_BUDGET_SHARE * total / 2 for w in summary.workers)
    rows = _output_rows(tmp_path / "out")
    assert sorted(r["id"] for r in rows) == sorted(ids)
    assert all(r["finish_reason"] == "length" for r in rows)

    local = run_job(_config(tmp_path, tiny_llama_dir, output=tmp_path / "local", use_ray=False))
    assert local.shards == 3  # without --shard-rows, one shard per small file
    expected = {r["id"]: r["completion"] for r in _output_rows(tmp_path / "local")}
    assert {r["id"]: r["completion"] for r in rows} == expected
    success = json.loads((tmp_path / "out" / SUCCESS_FILE).read_text())
    assert success["ok"] and success["rows"] == len(ids) and len(success["workers"]) == 2


def _start_job(tmp_path, model, *extra, ray=None):
    """`python -m jobs.run` in a subprocess, on the Ray head `ray` (tests/ray_cluster.py) if given, else on a
    local Ray of its own; its output lines are collected by a thread."""
    args = [sys.executable, "-m", "jobs.run", "--model", str(model), "--input", str(tmp_path / "in"), "--output",
            str(tmp_path / "out"), "--dtype", "float32", "--no-plan", "--gbs", "2", *extra]
    if ray is not None:
        args += ["--address", ray.address]
    env = {**(os.environ if ray is None else ray.env), "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0",
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def _wait_for(predicate, what, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _started_shard_pid(lines):
    for line in list(lines):
        if " starts shard " in line and "(pid " in line:
            return int(line.split("(pid ", 1)[1].split(")", 1)[0])
    return None


def test_an_actor_killed_mid_shard_is_replaced_and_no_row_is_lost(tmp_path, tiny_llama_dir, shared_ray):
    ids = _inputs(tmp_path / "in", files=3, rows=6)
    proc, lines = _start_job(tmp_path, tiny_llama_dir, "--workers", "2", "--shard-rows", "3",
                             "--max-new-tokens", "40", ray=shared_ray)
    pid = _wait_for(lambda: _started_shard_pid(lines), "a worker to start a shard")
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=240) == 0, "".join(lines[-40:])
    text = "".join(lines)
    assert "died; starting a replacement" in text and "requeued" in text
    rows = _output_rows(tmp_path / "out")
    assert sorted(r["id"] for r in rows) == sorted(ids)
    success = json.loads((tmp_path / "out" / SUCCESS_FILE).read_text())
    assert success["ok"] and success["rows"] == len(ids) and not success["failed_shards"]


def _manifest_lines(folder):
    path = folder / MANIFEST_FILE
    return path.read_text().splitlines() if path.exists() else []


def test_a_killed_driver_resumes_without_redoing_or_touching_committed_parts(tmp_path, tiny_llama_dir,
                                                                           shared_ray):
    """On the shared head: the killed driver's actor is stopped by Ray (its owner is gone), and the rerun joins
    the same cluster."""
    ids = _inputs(tmp_path / "in", files=3, rows=6)
    out = tmp_path / "out"
    args = ("--workers", "1", "--shard-rows", "2", "--max-new-tokens", "24")
    proc, lines = _start_job(tmp_path, tiny_llama_dir, *args, ray=shared_ray)
    _wait_for(lambda: _manifest_lines(out), "a committed shard")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    committed = [json.loads(line) for line in _manifest_lines(out) if line.endswith("}")]
    assert 1 <= len(committed) < 9 and not (out / SUCCESS_FILE).exists()
    before = {c["part"]: ((out / c["part"]).read_bytes(), (out / c["part"]).stat().st_mtime_ns) for c in committed}

    proc, lines = _start_job(tmp_path, tiny_llama_dir, *args, ray=shared_ray)
    assert proc.wait(timeout=240) == 0, "".join(lines[-40:])
    for part, (data, mtime) in before.items():
        assert (out / part).read_bytes() == data and (out / part).stat().st_mtime_ns == mtime
    rows = _output_rows(out)
    assert sorted(r["id"] for r in rows) == sorted(ids)
    success = json.loads((out / SUCCESS_FILE).read_text())
    assert success["skipped_shards"] == len(committed) and success["new_shards"] == 9 - len(committed)
    assert f"{len(committed)} committed by an earlier run" in "".join(lines)

    with pytest.raises(OutputFolderError, match=r"another job's output .*\['params'\].*--overwrite"):
        run_job(_config(tmp_path, tiny_llama_dir, params=SamplingParams(max_new_tokens=7), use_ray=False))


def test_a_two_node_cluster_gets_one_actor_per_node(tmp_path, tiny_llama_dir, ray_shutdown):
    from ray.cluster_utils import Cluster

    # no dashboard: nothing here asks it, and its processes take most of the cluster's start on 2 cores
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ids = _inputs(tmp_path / "in", files=2, rows=4)
        # URIs: the actors read and write through pyarrow's filesystem, parts written once under their final key
        summary = run_job(_config(tmp_path, tiny_llama_dir, address=cluster.address, shard_rows=2, plan=False,
                                  input=f"file://{tmp_path}/in", output=f"file://{tmp_path}/out"))
        assert summary.ok and len(summary.workers) == 2
        assert len({w["node"] for w in summary.workers}) == 2
        assert sorted(r["id"] for r in _output_rows(tmp_path / "out")) == sorted(ids)
        import ray

        from engine.memory.room import oom_kills_here
        from pipeline.execution.ray_runtime import node_oom_kills

        # a lost worker's node is asked for its OOM kill count: here every node shares this process's group
        ray.init(address=cluster.address)
        assert [w["oom_kills"] for w in summary.workers] == [oom_kills_here()] * 2
        assert [node_oom_kills(w["node"]) for w in summary.workers] == [oom_kills_here()] * 2
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()


def test_a_user_error_in_an_actors_setup_reaches_the_driver_as_itself(tmp_path, tiny_llama_dir, ray_address):
    from planner.errors import PlanInfeasible

    _inputs(tmp_path / "in", files=1, rows=2)
    with pytest.raises(PlanInfeasible, match="the cpu tier is short by") as caught:
        run_job(_config(tmp_path, tiny_llama_dir, address=ray_address, workers=1, budgets={"cpu": 1024.0}))
    assert caught.value.tier == "cpu"
