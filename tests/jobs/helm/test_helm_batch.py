"""The three-step workflow with the real crfm-helm on HELM's offline `simple1` scenario and the demo model:
`helm-run --dry-run` writes the requests, `flexbatch helm-batch` computes them, `helm-run` scores the stored
results with HELM's own metrics; these equal a direct `flexbatch helm --scenario-state` of the same requests,
and the run's results are the store's (the client ran no model)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobs.helm.batch_command import helm_batch_command
from jobs.helm.store import read_results, request_key
from tests.jobs.helm.files import invoke, read_json

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
ENTRY = ("simple1:model=flexbatch/demo-model,model_deployment=flexbatch/demo-model,num_output_tokens=6,"
         "num_train_trials=1")
RUN = "simple1:model=flexbatch_demo-model,model_deployment=flexbatch_demo-model,num_output_tokens=6,num_train_trials=1"
# differ by design: each run times its own batch; HELM's tokenizer counts the prompt without the BOS the engine adds
NOT_COMPARED = ("inference_runtime", "inference_denoised_runtime", "num_prompt_tokens")


def _helm_run(cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "helm-run"), "--run-entries", ENTRY, "--suite", "S", "--max-eval-instances", "2",
                           *extra], capture_output=True, text=True, cwd=cwd, timeout=300)


def _batch(cwd: Path):
    return CliRunner().invoke(helm_batch_command, ["--suite", "S", "--no-ray", "--helm-output",
                                                   str(cwd / "benchmark_output"), "--local-path", str(cwd / "prod_env")])


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("workflow")
    first = _batch(cwd)  # no suite yet: registers the deployment for the dry run
    assert first.exit_code == 0 and "no HELM runs" in first.output, (first.output, first.exception)
    dry = _helm_run(cwd, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    batch = _batch(cwd)
    assert batch.exit_code == 0, (batch.output, batch.exception)
    again = _batch(cwd)
    assert again.exit_code == 0 and "0 computed now" in again.output, again.output
    real = _helm_run(cwd)
    assert real.returncode == 0, real.stderr[-3000:]
    run_dir = cwd / "benchmark_output" / "runs" / "S" / RUN
    direct = invoke("--scenario-state", run_dir / "scenario_state.json", "--suite", "D", "--output", cwd / "direct",
                    "--no-ray")
    assert direct.exit_code == 0, (direct.output, direct.exception)
    [direct_dir] = (cwd / "direct" / "runs" / "D").glob("simple1*")
    return cwd, run_dir, direct_dir, batch


def test_helms_metrics_on_stored_results_equal_a_direct_flexbatch_run(workflow):
    _, run_dir, direct_dir, _ = workflow
    ours = {json.dumps(s["name"], sort_keys=True): s for s in read_json(direct_dir / "stats.json")}
    compared = 0
    for stat in read_json(run_dir / "stats.json"):
        if "perturbation" in stat["name"] or stat["name"]["name"] in NOT_COMPARED:
            continue  # HELM's worst-case copies (flexbatch writes none)
        mine = ours[json.dumps(stat["name"], sort_keys=True)]
        assert mine["count"] == stat["count"] and mine["sum"] == pytest.approx(stat["sum"], rel=1e-9), stat["name"]
        compared += 1
    assert compared >= 18  # logprob, perplexity, bytes, tokens, finish reasons, max_prob, batch size, ...


def test_the_run_answered_from_the_store(workflow):
    cwd, run_dir, _, batch = workflow
    stored = read_results(cwd / "benchmark_output" / "flexbatch_store")
    states = read_json(run_dir / "scenario_state.json")["request_states"]
    assert f"{len(states)} distinct requests, {len(states)} computed now" in batch.output
    for rs in states:
        result = stored[request_key(rs["request"])]
        assert rs["request"]["model_deployment"] == "flexbatch/demo-model"
        assert rs["result"]["completions"] == result["completions"]  # tokens and log-probabilities included
        assert rs["result"]["request_datetime"] == result["request_datetime"]  # the batch's, not a new one
        assert rs["result"]["batch_size"] == 3 * len(states)  # one shard of every request's 3 output rows


def test_a_request_the_store_lacks_fails_the_run_naming_it(workflow):
    cwd, _, _, _ = workflow
    other = ENTRY.replace("num_output_tokens=6", "num_output_tokens=7")  # other max_tokens: other requests
    more = subprocess.run([str(BIN / "helm-run"), "--run-entries", other, "--suite", "S2", "--max-eval-instances", "2"],
                          capture_output=True, text=True, cwd=cwd, timeout=300)
    assert more.returncode != 0
    assert "has no result for the request" in more.stdout + more.stderr and "flexbatch helm-batch" in more.stdout + \
        more.stderr
