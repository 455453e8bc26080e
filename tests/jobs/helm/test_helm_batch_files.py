"""`flexbatch helm-batch` and the user's files: a corrupt scenario_state.json or HELM configuration file is one line
naming the file and the fix (exit 2), the user's model_deployments.yaml keeps its comments and quoting when our
entry is added or replaced, and a suite name that is a path is refused as `flexbatch helm` refuses it."""

import json

import pytest
import yaml
from click.testing import CliRunner

from jobs.helm.batch_command import helm_batch_command
from jobs.helm.deployment import CLIENT
from tests.jobs.helm.files import assert_user_error

USERS_DEPLOYMENTS = """\
# my deployments (kept as written)
model_deployments:
  - name: "openai/gpt2"   # quoted, with a comment
    model_name: 'openai/gpt2'
    tokenizer_name: huggingface/gpt2
    max_sequence_length: 1024
    client_spec:
      class_name: "helm.clients.huggingface_client.HuggingFaceClient"

  # an old flexbatch entry, to be replaced
  - name: flexbatch/demo-model
    model_name: flexbatch/demo-model
    client_spec: {class_name: old.Client, args: {store: /old}}

  - name: local/other   # after ours: stays after it
    model_name: local/other
    client_spec:
      class_name: x.Y
"""


def _one_line_error(result, *fragments):
    """Exit 2 with one `flexbatch: error:` line holding every fragment, and no traceback (the deployment line may
    come first on stdout)."""
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    lines = [line for line in result.stderr.strip().splitlines() if line.startswith("flexbatch: error: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _batch(tmp_path, *extra):
    return CliRunner().invoke(helm_batch_command, ["--suite", "S", "--no-ray", "--helm-output",
                                                   str(tmp_path / "benchmark_output"), "--local-path",
                                                   str(tmp_path / "prod_env"), *extra])


def _run_state(tmp_path, text: str):
    run = tmp_path / "benchmark_output" / "runs" / "S" / "simple1:model=flexbatch_demo-model"
    run.mkdir(parents=True)
    (run / "scenario_state.json").write_text(text)
    return run / "scenario_state.json"


@pytest.mark.parametrize("text, fragment", [
    ('{"adapter_spec": {}, "request_states": [', "is not a readable scenario_state.json (JSONDecodeError"),
    ("[1, 2]", "is not a HELM scenario_state.json (expected an object with a request_states list, got list)"),
    ('{"request_states": {"a": 1}}', "is not a HELM scenario_state.json"),
    ('{"request_states": [7]}', "request_states[0] has no request object"),
])
def test_a_corrupt_scenario_state_is_one_line_naming_it(tmp_path, text, fragment):
    path = _run_state(tmp_path, text)
    _one_line_error(_batch(tmp_path), str(path), fragment, "helm-run --dry-run")


@pytest.mark.parametrize("text, fragment", [
    ("model_deployments: [\n", "is not valid YAML"),
    ("- name: a\n", "is not a mapping of sections"),
    ("model_deployments: 3\n", "model_deployments is not a list"),
])
def test_a_malformed_deployments_file_is_one_line_naming_it(tmp_path, text, fragment):
    (tmp_path / "prod_env").mkdir()
    path = tmp_path / "prod_env" / "model_deployments.yaml"
    path.write_text(text)
    assert_user_error(_batch(tmp_path), str(path), fragment)
    assert path.read_text() == text
    assert not (tmp_path / "prod_env" / "model_metadata.yaml").exists()  # no file is written when one is bad


def test_the_users_deployments_file_keeps_its_text_around_our_entry(tmp_path):
    (tmp_path / "prod_env").mkdir()
    path = tmp_path / "prod_env" / "model_deployments.yaml"
    path.write_text(USERS_DEPLOYMENTS)
    result = _batch(tmp_path)
    assert result.exit_code == 0, (result.output, result.exception)
    text = path.read_text()
    ours_start = USERS_DEPLOYMENTS.index("  - name: flexbatch/demo-model")
    ours_end = USERS_DEPLOYMENTS.index("\n\n  - name: local/other")
    assert text.startswith(USERS_DEPLOYMENTS[:ours_start]) and text.endswith(USERS_DEPLOYMENTS[ours_end:])
    entries = yaml.safe_load(text)["model_deployments"]
    assert [e["name"] for e in entries] == ["openai/gpt2", "flexbatch/demo-model", "local/other"]
    ours = entries[1]
    assert ours["client_spec"]["class_name"] == CLIENT
    assert ours["client_spec"]["args"]["store"] == str((tmp_path / "benchmark_output" / "flexbatch_store").resolve())
    assert _batch(tmp_path).exit_code == 0 and path.read_text() == text  # again: nothing changes


@pytest.mark.parametrize("suite", ["../../x", "/abs/suite", "..", "a/b"])
def test_a_suite_that_is_a_path_is_refused(tmp_path, suite):
    result = CliRunner().invoke(helm_batch_command, ["--suite", suite, "--no-ray", "--helm-output",
                                                     str(tmp_path / "out"), "--local-path", str(tmp_path / "env")])
    assert_user_error(result, f"--suite {suite!r} is invalid", "a folder name")
    assert not (tmp_path / "env").exists()


def test_the_store_names_the_bad_line(tmp_path):
    _run_state(tmp_path, json.dumps({"request_states": []}))
    store = tmp_path / "benchmark_output" / "flexbatch_store"
    store.mkdir(parents=True)
    result = {"success": True, "embedding": [], "completions": [], "cached": False}
    (store / "results.jsonl").write_text(json.dumps({"key": "a", "request": {}, "result": result}) + "\nnot json\n")
    _one_line_error(_batch(tmp_path), "results.jsonl line 2 is not a stored result")


def test_a_request_or_stored_result_of_the_wrong_type_is_one_line_naming_file_request_and_field(tmp_path):
    request = {"prompt": "Q: 1+1? A:", "temperature": "hot", "max_tokens": 2, "num_completions": 1}
    state = _run_state(tmp_path, json.dumps({"request_states": [{"instance": {"id": "i0"}, "request": request}]}))
    _one_line_error(_batch(tmp_path), str(state), "request_states[0]", "field temperature='hot' is not a number")
    state.write_text(json.dumps({"request_states": [{"instance": {"id": "i0"}, "request": {**request,
                                                                                            "temperature": 0}}]}))
    from jobs.helm.store import request_key

    store = tmp_path / "benchmark_output" / "flexbatch_store"
    store.mkdir(parents=True)
    result = {"success": True, "embedding": [], "cached": False,
              "completions": [{"text": " 2", "logprob": "low", "tokens": []}]}
    key = request_key({**request, "temperature": 0})
    (store / "results.jsonl").write_text(json.dumps({"key": key, "request": request, "result": result}) + "\n")
    _one_line_error(_batch(tmp_path), "results.jsonl line 1", f"request {key[:12]}",
                    "completions[0].logprob='low' is not a number")
