"""`flexbatch wrangle --data-dir`: the paper's flags on the command line, --dry-run's prompt file, a run with the
demo model (in this process) scored the paper's way, and --all as one job with one summary table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from jobs.helm.output import is_run_completed, read_run_summary
from jobs.helm.state import read_scenario_state
from jobs.wrangle.command import wrangle_command
from jobs.wrangle.paper_job import PaperConfig, build_runs
from jobs.wrangle.paper_metrics import compute_metrics

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "examples" / "fm_datasets"
BEER = ROOT / "entity_matching/structured/Beer"


def invoke(*args):
    return CliRunner().invoke(wrangle_command, [*map(str, args)])


def test_dry_run_writes_the_prompts_and_runs_nothing(tmp_path, no_model_load):
    result = invoke("--data-dir", BEER, "--k", "3", "--class-balanced", "--nan-tok", "", "--do-test",
                    "--num-trials", "2", "--dry-run", "--output", tmp_path)
    assert result.exit_code == 0, (result.output, result.exception)
    table = pq.read_table(tmp_path / "prompts.parquet")
    assert table.column_names == ["id", "prompt"]
    run = build_runs(PaperConfig(data_dir=BEER, output=tmp_path, k=3, class_balanced=True, nan_tok="",
                                 do_test=True, num_trials=2))[0]
    assert table.column("id").to_pylist() == [f"Beer/{t}/{i}" for t in range(2) for i in range(4)]
    assert table.column("prompt").to_pylist() == run.prompts
    assert "8 prompts of 1 datasets" in result.stdout
    assert not (tmp_path / "completions").exists()


@pytest.mark.parametrize(("args", "fragment"), [
    (["--data-dir", BEER, "--task", "entity_matching"], "--task belong to bundled-table mode"),
    (["--task", "entity_matching", "--data", BEER, "--k", "2"], "--k need --data-dir"),
    (["--data-dir", ROOT], "is not one of the paper's datasets"),
    (["--data-dir", BEER, "--sample-method", "validation_clusters"], "validation_clusters needs"),
    ([], "pass --task and --data (bundled tables) or --data-dir"),
])
def test_mode_errors_are_one_line(tmp_path, no_model_load, args, fragment):
    result = invoke(*args, "--output", tmp_path / "out", "--no-ray")
    assert result.exit_code == 2, (result.output, result.exception)
    errors = [line for line in result.stderr.splitlines() if line.startswith("flexbatch: error: ")]
    assert len(errors) == 1 and fragment in errors[0], result.stderr


def test_all_datasets_one_job_scored_the_papers_way_and_resumable(tmp_path, demo_model_dir):
    args = ["--data-dir", ROOT, "--all", "--k", "1", "--num-trials", "2", "--num-run", "2", "--do-test", "--no-ray",
            "--dtype", "float32", "--output", tmp_path]
    first = invoke(*args)
    assert first.exit_code == 0, (first.output, first.exception)
    names = ["Beer", "DBLP-GoogleScholar", "Restaurant", "Hospital", "Adult", "Synthea"]
    summary = (tmp_path / "summary.tsv").read_text().splitlines()
    assert summary[0] == "dataset\ttask\tn\tmetric\tmean\tstd\ttrials"
    assert [line.split("\t")[0] for line in summary[1:]] == names and summary[0] in first.stdout
    assert summary[3].split("\t")[3] == "acc" and all(line.endswith("\t2") for line in summary[1:])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    preds = pq.read_table(tmp_path / "predictions.parquet").to_pylist()
    assert len(preds) == 6 * 2 * 2 == pq.read_table(tmp_path / "prompts.parquet").num_rows
    for name in names:
        m = metrics[name]
        rows = [r for r in preds if r["dataset"] == name]
        for t in range(2):
            trial = [r for r in rows if r["id"].startswith(f"{name}/{t}/")]
            want = compute_metrics([r["completion"] or "" for r in trial], [r["gold"] for r in trial], m["task"])
            assert [m[k][t] for k in ("prec", "rec", "f1", "acc")] == [want[k] for k in ("prec", "rec", "f1", "acc")]
        assert m["f1_avg"] == pytest.approx(sum(m["f1"]) / 2) and m["n"] == 2
    _check_helm_runs(tmp_path / "helm" / "runs" / "wrangle", names, preds)
    success = json.loads((tmp_path / "completions" / "_SUCCESS").read_text())
    again = invoke(*args)
    assert again.exit_code == 0 and again.stdout == first.stdout
    assert json.loads((tmp_path / "completions" / "_SUCCESS").read_text())["new_shards"] == 0 < success["shards"]


def _check_helm_runs(suite: Path, names: list[str], preds: list[dict]) -> None:
    """One HELM run folder per dataset, read back by the HELM job's own readers; exact_match is HELM's
    (stripped completion equal to the gold answer) over every trial's rows."""
    groups = {"Restaurant": "entity_data_imputation", "Hospital": "error_detection_spelling",
              "Adult": "error_detection", "Synthea": "schema_matching"}
    for name in names:
        run = suite / f"{groups.get(name, 'entity_matching')}:dataset={name},model=demo-model"
        assert is_run_completed(run)
        state = read_scenario_state(run / "scenario_state.json")
        rows = [r for r in preds if r["dataset"] == name]
        assert [rs["request"]["prompt"] for rs in state["request_states"]] == [r["prompt"] for r in rows]
        assert [rs["train_trial_index"] for rs in state["request_states"]] == [0, 0, 1, 1]
        summary = read_run_summary(run)
        exact = next(m for m in summary.metrics if m.name == "exact_match")
        want = sum((r["completion"] or "").strip() == r["gold"] for r in rows) / len(rows)
        assert exact.count == 4 and exact.mean == pytest.approx(want)
    assert "entity_matching:dataset=Beer,model=demo-model" in (suite / "flexbatch_summary.md").read_text()
    _check_helm_summarize(suite)


def _check_helm_summarize(suite: Path) -> None:
    """crfm-helm's helm-summarize (installed by `make venv`) puts each dataset in its group's table with our
    exact_match."""
    summarize = Path(sys.executable).with_name("helm-summarize")
    assert summarize.is_file(), f"{summarize} is missing: `make venv` installs crfm-helm"
    done = subprocess.run([str(summarize), "--suite", "wrangle", "-o", str(suite.parent.parent), "--schema-path",
                           str(suite / "schema_flexbatch.yaml")], capture_output=True, text=True, cwd=suite,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    tables = json.loads((suite / "groups" / "entity_matching.json").read_text())
    [beer] = [t for t in tables if t["title"] == "dataset: Beer"]
    cells = {h["value"]: c.get("value") for h, c in zip(beer["header"], beer["rows"][0])}
    ours = json.loads((suite / "entity_matching:dataset=Beer,model=demo-model" / "stats.json").read_text())
    want = next(s["mean"] for s in ours if s["name"] == {"name": "exact_match", "split": "test"})
    assert cells["Model"] == "demo-model" and cells["EM"] == pytest.approx(want) and cells["# eval"] == 2
