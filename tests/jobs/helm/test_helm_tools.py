"""HELM's own tools on flexbatch's output: `helm-summarize` (crfm-helm, installed by `make venv`) builds its
group tables from a `flexbatch helm` suite of the bundled scenarios and of a scenario file, with a run whose
requests failed among them."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.helm.files import DEMO_ADAPTER, invoke, read_json, write_jsonl, write_spec

pytestmark = pytest.mark.slow

HELM_SUMMARIZE = Path(sys.executable).with_name("helm-summarize")


@pytest.fixture(scope="module")
def summarized(tmp_path_factory):
    """A suite of two bundled scenarios, a scenario file, and a run whose every request fails (max_tokens past
    the demo model's context), summarized by helm-summarize with the suite's schema."""
    if not HELM_SUMMARIZE.is_file():
        pytest.fail(f"{HELM_SUMMARIZE} is missing: `make venv` installs crfm-helm")
    tmp = tmp_path_factory.mktemp("helm-tools")
    rows = [{"id": f"t{i}", "input": f"What is {i} plus 1?", "references": [str(i + 1)], "split": "train"}
            for i in range(10, 14)]
    rows += [{"id": f"e{i}", "input": f"What is {i} plus 2?", "references": [str(i + 2)], "split": "test"}
             for i in range(20, 23)]
    spec = write_spec(tmp / "spec.yaml", [
        {"scenario": "addition"}, {"scenario": "facts"},
        {"scenario": str(write_jsonl(tmp / "sums.jsonl", rows)), "metrics": ["quasi_exact_match"]},
        {"scenario": "compare", "name": "compare-failed", "adapter": {"max_tokens": 600}},
    ], defaults={"adapter": DEMO_ADAPTER, "metrics": ["exact_match", "quasi_exact_match"]})
    result = invoke("--spec", spec, "--suite", "s", "--output", tmp / "out", "--no-ray", "--max-eval-instances", 3)
    assert result.exit_code == 0, (result.output, result.exception)
    suite_dir = tmp / "out" / "runs" / "s"
    schema = suite_dir / "schema_flexbatch.yaml"
    assert f"--schema-path {schema}" in result.output
    done = subprocess.run([str(HELM_SUMMARIZE), "--suite", "s", "-o", str(tmp / "out"), "--schema-path", str(schema)],
                          capture_output=True, text=True, cwd=tmp, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return suite_dir, done


def _main_table_cells(suite_dir: Path, group: str) -> dict[str, float]:
    """The group's own table of helm-summarize: each column header -> the demo model's value."""
    [table] = [t for t in read_json(suite_dir / "groups" / f"{group}.json") if t["title"].startswith("name: ")] or \
        [read_json(suite_dir / "groups" / f"{group}.json")[0]]
    [row] = table["rows"]
    return {h["value"]: c.get("value") for h, c in zip(table["header"], row)}


def _ours(run_dir: Path, name: str) -> float:
    return next(s["mean"] for s in read_json(run_dir / "stats.json")
                if s["name"] == {"name": name, "split": "test"})


@pytest.mark.parametrize("run, group, metric, header", [
    ("addition:model=demo-model", "addition", "exact_match", "EM"),
    ("facts:model=demo-model", "facts", "exact_match", "EM"),
    ("sums:model=demo-model", "sums", "quasi_exact_match", "EM"),
    ("compare-failed", "compare", "exact_match", "EM"),
])
def test_every_run_is_in_a_group_table_with_our_score(summarized, run, group, metric, header):
    suite_dir, _ = summarized
    cells = _main_table_cells(suite_dir, group)
    assert cells["Model"] == "demo-model"
    assert cells[header] == pytest.approx(_ours(suite_dir / run, metric))
    assert cells["# eval"] == 3


def test_the_failed_run_follows_helms_non_fatal_convention(summarized):
    suite_dir, _ = summarized
    states = read_json(suite_dir / "compare-failed" / "scenario_state.json")["request_states"]
    for rs in states:
        result = rs["result"]
        assert result["success"] is False and "context of 512" in result["error"]
        assert result["error_flags"] == {"is_retriable": False, "is_fatal": False}
        assert result["completions"] == [{"text": "", "logprob": 0.0, "tokens": []}]
    assert _ours(suite_dir / "compare-failed", "exact_match") == 0
    assert (suite_dir / "runs.json").is_file() and (suite_dir / "flexbatch_summary.json").is_file()


def test_the_summary_lists_every_run_and_helms_efficiency_stats(summarized):
    suite_dir, _ = summarized
    runs = {r["run_spec"]["name"]: r for r in read_json(suite_dir / "runs.json")}
    assert set(runs) == {"addition:model=demo-model", "facts:model=demo-model", "sums:model=demo-model",
                         "compare-failed"}
    stats = {s["name"]["name"]: s for s in read_json(suite_dir / "addition:model=demo-model" / "stats.json")
             if s["name"].get("split") == "test"}
    for name in ("inference_runtime", "batch_size", "inference_denoised_runtime", "num_completion_tokens",
                 "logprob", "num_perplexity_tokens", "num_bytes", "perplexity", "bits_per_byte",
                 "logprob_per_byte", "finish_reason_unknown", "num_references", "num_train_trials", "max_prob"):
        assert name in stats, name
    assert stats["batch_size"]["mean"] == 3 and stats["inference_runtime"]["mean"] > 0
    state = read_json(suite_dir / "addition:model=demo-model" / "scenario_state.json")["request_states"][0]
    completion = state["result"]["completions"][0]
    assert "".join(t["text"] for t in completion["tokens"]).startswith(completion["text"])
    assert completion["logprob"] == pytest.approx(sum(t["logprob"] for t in completion["tokens"]))
    assert state["result"]["batch_size"] == 3 and isinstance(state["result"]["request_datetime"], int)

