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
    def result(ok):
        return {"success": ok, "embedding": [], "completions": [], "cached": False}

    add_results(tmp_path, [{"key": "a", "request": {}, "result": result(True)}])
    add_results(tmp_path, [{"key": "b", "request": {}, "result": result(False)},
                           {"key": "a", "request": {}, "result": result(False)}])
    assert read_results(tmp_path) == {"a": result(False), "b": result(False)}
    (tmp_path / "results.jsonl").write_text("not json\n")
    with pytest.raises(SpecError, match="line 1 is not a stored result"):
        read_results(tmp_path)


def test_a_multiple_choice_joint_requests_output_mapping_is_kept_and_constrains_its_answer(tmp_path):
    """helm-batch constrains the letters as `flexbatch helm` does (the request state's output_mapping)."""
    from jobs.helm.execute import request_rows

    run = tmp_path / "runs" / "S" / "a"
    run.mkdir(parents=True)
    states = [{"instance": {"id": "i0"}, "request": REQUEST, "output_mapping": {"A": "red", "B": "blue"}},
              {"instance": {"id": "i1"}, "request": {**REQUEST, "prompt": "free"}}]
    (run / "scenario_state.json").write_text(json.dumps({"request_states": states}))
    read = suite_requests(tmp_path, "S")
    assert read[0]["output_mapping"] == {"A": "red", "B": "blue"} and "output_mapping" not in read[1]
    rows = request_rows(read)
    assert json.loads(rows[0]["guided"]) == {"choice": [" A", " B", "A", "B"]} and rows[3]["guided"] is None


@pytest.mark.parametrize("change, fragment", [({"temperature": "hot"}, "field temperature='hot' is not a number"),
                                              ({"max_tokens": "8"}, "field max_tokens='8' is not a whole number"),
                                              ({"num_completions": 0}, "num_completions=0 is not a whole number >= 1"),
                                              ({"stop_sequences": "."}, "stop_sequences='.' is not a list")])
def test_a_request_field_of_the_wrong_type_is_one_error_naming_file_request_and_field(tmp_path, change, fragment):
    _suite(tmp_path, {"a": [REQUEST, {**REQUEST, **change}]})
    with pytest.raises(SpecError, match=fragment) as e:
        suite_requests(tmp_path, "S")
    assert "scenario_state.json: request_states[1]" in str(e.value) and "--dry-run" in str(e.value)


def test_a_stored_result_helms_client_could_not_read_names_the_line_and_field(tmp_path):
    good = {"success": True, "embedding": [], "cached": False, "request_time": 0.5, "batch_size": 2,
            "completions": [{"text": " B", "logprob": -0.5, "tokens": [{"text": " B", "logprob": -0.5}],
                             "finish_reason": {"reason": "length"}}]}
    bad = {**good, "completions": [{**good["completions"][0], "logprob": "x"}]}
    add_results(tmp_path, [{"key": "k1", "request": REQUEST, "result": good},
                           {"key": "k2", "request": REQUEST, "result": bad}])
    with pytest.raises(SpecError, match=r"results.jsonl line 2 \(request k2\): result field completions\[0\].logprob="
                                        r"'x' is not a number; remove the line"):
        read_results(tmp_path)
    import dacite
    from helm.common.request import RequestResult

    dacite.from_dict(RequestResult, good)  # what the checks accept, HELM's client reads
    (tmp_path / "results.jsonl").unlink()
    add_results(tmp_path, [{"key": "k2", "request": REQUEST, "result": {**good, "batch_size": 2.5}}])
    with pytest.raises(SpecError, match="line 1 .*batch_size=2.5"):
        read_results(tmp_path)
