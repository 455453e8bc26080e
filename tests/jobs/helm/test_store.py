"""The helm-batch results store: request identity, the suite's distinct requests, and refused requests."""

import json

import pytest

from jobs.helm.errors import SpecError
from jobs.helm.store import add_results, read_results, request_key, suite_requests

REQUEST = {"model_deployment": "simple/model1", "model": "simple/model1", "embedding": False, "prompt": "Q: 1+1? A:",
           "temperature": 1, "num_completions": 3, "top_k_per_token": 1, "max_tokens": 8, "stop_sequences": ["."],
           "echo_prompt": False, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0}


def test_the_key_ignores_the_models_name_and_number_types_but_not_decoding():
    renamed = {**REQUEST, "model": "flexbatch/demo-model", "model_deployment": "flexbatch/demo-model",
               "temperature": 1.0, "top_p": 1.0}
    assert request_key(renamed) == request_key(REQUEST)
    for change in ({"max_tokens": 9}, {"random": "1"}, {"prompt": "Q: 1+2? A:"}, {"stop_sequences": []}):
        assert request_key({**REQUEST, **change}) != request_key(REQUEST), change


def _suite(tmp_path, runs):
    for name, requests in runs.items():
        run = tmp_path / "runs" / "S" / name
        run.mkdir(parents=True)
        states = [{"instance": {"id": f"i{i}"}, "request": r} for i, r in enumerate(requests)]
        (run / "scenario_state.json").write_text(json.dumps({"request_states": states}))


def test_suite_requests_are_distinct_across_runs(tmp_path):
    other = {**REQUEST, "prompt": "Q: 2+2? A:"}
    _suite(tmp_path, {"a": [REQUEST, other], "b": [{**REQUEST, "model": "x"}, {**other, "random": "2"}]})
    states = suite_requests(tmp_path, "S")
    assert [s["request"]["prompt"] for s in states] == ["Q: 1+1? A:", "Q: 2+2? A:", "Q: 2+2? A:"]
    assert [s["instance"]["id"] for s in states] == ["i0", "i1", "i1"]


@pytest.mark.parametrize("change, fragment", [({"echo_prompt": True}, "echo_prompt with max_tokens=8"),
                                              ({"embedding": True}, "embedding"),
                                              ({"prompt": "", "messages": [{"role": "user"}]}, "no text prompt")])
def test_requests_that_generate_after_an_echo_embed_or_chat_are_refused_by_name(tmp_path, change, fragment):
    _suite(tmp_path, {"a": [REQUEST, {**REQUEST, **change}]})
    with pytest.raises(SpecError, match=fragment) as e:
        suite_requests(tmp_path, "S")
    assert "request_states[1]" in str(e.value)


def test_scoring_requests_are_taken(tmp_path):
    """HELM's language_modeling and multiple_choice_separate requests: echo_prompt with max_tokens 0."""
    scoring = {**REQUEST, "echo_prompt": True, "max_tokens": 0, "num_completions": 1}
    _suite(tmp_path, {"a": [REQUEST, scoring]})
    assert [s["request"]["echo_prompt"] for s in suite_requests(tmp_path, "S")] == [False, True]


def test_a_missing_suite_names_the_dry_run(tmp_path):
    with pytest.raises(SpecError, match="--dry-run"):
        suite_requests(tmp_path, "nope")


def test_results_append_and_a_later_line_wins(tmp_path):
    add_results(tmp_path, [{"key": "a", "request": {}, "result": {"success": True}}])
    add_results(tmp_path, [{"key": "b", "request": {}, "result": {"success": False}},
                           {"key": "a", "request": {}, "result": {"success": False}}])
    assert read_results(tmp_path) == {"a": {"success": False}, "b": {"success": False}}
    (tmp_path / "results.jsonl").write_text("not json\n")
    with pytest.raises(SpecError, match="line 1 is not a stored result"):
        read_results(tmp_path)
