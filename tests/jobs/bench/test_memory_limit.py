"""--memory-limit: each side runs as a whole process in its own cgroup v1 memory group; where groups cannot be
made the option is refused before any work; a side that outgrows the limit is reported as OOM-killed."""

import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from jobs import cli
from jobs.bench import memory_limit as ml
from jobs.bench import models as bm
from planner.hardware import save_hardware
from tests.planner.specs import server_cpu


def test_refused_where_cgroups_are_not_writable(tmp_path, monkeypatch):
    with pytest.raises(ml.CgroupUnavailable, match="--memory-limit needs a writable cgroup v1"):
        ml.check_cgroups(tmp_path)
    monkeypatch.setattr(ml, "CGROUP_ROOT", tmp_path)
    result = CliRunner().invoke(cli.main, ["bench", "engine", "--memory-limit", "1GiB", "--output",
                                           str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "writable cgroup v1 memory controller" in result.output
    assert not (tmp_path / "x.json").exists()
    result = CliRunner().invoke(cli.main, ["bench", "engine", "--memory-limit", "lots"])
    assert result.exit_code == 2 and "--memory-limit='lots' is not a size" in result.output
    result = CliRunner().invoke(cli.main, ["bench", "engine", "--memory-limit", "baseline+1.5x"])
    assert result.exit_code == 2 and "expected baseline+SHAREx with a share in (0, 1)" in result.output
    result = CliRunner().invoke(cli.main, ["bench", "engine", "--memory-limit", "1GiB", "--memory-limit-batches",
                                           "8,x"])
    assert result.exit_code == 2 and "'8,x': write batch sizes comma-separated" in result.output


def test_the_accelerate_batches_under_a_limit_are_an_option(monkeypatch):
    from jobs.bench import engine as bench_engine

    monkeypatch.setattr(bench_engine, "check_cgroups", lambda: None)
    assert bench_engine._memory_limit("baseline+0.4x", (8, 16)).acc_batches == (8, 16)
    assert bench_engine._memory_limit("700MiB", (4,)) == ml.MemoryLimitConfig(700 << 20, acc_batches=(4,))


def test_memory_limit_workloads_dtype_and_formats_are_options(monkeypatch):
    from jobs.bench import engine as bench_engine

    monkeypatch.setattr(bench_engine, "check_cgroups", lambda: None)
    cfg = bench_engine._memory_limit("6GiB", (1, 4), ("256x128+64", "8X16+4"), "float32", ("int4", "int8"))
    assert ml.MemoryLimitConfig(1 << 30).formats == ("uncompressed", "int4")
    assert cfg.workloads == (("256x128+64", 256, 128, 64), ("8X16+4", 8, 16, 4))
    assert ml.workloads_of(cfg) == {"256x128+64": (256, 128, 64, None), "8X16+4": (8, 16, 4, None)}
    assert ml.workloads_of(ml.MemoryLimitConfig(1 << 30)) == ml.MEMORY_WORKLOADS
    assert (cfg.dtype, cfg.formats) == ("float32", ("int4", "int8"))
    for bad in ("256x128", "256x128+0", "axb+c", "1x2x3+4"):
        with pytest.raises(ValueError, match="ROWSxPROMPT\\+GEN"):
            ml.parse_workload(bad)
    result = CliRunner().invoke(cli.main, ["bench", "engine", "--memory-limit", "1GiB", "--memory-workload", "8x8"])
    assert result.exit_code == 2 and "'8x8': write a memory-limit workload as ROWSxPROMPT+GEN" in result.output
    names = [ml.Side("flexbatch", "", 1, 1, 1, 0, 0, "", compress=c, weight_format=f).name
             for c, f in ((False, "int8"), (True, "int4"), (True, "int8"))]
    assert names == ["flexbatch", "flexbatch-4bit", "flexbatch-int8"]


def test_a_limit_as_a_share_of_the_model_is_each_sides_baseline_plus_that_share():
    cfg = ml.MemoryLimitConfig(model_share=0.4)
    assert cfg.limit_for(baseline=300 << 20, weight_bytes=1000 << 20) == (300 << 20) + int(0.4 * (1000 << 20))
    assert ml.MemoryLimitConfig(limit_bytes=500 << 20).limit_for(300 << 20, 1000 << 20) == 500 << 20
    with pytest.raises(ValueError):
        ml.MemoryLimitConfig()


def _writable() -> bool:
    try:
        ml.check_cgroups()
        return os.geteuid() == 0
    except ml.CgroupUnavailable:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _writable(), reason="needs root and a writable cgroup v1 memory controller")
def test_each_side_runs_in_its_own_group_and_oom_is_reported(tmp_path):
    model = bm.build_checkpoint("tiny", tmp_path / "cache")
    hw = save_hardware(server_cpu(), tmp_path / "hw.json")
    side = ml.Side("flexbatch", str(model), rows=4, prompt_len=8, gen_len=4, batch=0, cpu_bytes=200 << 20,
                   offload_dir=str(tmp_path / "off"), hardware=str(hw))
    ok = ml.run_side(side, 900 << 20, timeout_s=600)
    assert ok["result"]["tokens"] == 16 and not ok["oom_killed"], ok
    assert ok["result"]["disk_read_bytes"] >= 0
    assert ok["result"]["disk_read_bytes_per_token"] == ok["result"]["disk_read_bytes"] / 16
    assert 0 < ok["peak_bytes"] <= 900 << 20
    starved = ml.run_side(side, 60 << 20, timeout_s=600)
    assert starved["result"] is None and starved["oom_killed"], starved
    assert not list(Path(ml.CGROUP_ROOT).glob(f"flexbatch-bench-{os.getpid()}-*"))


def test_a_flexbatch_side_reports_its_weight_wait_and_load_seconds(tmp_path, monkeypatch, one_thread):
    """The compute thread's wait for layers and the prefetch thread's loading come back in the side's JSON line,
    and the report's line for a flexbatch side shows them."""
    from types import SimpleNamespace

    from engine.policy import Policy
    from jobs.bench import memory_side

    model = bm.build_checkpoint("tiny", tmp_path / "cache")
    plan = SimpleNamespace(policy=Policy(gbs=2, num_gb=1, weight_cpu=0.0),
                           prediction=SimpleNamespace(total_s=1.0, bound_s=0.5))
    monkeypatch.setattr(memory_side, "flexbatch_plan", lambda side: (plan, {"cpu": None}))
    side = ml.Side("flexbatch", str(model), rows=2, prompt_len=6, gen_len=3, batch=0, cpu_bytes=1 << 30,
                   offload_dir=str(tmp_path / "off"))
    tokens, gen_s, info = memory_side.run_flexbatch(side, bm.prompt_ids(2, 6, 512))
    assert tokens == 6 and info["weight_wait_s"] > 0 and info["weight_load_s"] > 0
    note = ml.weight_times({"gen_s": gen_s, **info})
    assert note.startswith("; weights: waited ") and "s generating; roofline 0.5 s" in note
    assert ml.weight_times({"weight_wait_s": 1.04, "weight_load_s": 3.51, "gen_s": 10.0}) == \
        "; weights: waited 1.0 s, loaded 3.5 s, of 10.0 s generating"
    assert ml.weight_times({"weight_wait_s": 1.0, "weight_load_s": 3.5, "gen_s": 10.0, "roofline_s": 8.0,
                            "predicted_s": 9.0}) == ("; weights: waited 1.0 s, loaded 3.5 s, of 10.0 s generating; "
                                                     "roofline 8.0 s (0.80 of it), planner predicted 9.0 s")
    assert ml.weight_times(None) == "" and ml.weight_times({"tokens": 3, "gen_s": 1.0}) == ""


def test_a_terminated_bench_kills_its_side_and_removes_its_group(tmp_path):
    """SIGTERM to the bench while a side runs: the side's process is killed and its memory group removed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.cgroups import memory_cgroup

    os.rmdir(memory_cgroup("flexbatch-probe", 1 << 30))  # skips where no writable cgroup v1 hierarchy exists
    script = ("import sys; from jobs.bench.memory_limit import MemoryGroup\n"
              "with MemoryGroup('term-test', 1 << 30) as g:\n"
              "    print(g.path, flush=True); g.run(['sleep', '60'], 120)\n")
    bench = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    group = Path(bench.stdout.readline().strip())
    deadline = time.time() + 10
    while not (group / "cgroup.procs").read_text().strip() and time.time() < deadline:
        time.sleep(0.05)
    side = int((group / "cgroup.procs").read_text().split()[0])
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=20) == 128 + signal.SIGTERM
    assert not group.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(side, 0)


def test_a_process_left_in_the_group_is_killed_and_the_group_removed():
    """A side that joined the group but that `run` does not hold (a SIGTERM landed while it started) is killed on
    exit, so the group can be removed."""
    import os
    import subprocess

    from tests.cgroups import memory_cgroup

    os.rmdir(memory_cgroup("flexbatch-probe", 1 << 30))  # skips where no writable cgroup v1 hierarchy exists
    with ml.MemoryGroup("left-test", 1 << 30) as g:
        procs = g.path / "cgroup.procs"
        orphan = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: procs.write_text(str(os.getpid())))
        path = g.path
    assert orphan.wait(timeout=10) == -9 and not path.exists()


LLAMA_CPP_BUILD = Path(__file__).resolve().parents[3] / ".llama-cpp"


def test_llama_cpp_under_the_limit_is_an_option_of_the_compressed_runs(tmp_path, monkeypatch):
    """--llama-cpp adds a llama.cpp side for each compressed format (the GGUF type of its width); refused without a
    limit, without a compressed format, or where the build is missing, each naming the fix."""
    from jobs.bench import engine as bench_engine

    monkeypatch.setattr(bench_engine, "check_cgroups", lambda: None)
    build = tmp_path / "llama"
    t = ml.lc.LlamaCpp(build)
    for path in (t.bench, t.quantize, t.python, t.convert_script):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    cfg = bench_engine._memory_limit("6GiB", (16,), (), "bfloat16", ("uncompressed", "int4", "int8"), build)
    assert cfg.llama_cpp == str(build) and cfg.gguf_types == ("Q4_0", "Q8_0")
    assert ml.MemoryLimitConfig(1 << 30, formats=("int4",)).gguf_types == ()  # no build, no llama.cpp side
    with pytest.raises(click.UsageError, match="--memory-limit-formats int4"):
        bench_engine._memory_limit("6GiB", (16,), (), "bfloat16", ("uncompressed",), build)
    with pytest.raises(click.UsageError, match="give a limit too"):
        bench_engine._memory_limit(None, (16,), (), "bfloat16", ("int4",), build)
    with pytest.raises(click.UsageError, match="scripts/setup_llama_cpp.sh"):
        bench_engine._memory_limit("6GiB", (16,), (), "bfloat16", ("int4",), tmp_path / "nowhere")
    side = ml.Side(ml.LLAMA_CPP, str(tmp_path), 4, 8, 4, 4, 0, "", weight_format="Q4_0", llama_cpp=str(build),
                   gguf=str(tmp_path / "Q4_0.gguf"), load_mode="none")
    assert side.name == "llama.cpp Q4_0 none" and side.files() == [tmp_path / "Q4_0.gguf"]
    (tmp_path / "model.safetensors").write_text("")
    assert ml.Side("accelerate", str(tmp_path), 4, 8, 4, 4, 0, "").files() == [tmp_path / "model.safetensors"]


def test_each_compressed_run_is_a_line_against_llama_cpp_of_its_width(monkeypatch):
    """The report has, besides each flexbatch run vs Accelerate, each compressed run vs llama.cpp's GGUF of its
    width in its faster load mode (target 1.0x), with each mode's tokens/s, prefill, decode and disk read in its
    text; a failed side is no figure."""
    def side(tps, **more):
        return {"result": {"tokens_per_s": tps, **more}, "batch": 16}

    mapped = side(1.0, phase_seconds={"prefill": 200.0, "decode": 56.0}, disk_read_bytes=40.2e9)
    read = side(2.0, phase_seconds={"prefill": 100.0, "decode": 28.0}, disk_read_bytes=4.1e9)
    report = {"weight_bytes": 14 << 30, "baseline_bytes": {}, "best": {
        "flexbatch-4bit": side(4.0), "accelerate": side(0.5), "llama.cpp Q4_0 mmap": mapped,
        "llama.cpp Q4_0 none": read, "llama.cpp Q8_0 none": side(3.0, phase_seconds={"prefill": 1, "decode": 1},
                                                                 disk_read_bytes=0)}}
    monkeypatch.setattr(ml, "memory_limit_runs", lambda *a: dict(report))
    monkeypatch.setattr("planner.profiler.load_or_profile", lambda: server_cpu())
    cfg = ml.MemoryLimitConfig(6 << 30, workloads=(("w", 16, 64, 16),), formats=("int4", "int8"), llama_cpp="/x")
    lines = {ln.id: ln for ln in ml.memory_limit_lines(cfg, Path("/nowhere"))}
    q4 = lines["memlimit-w-flexbatch-4bit-vs-llama.cpp-Q4_0"]
    assert (q4.ours, q4.baseline, q4.ratio, q4.target, q4.met) == (4.0, 2.0, 2.0, 1.0, True)
    assert ("; mmap: 1.00 tok/s, prefill 200.0 s, decode 56.0 s, read 40.2 GB; none: 2.00 tok/s, prefill 100.0 s, "
            "decode 28.0 s, read 4.1 GB") in q4.what
    assert lines["memlimit-w-flexbatch-4bit"].baseline == 0.5
    q8 = lines["memlimit-w-flexbatch-int8-vs-llama.cpp-Q8_0"]  # flexbatch's int8 and llama.cpp's mapped run failed
    assert q8.ours is None and q8.baseline == 3.0 and q8.met is None and "; mmap: no result; none: 3.00" in q8.what


def test_disk_reads_of_exited_children_are_counted(tmp_path):
    """A side that runs its engine as a child (llama.cpp) has that child's disk reads counted."""
    import subprocess

    from jobs.bench import memory_side

    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(8 << 20))
    subprocess.run(["sync"], check=True)  # written back, so that its cached pages can be dropped
    ml.drop_cached([data])
    before = memory_side.disk_read_bytes()
    subprocess.run(["cat", str(data)], stdout=subprocess.DEVNULL, check=True)
    read = memory_side.disk_read_bytes() - before
    if read == 0:
        pytest.skip(f"{tmp_path} is not on a block device whose reads are counted (tmpfs)")
    assert read >= 8 << 20


@pytest.mark.slow
@pytest.mark.skipif(not (LLAMA_CPP_BUILD / "build" / "bin" / "llama-batched-bench").is_file() or not _writable(),
                    reason="needs a .llama-cpp build (scripts/setup_llama_cpp.sh), root and cgroup v1 memory groups")
def test_the_llama_cpp_side_runs_the_gguf_in_its_own_group(tmp_path):
    model = bm.build_checkpoint("tiny", tmp_path / "cache")
    gguf = ml.lc.gguf_models(ml.lc.llama_cpp_tools(LLAMA_CPP_BUILD), model, ("Q4_0",))["Q4_0"]
    side = ml.Side(ml.LLAMA_CPP, str(model), rows=3, prompt_len=8, gen_len=4, batch=3, cpu_bytes=0, offload_dir="",
                   weight_format="Q4_0", llama_cpp=str(LLAMA_CPP_BUILD), gguf=str(gguf), load_mode="none")
    out = ml.run_side(side, 900 << 20, timeout_s=300)
    assert out["side"] == "llama.cpp Q4_0 none" and not out["oom_killed"], out
    res = out["result"]
    assert res["tokens"] == 12 and res["phase_seconds"]["prefill"] > 0 and res["phase_seconds"]["decode"] > 0
    assert res["gen_s"] == pytest.approx(res["phase_seconds"]["prefill"] + res["phase_seconds"]["decode"])
    assert 0 < out["peak_bytes"] <= 900 << 20
    assert not list(Path(ml.CGROUP_ROOT).glob(f"flexbatch-bench-{os.getpid()}-*"))
