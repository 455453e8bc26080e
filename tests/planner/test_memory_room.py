"""The CPU memory a process may still take: MemAvailable or its memory cgroup's room (v1, v2), the smaller."""

import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine.memory.room import MemoryRoom, memory_room
from pipeline.plan.planning import CPU_BUDGET_SHARE, plan_budgets
from planner.hardware import save_hardware
from tests.cgroups import memory_cgroup, remove_cgroup, run_in_cgroup
from tests.planner.specs import server_cpu

MIB = 2**20


def _proc(tmp_path, cgroup_lines, mem_available_mib=20000, rss_mib=300):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {mem_available_mib * 1024} kB\n")
    (proc / "self" / "status").write_text(f"Name: python\nVmRSS: {rss_mib * 1024} kB\n")
    (proc / "self" / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    return proc


def _files(folder: Path, **files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def test_a_cgroup_v1_limit_below_mem_available_sets_the_room(tmp_path):
    proc = _proc(tmp_path, ["4:memory:/host/job", "0::/"])
    root = tmp_path / "cg"
    # inside a container the mount is the container's own cgroup: /host is not there, /job is
    _files(root / "memory" / "job", memory_stat=f"hierarchical_memory_limit {500 * MIB}\ntotal_inactive_file "
           f"{50 * MIB}\n", memory_usage_in_bytes=str(250 * MIB), memory_limit_in_bytes=str(2**63 - 4096))
    room = memory_room(proc, root)
    assert room.cgroup_limit_bytes == 500 * MIB and room.cgroup_used_bytes == 200 * MIB
    assert room.available_bytes == 300 * MIB and room.process_bytes == 300 * MIB
    assert "memory cgroup limit 500 MiB" in room.describe()


def test_a_cgroup_v2_parents_tighter_limit_counts(tmp_path):
    proc = _proc(tmp_path, ["0::/outer/inner"], mem_available_mib=1000)
    root = tmp_path / "cg"
    _files(root / "outer", memory_max=str(400 * MIB))
    _files(root / "outer" / "inner", memory_max="max", memory_current=str(150 * MIB),
           memory_stat=f"anon {100 * MIB}\ninactive_file {30 * MIB}\n")
    room = memory_room(proc, root)
    assert room.cgroup_limit_bytes == 400 * MIB and room.available_bytes == 280 * MIB


def test_without_a_limit_mem_available_is_the_room(tmp_path):
    proc = _proc(tmp_path, ["4:memory:/", "0::/"], mem_available_mib=1234)
    _files(tmp_path / "cg" / "memory", memory_stat=f"hierarchical_memory_limit {2**63 - 4096}\n",
           memory_usage_in_bytes=str(10**9))
    room = memory_room(proc, tmp_path / "cg")
    assert room.cgroup_limit_bytes is None and room.available_bytes == 1234 * MIB


def test_the_budget_is_a_share_of_the_room_and_a_larger_cpu_mem_is_lowered(caplog):
    room = MemoryRoom(100 * MIB, 20000 * MIB, 400 * MIB, 300 * MIB, 300 * MIB)
    assert plan_budgets({}, room)["cpu"] == pytest.approx(CPU_BUDGET_SHARE * 100 * MIB)
    with caplog.at_level(logging.WARNING):
        lowered = plan_budgets({"cpu": 250 * MIB, "gpu": None}, room)
    assert lowered["cpu"] == pytest.approx(CPU_BUDGET_SHARE * 100 * MIB)
    assert "--cpu-mem 250 MiB is more than" in caplog.text and "this process already holds 300 MiB" in caplog.text
    assert plan_budgets({"cpu": 10 * MIB}, room)["cpu"] == 10 * MIB


def test_the_budget_inside_a_real_memory_cgroup_fits_its_limit():
    group = memory_cgroup("flexbatch-budget", 600 * MIB)
    try:
        code = ("import torch, json; from pipeline.plan.planning import plan_budgets; from engine.memory.room import "
                "memory_room; r = memory_room(); print(json.dumps([plan_budgets({}, r)['cpu'], r.cgroup_limit_bytes, "
                "r.cgroup_used_bytes, r.mem_available_bytes]))")
        done = run_in_cgroup(group, [sys.executable, "-c", code], timeout=120)
        assert done.returncode == 0, done.stderr
        budget, limit, used, mem_available = (float(x) for x in done.stdout.strip().splitlines()[-1][1:-1].split(","))
        assert limit == 600 * MIB and 0 < used < limit  # torch alone is part of the cgroup's use
        assert budget == pytest.approx(CPU_BUDGET_SHARE * (limit - used)) and budget < mem_available / 4
    finally:
        remove_cgroup(group)


@pytest.mark.slow
@pytest.mark.parametrize("pins", [(), ("--percent", "0", "100", "0", "0", "0", "100")], ids=["planned", "kv-on-disk"])
def test_a_job_in_a_small_memory_cgroup_plans_within_it_instead_of_being_killed(tmp_path, demo_model_dir, pins):
    """Planned freely with a profile whose disk is as fast as memory, and with the KV cache pinned to the disk
    tier (read and written with direct I/O, engine/memory/disk_kv.py), 1,000 rows finish inside a 500 MiB group. (It was
    killed there in about one run of six to ten while the prefill's temporaries fragmented the C heap: the same
    plan peaked between 400 and 510 MiB; prefill in chunks of rows and, under a binding limit, large temporaries
    mmapped, engine/memory/heap.py, bring it to 341-364 MiB.)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import DEMO_PROMPTS, REPO

    prompts = pq.read_table(DEMO_PROMPTS, columns=["prompt"]).column(0).to_pylist()
    pq.write_table(pa.table({"prompt": [prompts[i % len(prompts)] for i in range(1000)]}), tmp_path / "in.parquet")
    fast_disk = replace(server_cpu(), disk_read_bytes_per_s=20e9, disk_write_bytes_per_s=20e9,
                        page_cache_bytes_per_s=20e9)
    spec_file = save_hardware(fast_disk, tmp_path / "fast-disk.json")
    group = memory_cgroup("flexbatch-job", 500 * MIB)
    try:
        done = run_in_cgroup(group, [sys.executable, "-m", "jobs.cli", "run", "--no-ray", "--model", str(demo_model_dir),
                                     "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"),
                                     "--max-new-tokens", "16", "--hardware", str(spec_file), *pins],
                             cwd=REPO, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        kills = (group / "memory.oom_control").read_text()
    finally:
        remove_cgroup(group)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # was 137: killed at the limit
    assert "oom_kill 0" in kills and "memory cgroup limit 500 MiB" in done.stderr
    assert "memory-mapped disk-tier scratch (activations, a 4-bit KV cache) counts in the CPU budget" in done.stderr
    assert "rows: 1000 in 1 files, 0 with errors" in done.stdout
    if pins:
        assert '"cache_cpu": 0.0' in done.stderr and '"cache_gpu": 0.0' in done.stderr  # all of it on disk


def test_engines_on_one_node_split_its_room(caplog):
    room = MemoryRoom(100 * MIB, 20000 * MIB, 400 * MIB, 300 * MIB, 300 * MIB)
    alone = plan_budgets({}, room)["cpu"]
    assert plan_budgets({}, room, engines=4)["cpu"] == pytest.approx(alone / 4)
    with caplog.at_level(logging.WARNING):
        lowered = plan_budgets({"cpu": 30 * MIB}, room, engines=4)  # fits one engine's room, not a quarter of it
    assert lowered["cpu"] == pytest.approx(alone / 4) and "4 engines on this node" in caplog.text
    assert plan_budgets({"cpu": 30 * MIB}, room)["cpu"] == 30 * MIB


def test_oom_kills_are_the_cgroups_count_else_the_machines(tmp_path):
    from engine.memory.room import oom_kills_here

    proc = _proc(tmp_path, ["4:memory:/job", "0::/"])
    (proc / "vmstat").write_text("pgfault 10\noom_kill 7\n")
    _files(tmp_path / "cg" / "memory" / "job", memory_oom_control="oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oom_kills_here(proc, tmp_path / "cg") == 2
    bare = _proc(tmp_path / "bare", ["0::/"])
    (bare / "vmstat").write_text("pgfault 10\noom_kill 7\n")
    assert oom_kills_here(bare, tmp_path / "bare" / "cg") == 7
