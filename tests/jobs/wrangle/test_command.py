"""`flexbatch wrangle`: option errors before any model is loaded, few-shot prompts from the bundled data, and the
job end to end with the demo model (in this process; one run on Ray with two actors, marked slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from jobs.wrangle.command import WrangleConfig, build_prompts, run_wrangle, wrangle_command
from jobs.wrangle.tasks import render
from pipeline.plan.settings import EngineSettings

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "examples" / "wrangle"
COLUMN = {"data_imputation": ["--impute-column", "country"]}


def invoke(*args):
    return CliRunner().invoke(wrangle_command, [*map(str, args)])


def test_help_names_every_option_and_the_examples():
    text = " ".join(invoke("--help").output.split())
    for option in ("--task", "--data", "--output", "--split", "--template", "--k-shot", "--prefix", "--seed",
                   "--impute-column", "--limit", "--max-new-tokens", "--model", "--dtype", "--no-ray", "--workers",
                   "--address", "--overwrite"):
        assert option in text
    assert "Examples: flexbatch wrangle --task entity_matching" in text


@pytest.mark.parametrize(("args", "fragment"), [
    (["--task", "matching", "--data", DATA / "entity_matching"], "--task 'matching' is unknown"),
    (["--task", "entity_matching", "--data", DATA / "data_imputation"], "table 'tableA' is missing"),
    (["--task", "data_imputation", "--data", DATA / "data_imputation"], "pass --impute-column NAME"),
    (["--task", "data_imputation", "--data", DATA / "data_imputation", "--impute-column", "capital"],
     "lacks the column(s) 'capital'"),
    (["--task", "entity_matching", "--data", DATA / "entity_matching", "--template", "fancy"],
     "--template 'fancy' is unknown"),
    (["--task", "entity_matching", "--data", DATA / "entity_matching", "--k-shot", "2", "--prefix", "p.txt"],
     "pass only one of them"),
    (["--task", "entity_matching", "--data", DATA / "entity_matching", "--split", "train"], "--split 'train'"),
    (["--task", "entity_matching", "--data", DATA / "entity_matching", "--k-shot", "999"], "--k-shot 999 exceeds"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, no_model_load, args, fragment):
    result = invoke(*args, "--output", tmp_path / "out", "--no-ray")
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("flexbatch: error: ")]
    assert len(errors) == 1 and fragment in errors[0], lines
    assert result.stdout == ""


def test_module_entry_point_reports_errors_like_the_cli(tmp_path):
    result = subprocess.run([sys.executable, "-m", "jobs.wrangle", "--task", "nope", "--data", str(tmp_path),
                             "--output", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("flexbatch: error: --task 'nope' is unknown")


@pytest.mark.parametrize("task", ["entity_matching", "data_imputation", "error_detection"])
def test_few_shot_prefix_is_seeded_and_holds_no_scored_row(tmp_path, demo_model_dir, task):
    def prompts(seed):
        config = WrangleConfig(task=task, data=DATA / task, output=tmp_path, model=demo_model_dir, k_shot=3,
                               seed=seed, impute_column="country" if task == "data_imputation" else None)
        return build_prompts(config)

    template, examples, full, prefix = prompts(5)
    assert prompts(5)[3] == prefix and any(prompts(seed)[3] != prefix for seed in range(6, 10))
    shots = prefix.splitlines()
    assert len(shots) == 3 and all(p.startswith(prefix) for p in full)
    target = "country" if task == "data_imputation" else None
    queries = {render(e, template, target) for e in examples}
    assert not any(line.startswith(q) for line in shots for q in queries)


def _config(tmp_path, task, use_ray=False, workers=None, address=None, **kw):
    kw.setdefault("impute_column", "country" if task == "data_imputation" else None)
    engine = EngineSettings(dtype="float32", use_ray=use_ray, workers=workers, address=address)
    return WrangleConfig(task=task, data=DATA / task, output=tmp_path / task, model=REPO / "examples" / "demo-model",
                         engine=engine, **kw)


@pytest.mark.parametrize(("task", "limit"), [("entity_matching", 8), ("data_imputation", None),
                                             ("error_detection", 8)])
def test_job_in_process_writes_predictions_and_metrics(tmp_path, task, limit):
    result = run_wrangle(_config(tmp_path, task, limit=limit))
    rows = pq.read_table(result.predictions).to_pylist()
    assert len(rows) == result.metrics["n"] == (limit or 12)
    assert [r["id"] for r in rows] == [f"test:{i}" for i in range(len(rows))]
    assert {"prompt", "completion", "prediction", "gold", "correct", "finish_reason"} <= set(rows[0])
    assert result.metrics["unparsed"] == 0  # the demo templates get answers the parser reads
    saved = json.loads(result.metrics_path.read_text())
    assert saved["task"] == task and saved["template"] == "demo" and saved["accuracy"] == result.metrics["accuracy"]
    if task == "data_imputation":
        assert result.metrics["accuracy"] >= 0.9  # facts the model knows, asked in a held-out phrasing
    if task == "entity_matching":
        assert {"ltable_id", "rtable_id"} <= set(rows[0]) and result.metrics["accuracy"] > 0.5


def test_rerun_resumes_and_other_prompts_need_overwrite(tmp_path, demo_model_dir):
    args = ["--task", "entity_matching", "--data", DATA / "entity_matching", "--output", tmp_path, "--no-ray",
            "--limit", "4", "--dtype", "float32"]
    first = invoke(*args)
    assert first.exit_code == 0, (first.output, first.exception)
    assert "entity_matching on test (template demo): n=4" in first.stdout and "F1" in first.stdout
    stamp = (tmp_path / "prompts.parquet").stat().st_mtime_ns
    again = invoke(*args)
    assert again.exit_code == 0 and again.stdout == first.stdout
    assert (tmp_path / "prompts.parquet").stat().st_mtime_ns == stamp
    success = json.loads((tmp_path / "completions" / "_SUCCESS").read_text())
    assert success["new_shards"] == 0 and success["skipped_shards"] == success["shards"]
    other = invoke(*args, "--k-shot", "2")
    assert other.exit_code == 2 and "holds the completions of other prompts" in other.stderr
    assert (tmp_path / "prompts.parquet").stat().st_mtime_ns == stamp  # the first job can still resume
    assert invoke(*args, "--k-shot", "2", "--overwrite").exit_code == 0
    prompt = pq.read_table(tmp_path / "predictions.parquet").column("prompt")[0].as_py()
    assert len(prompt.splitlines()) == 3  # two shots, then the row


@pytest.mark.slow
def test_job_on_ray_with_two_actors(tmp_path, ray_address):
    result = run_wrangle(_config(tmp_path, "entity_matching", limit=8, use_ray=True, workers=2, address=ray_address))
    assert len(result.summary.workers) == 2 and result.summary.ok
    rows = pq.read_table(result.predictions).to_pylist()
    assert [r["id"] for r in rows] == [f"test:{i}" for i in range(8)]
    in_process = run_wrangle(_config(tmp_path / "local", "entity_matching", limit=8))
    assert [r["completion"] for r in rows] == [r["completion"] for r in pq.read_table(in_process.predictions)
                                               .to_pylist()]
    assert result.metrics == in_process.metrics
