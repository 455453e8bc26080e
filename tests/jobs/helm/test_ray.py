"""The job end to end on Ray (the suite's shared cluster): the bundled addition scenario through two engine actors,
which the suite's next run (compare) takes over with their models loaded."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.helm.files import DEMO_ADAPTER, read_json, write_spec

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_bundled_scenario_through_two_ray_actors(tmp_path, shared_ray):
    spec = write_spec(tmp_path / "spec.yaml", [{"scenario": "addition", "adapter": DEMO_ADAPTER,
                                                "metrics": ["exact_match", "quasi_exact_match"]},
                                               {"scenario": "compare", "adapter": DEMO_ADAPTER}])
    env = {**shared_ray.env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "jobs.helm", "--spec", str(spec), "--suite", "ray", "--output", str(tmp_path / "out"),
         "--address", shared_ray.address, "--workers", "2", "--max-eval-instances", "8"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "out" / "runs" / "ray" / "addition:model=demo-model"
    info = read_json(run / "flexbatch.json")
    assert len(info["workers"]) == 2 and len({w["pid"] for w in info["workers"]}) == 2
    assert info["plan"].startswith("2 engines: ") and info["rows"] == 8
    states = read_json(run / "scenario_state.json")["request_states"]
    assert len(states) == 8 and all(rs["result"]["success"] for rs in states)
    em = next(s for s in read_json(run / "stats.json") if s["name"]["name"] == "exact_match")
    assert em["mean"] >= 0.75  # the demo model adds two-digit numbers (99 % held out); chance is 1/179
    summary = json.loads((tmp_path / "out" / "runs" / "ray" / "flexbatch_summary.json").read_text())
    assert summary["runs"][0]["status"] == "done" and "| addition:model=demo-model | done |" in done.stdout
    assert summary["runs"][1]["status"] == "done"
    then = read_json(tmp_path / "out" / "runs" / "ray" / "compare:model=demo-model" / "flexbatch.json")["workers"]
    assert [w["pid"] for w in then] == [w["pid"] for w in info["workers"]]  # the same two actors
    assert [w["engine_reused"] for w in info["workers"] + then] == [False, False, True, True]
