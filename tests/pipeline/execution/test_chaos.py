"""Faults at random moments (seeded): a Ray job whose actors and driver are SIGKILLed N times, rerun until it
completes, ends with every id exactly once and every part matching its manifest line; and an actor killed
by the kernel at its memory cgroup's limit is reported as such, with exit code 3."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.output.folder import MANIFEST_FILE
from pipeline.output.verify import verify_output
from tests.cgroups import memory_cgroup, remove_cgroup
from tests.pipeline.execution.test_driver_ray import _inputs, _output_rows, _start_job

pytestmark = pytest.mark.slow
SEED = 3  # which faults and when: the same choices every run (where they land depends on the machine's speed)
KILLS = 3
SHARDS = 45  # enough that each planned fault finds work left on a fast, idle machine


def _actor_pids(lines) -> set[int]:
    return {int(line.split("(pid ", 1)[1].split(")", 1)[0]) for line in list(lines)
            if " starts shard " in line and "(pid " in line}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _committed(out) -> int:
    path = out / MANIFEST_FILE
    return sum(line.endswith("}") for line in path.read_text().splitlines()) if path.exists() else 0


def _disrupt(rng: random.Random, proc, lines, out, shards: int) -> str | None:
    """After a random number of further commits (leaving work for later) and a random moment more, SIGKILL a
    random live actor or the driver; None if too little is left to interrupt."""
    done = _committed(out)
    if shards - done < 3:
        return None
    target = done + rng.randint(1, max(1, min(4, (shards - done) // 3)))  # most of the work left after the fault
    deadline = time.monotonic() + 240
    while _committed(out) < target and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.05))
    if proc.poll() is not None:
        return None
    actors = sorted(p for p in _actor_pids(lines) if _alive(p))
    if actors and rng.random() < 0.6:
        os.kill(rng.choice(actors), signal.SIGKILL)
        return "actor"
    os.kill(proc.pid, signal.SIGKILL)
    return "driver"


def test_random_kills_of_actors_and_the_driver_never_lose_or_duplicate_a_row(tmp_path, tiny_llama_dir, shared_ray):
    """Every run joins the suite's shared head: a killed driver's actors are stopped by Ray, not by the end of a
    local Ray of its own."""
    rng = random.Random(SEED)
    ids = _inputs(tmp_path / "in", files=3, rows=2 * SHARDS // 3)
    out = tmp_path / "out"
    args = ("--workers", "2", "--shard-rows", "2", "--max-new-tokens", "4", "--max-shard-retries", "5")
    done, kills, runs = None, [], 0
    while done is None and runs < KILLS + 3:
        proc, lines = _start_job(tmp_path, tiny_llama_dir, *args, ray=shared_ray)
        runs += 1
        while len(kills) < KILLS and proc.poll() is None:
            what = _disrupt(rng, proc, lines, out, SHARDS)
            if what is None:
                break
            kills.append(what)
            if what == "driver":
                break
        code = proc.wait(timeout=300)
        print(f"run {runs}: exit {code}, kills so far {kills}")
        if code == 0:
            done = "".join(lines)
        else:
            assert code == -signal.SIGKILL, (code, "".join(lines[-30:]))
    assert done is not None, f"no run completed after kills {kills}"
    assert len(kills) == KILLS, kills  # each planned fault happened (seed {SEED})
    assert sorted(r["id"] for r in _output_rows(out)) == sorted(ids)
    report = verify_output(out)
    assert report.ok and report.rows == len(ids), report.problems
    parts = [json.loads(line)["part"] for line in (out / MANIFEST_FILE).read_text().splitlines() if line.endswith("}")]
    assert len(parts) == len(set(parts)) == SHARDS  # each shard committed exactly once, across every run


# Fills its memory cgroup in 8 MiB steps until the kernel has killed something there, then exits.
HOG = """import sys, time
count = lambda: int(open(sys.argv[1]).read().split("oom_kill ")[1].split()[0])
held = []
while count() == 0:
    held.append(b"x" * (8 << 20))
    time.sleep(0.005)
"""


def test_an_actor_killed_at_its_memory_cgroups_limit_is_reported_with_exit_3(tmp_path):
    """The budget keeps the job's own tensors within the group (with --no-plan too), so here the memory is taken
    by another process of the group once a shard runs, as a neighbour would; the kernel is told to pick the
    actor."""
    from tests.conftest import DEMO_MODEL, REPO
    from tests.pipeline.execution.test_driver_ray import _started_shard_pid, _wait_for

    words = "the of and to in is was for on with as by at from that this".split()
    prompts = [" ".join(words[(i + k) % len(words)] for k in range(60)) for i in range(4096)]
    pq.write_table(pa.table({"prompt": prompts}), tmp_path / "in.parquet")
    group = memory_cgroup("flexbatch-actor-oom", 2000 * 2**20)
    enter = f'echo $$ > {group}/cgroup.procs && exec "$@"'
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"}
    job = subprocess.Popen(["sh", "-c", enter, "sh", sys.executable, "-m", "jobs.run", "--model", str(DEMO_MODEL),
                            "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"), "--dtype",
                            "float32", "--no-plan", "--gbs", "16", "--num-gb", "1", "--shard-rows", "4096",
                            "--max-new-tokens", "400", "--max-shard-retries", "0"], cwd=REPO, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True).start()
    hog = None
    try:
        actor = _wait_for(lambda: _started_shard_pid(lines), "the shard to start", timeout=300)
        with open(f"/proc/{actor}/oom_score_adj", "w") as f:
            f.write("1000")
        hog = subprocess.Popen(["sh", "-c", enter, "sh", sys.executable, "-c", HOG, str(group / "memory.oom_control")])
        job.wait(timeout=400)
    finally:
        for p in (job, hog):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        remove_cgroup(group)
    out = "".join(lines)
    assert job.returncode == 3, (job.returncode, out[-3000:])
    assert "was killed for memory" in out and "lower --cpu-mem or --shard-rows (now 4096 rows)" in out
    success = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert [f["out_of_memory"] for f in success["failed_shards"]] == [True]
