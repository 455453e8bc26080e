"""The job in this process (--no-ray) on the demo model: HELM's run layout and field names, the summary, several
outputs per request, --skip-completed-runs, resume, and compression passed to the pipeline."""

import pyarrow.parquet as pq
import pytest

from engine.engine import Engine
from jobs.helm import execute as helm_execute
from pipeline.errors import ConfigError
from tests.jobs.helm.files import DEMO_ADAPTER, invoke, read_json, write_spec

RUN = "addition:model=demo-model"
SAMPLED = "compare:model=demo-model"


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """One suite of two runs: greedy addition, and compare sampled three times per question."""
    tmp = tmp_path_factory.mktemp("helm")
    spec = write_spec(tmp / "spec.yaml", [
        {"scenario": "addition"},
        {"scenario": "compare", "adapter": {"num_outputs": 3, "temperature": 1.0}, "metrics": ["exact_match"]},
    ], defaults={"adapter": DEMO_ADAPTER, "metrics": ["exact_match", "quasi_exact_match", "f1_score"]})
    args = ("--spec", spec, "--suite", "s1", "--output", tmp / "out", "--no-ray", "--max-eval-instances", 4)
    result = invoke(*args)
    assert result.exit_code == 0, (result.output, result.exception)
    return tmp / "out" / "runs" / "s1", result, args


def test_run_folders_hold_helms_files_with_helms_fields(suite):
    suite_dir, _, _ = suite
    run = suite_dir / RUN
    for name in ("run_spec.json", "scenario.json", "scenario_state.json", "stats.json", "per_instance_stats.json",
                 "flexbatch.json", "requests.parquet"):
        assert (run / name).is_file(), name
    run_spec = read_json(run / "run_spec.json")
    assert set(run_spec) == {"name", "scenario_spec", "adapter_spec", "metric_specs", "groups"}
    assert run_spec["name"] == RUN and run_spec["scenario_spec"]["args"] == {"name": "addition"}
    assert run_spec["metric_specs"][0]["args"]["names"] == ["exact_match", "quasi_exact_match", "f1_score"]
    assert run_spec["adapter_spec"]["max_eval_instances"] == 4 and run_spec["adapter_spec"]["model"] == "demo-model"
    assert set(read_json(run / "scenario.json")) == {"name", "description", "tags", "definition_path"}

    state = read_json(run / "scenario_state.json")
    assert set(state) == {"adapter_spec", "request_states"} and len(state["request_states"]) == 4
    rs = state["request_states"][0]
    assert {"instance", "train_trial_index", "request", "result", "num_train_instances", "prompt_truncated"} <= set(rs)
    assert set(rs["instance"]) == {"input", "references", "split", "id"} and rs["instance"]["split"] == "test"
    assert set(rs["instance"]["references"][0]) == {"output", "tags"}
    assert {"prompt", "temperature", "max_tokens", "stop_sequences", "num_completions"} <= set(rs["request"])
    assert rs["request"]["prompt"].count("\n") == 3 and rs["num_train_instances"] == 3
    result = rs["result"]
    assert result["success"] is True and len(result["completions"]) == 1
    completion = result["completions"][0]
    assert set(completion) == {"text", "logprob", "tokens", "finish_reason"} and completion["logprob"] <= 0
    assert completion["text"].strip() == rs["instance"]["references"][0]["output"]["text"]  # the model can add

    per_instance = read_json(run / "per_instance_stats.json")
    assert len(per_instance) == 4 and set(per_instance[0]) == {"instance_id", "train_trial_index", "stats"}
    em = next(s for s in per_instance[0]["stats"] if s["name"]["name"] == "exact_match")
    assert em["name"] == {"name": "exact_match", "split": "test"} and em["count"] == 1
    assert {"count", "sum", "sum_squared", "min", "max", "mean", "variance", "stddev"} <= set(em)
    stats = {s["name"]["name"]: s for s in read_json(run / "stats.json")}
    assert {"exact_match", "quasi_exact_match", "f1_score", "num_prompt_tokens", "num_output_tokens",
            "num_instances"} <= set(stats)
    assert stats["exact_match"]["mean"] >= 0.75 and stats["num_instances"]["sum"] == 4


def test_summary_is_printed_and_saved(suite):
    suite_dir, result, _ = suite
    assert f"| {RUN} | done | " in result.output and "(4)" in result.output and "chance" in result.output
    assert (suite_dir / "flexbatch_summary.md").read_text().endswith(result.output.split("summary: ")[0])
    summary = read_json(suite_dir / "flexbatch_summary.json")
    assert summary["suite"] == "s1" and [r["name"] for r in summary["runs"]] == [RUN, SAMPLED]
    run = summary["runs"][0]
    assert run["status"] == "done" and run["instances"] == 4 and run["tokens_per_s"] > 0
    assert run["plan"].startswith("1 engine: cpu/cpu, block") and abs(run["chance"] - 1 / 179) < 1e-9
    assert run["metrics"][0] == {"name": "exact_match", "mean": run["metrics"][0]["mean"], "count": 4}


def test_several_outputs_are_rows_with_distinct_seeds(suite):
    suite_dir, _, _ = suite
    run = suite_dir / SAMPLED
    rows = pq.read_table(run / "requests.parquet").to_pylist()
    assert len(rows) == 12 and len({r["seed"] for r in rows}) == 12
    assert [r["id"] for r in rows[:3]] == ["0.0", "0.1", "0.2"]
    state = read_json(run / "scenario_state.json")
    assert all(len(rs["result"]["completions"]) == 3 for rs in state["request_states"])
    stats = {s["name"]["name"] for s in read_json(run / "stats.json")}
    assert {"exact_match", "exact_match@3"} <= stats


def test_the_runs_of_a_suite_share_one_loaded_engine(suite):
    suite_dir, _, _ = suite
    first, second = (read_json(suite_dir / run / "flexbatch.json")["workers"][0] for run in (RUN, SAMPLED))
    assert first["engine_reused"] is False and second["engine_reused"] is True  # same model, settings, placement


def test_skip_completed_runs_loads_no_model(suite, monkeypatch):
    suite_dir, _, args = suite

    def refuse(*a, **k):
        raise AssertionError("a completed run was run again")

    monkeypatch.setattr(Engine, "load", refuse)
    result = invoke(*args, "--skip-completed-runs")
    assert result.exit_code == 0, (result.output, result.exception)
    assert f"| {RUN} | skipped | " in result.output
    assert read_json(suite_dir / "flexbatch_summary.json")["runs"][0]["tokens_per_s"] > 0


def test_rerun_resumes_the_committed_pipeline_job(suite):
    suite_dir, _, args = suite
    part = suite_dir / RUN / "completions" / "requests.parquet"
    before = part.stat().st_mtime_ns
    result = invoke(*args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert part.stat().st_mtime_ns == before  # every shard was committed: nothing generated again
    run = read_json(suite_dir / "flexbatch_summary.json")["runs"][0]
    assert run["status"] == "done" and run["plan"] and run["tokens_per_s"] > 0


def test_compression_reaches_the_pipeline_policy(tmp_path, monkeypatch):
    seen = []

    def capture(config, pool=None):
        seen.append(config)
        raise ConfigError("stop here")

    monkeypatch.setattr(helm_execute, "run_job", capture)
    spec = write_spec(tmp_path / "s.yaml", [{"scenario": "addition", "adapter": DEMO_ADAPTER}])
    result = invoke("--spec", spec, "--suite", "c", "--output", tmp_path / "out", "--no-ray", "--compress-weight",
                    "--compress-cache", "--dtype", "float32", "--max-eval-instances", 2)
    assert result.exit_code == 2 and "stop here" in result.stderr
    [config] = seen
    assert config.policy.compress_weight and config.policy.compress_cache and config.dtype == "float32"
    assert config.use_ray is False and config.params.logprobs
    assert config.output.parent.name == "addition:model=demo-model,compress=weight+cache"


def test_module_entry_point_help():
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-m", "jobs.helm", "--help"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[3], timeout=60)
    assert done.returncode == 0 and "python -m jobs.helm" in done.stdout
    for option in ("--spec", "--suite", "--output", "--max-eval-instances", "--model", "--skip-completed-runs",
                   "--scenario-state", "--compress-weight", "--compress-cache", "--dtype", "--no-ray", "--address",
                   "--workers"):
        assert option in done.stdout
