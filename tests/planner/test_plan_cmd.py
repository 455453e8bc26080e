"""`flexbatch plan`, `flexbatch profile`, and `flexbatch run` planning by default."""

import json

import pytest
from click.testing import CliRunner

import engine.memory.room
import pipeline.plan.planning
from engine.memory.room import MemoryRoom
from jobs import cli
from planner import profiler
from planner.hardware import load_hardware, save_hardware
from tests.pipeline.parquet_files import write_parquet
from tests.planner.specs import cpu_machine, server_cpu


@pytest.fixture
def hw_file(tmp_path):
    return save_hardware(server_cpu(), tmp_path / "hw.json")


def plan(*args):
    return CliRunner().invoke(cli.main, ["plan", *map(str, args)])


def test_plan_explains_in_text_and_draws_a_png(tmp_path, tiny_llama_dir, hw_file):
    png = tmp_path / "plan.png"
    result = plan("--model", tiny_llama_dir, "--prompt-len", 16, "--gen-len", 4, "--num-prompts", 8,
                  "--hardware", hw_file, "--plot", png)
    assert result.exit_code == 0, result.output
    for section in ("policy: gbs", "predicted for 8 prompts", "top alternatives", "binding constraints",
                    "where tensors live", "per-layer timeline", "prefill on cpu"):
        assert section in result.output
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plan_keeps_pins_and_reads_the_workload_from_parquet(tmp_path, tiny_llama_dir, hw_file):
    inp = write_parquet(tmp_path / "in.parquet", prompt=["hello there"] * 5)
    result = plan("--model", tiny_llama_dir, "--input", inp, "--gen-len", 3, "--hardware", hw_file,
                  "--gbs", 2, "--percent", 0, 50, 0, 100, 0, 100, "--json")
    assert result.exit_code == 0, result.output
    policy = json.loads(result.output)
    assert policy["gbs"] == 2 and policy["weight_cpu"] == 0.5


def test_plan_that_cannot_fit_names_the_tier(tiny_llama_dir, hw_file):
    result = plan("--model", tiny_llama_dir, "--hardware", hw_file, "--cpu-mem", "1KiB")
    assert result.exit_code == 2
    assert "cpu tier is short by" in result.output


def test_profile_writes_the_spec(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(profiler, "profile_this_machine", lambda **kw: asked.append(kw) or cpu_machine())
    out = tmp_path / "hw.json"
    result = CliRunner().invoke(cli.main, ["profile", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert load_hardware(out) == cpu_machine()
    assert asked == [{"refresh_kernels": True}]  # an explicit profile measures the kernels' crossovers again


def test_run_plans_by_default_and_reports_predicted_against_measured(tmp_path, tiny_llama_dir, hw_file):
    inp = write_parquet(tmp_path / "in.parquet", prompt=["one two", "three four five", "six"])
    args = ["run", "--no-ray", "--model", tiny_llama_dir, "--input", inp, "--max-new-tokens", 3, "--hardware",
            hw_file]
    result = CliRunner().invoke(cli.main, [*map(str, args), "--output", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "planner: predicted" in result.output
    job = json.loads((tmp_path / "a" / "_job.json").read_text())
    assert job["run"]["workers"][0]["predicted"]["seconds"] > 0
    success = json.loads((tmp_path / "a" / "_SUCCESS").read_text())
    assert success["predicted_seconds"] == job["run"]["workers"][0]["predicted"]["seconds"]
    assert success["measured_seconds"] > 0
    result = CliRunner().invoke(cli.main, [*map(str, args), "--output", str(tmp_path / "b"), "--no-plan", "--gbs", "2"])
    assert result.exit_code == 0, result.output
    assert "planner: predicted" not in result.output


def test_plan_reads_the_workload_from_an_openai_batch_file(demo_model_dir, hw_file):
    from tests.jobs.test_cli import REPO

    result = plan("--model", demo_model_dir, "--input", REPO / "examples" / "requests.jsonl", "--gen-len", 3,
                  "--hardware", hw_file)
    assert result.exit_code == 0, result.output
    assert "predicted for 9 prompts" in result.output


def test_plan_and_run_choose_the_same_policy_for_the_same_input(tmp_path, tiny_llama_dir, hw_file, monkeypatch):
    """One decision (pipeline.plan.planning.choose_policy) with one CPU budget default: here a small memory room
    binds, so a command that defaulted the budget otherwise (plan once took the spec's memory) would differ."""
    inp = write_parquet(tmp_path / "in.parquet", prompt=[f"prompt {i} " + "word " * (i % 7) for i in range(64)])
    common = ["--model", tiny_llama_dir, "--input", inp, "--hardware", hw_file, "--dtype", "float32"]
    plans = {}
    for room_bytes in (1e12, 1e6):
        room = MemoryRoom(room_bytes / pipeline.plan.planning.CPU_BUDGET_SHARE, None, None, None, None)
        monkeypatch.setattr(engine.memory.room, "memory_room", lambda room=room: room)
        result = plan(*common, "--gen-len", 3, "--json")
        assert result.exit_code == 0, result.output
        plans[room_bytes] = json.loads(result.output)
    assert plans[1e6] != plans[1e12]  # the default budget binds
    ran = CliRunner().invoke(cli.main, ["run", "--no-ray", *map(str, common), "--max-new-tokens", "3",
                                        "--output", str(tmp_path / "out")])
    assert ran.exit_code == 0, ran.output
    job = json.loads((tmp_path / "out" / "_job.json").read_text())
    assert job["run"]["workers"][0]["policy"] == plans[1e6]


def test_a_run_without_planning_keeps_to_the_same_cpu_budget(tmp_path, tiny_llama_dir, monkeypatch):
    """--no-plan once loaded the engine with no CPU budget (or a --cpu-mem above the room, as given): now its
    budget is plan_budgets' too, so a block that does not fit the room is refused instead of being killed."""
    inp = write_parquet(tmp_path / "in.parquet", prompt=["one two", "three four five", "six"])
    common = ["run", "--no-ray", "--no-plan", "--model", str(tiny_llama_dir), "--input", str(inp),
              "--max-new-tokens", "3", "--dtype", "float32"]
    room = MemoryRoom(10 * 2**30, None, None, None, None)
    monkeypatch.setattr(engine.memory.room, "memory_room", lambda: room)
    ran = CliRunner().invoke(cli.main, [*common, "--output", str(tmp_path / "a"), "--cpu-mem", "100GiB"])
    assert ran.exit_code == 0, ran.output
    worker = json.loads((tmp_path / "a" / "_job.json").read_text())["run"]["workers"][0]
    assert worker["cpu_budget"] == pytest.approx(pipeline.plan.planning.CPU_BUDGET_SHARE * 10 * 2**30)
    tiny = MemoryRoom(4096, None, None, None, None)  # far less than the weights
    monkeypatch.setattr(engine.memory.room, "memory_room", lambda: tiny)
    refused = CliRunner().invoke(cli.main, [*common, "--output", str(tmp_path / "b")])
    assert refused.exit_code == 2 and "on the cpu tier" in refused.output, refused.output


@pytest.mark.parametrize(("option", "refill"), [("on", True), ("off", False)])
def test_refill_option_pins_it(tiny_llama_dir, hw_file, option, refill):
    """--refill on/off is a pin the planner keeps (auto, the default, leaves it to the planner)."""
    result = plan("--model", tiny_llama_dir, "--prompt-len", 16, "--gen-len", 64, "--num-prompts", 256, "--gbs", 8,
                  "--num-gb", 1, "--hardware", hw_file, "--refill", option, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["refill"] is refill
