"""HELM's scenario_state.json as input: read without loss, re-run with our engine into a HELM run folder, and
our own scenario_state.json fed back in gives the same results."""

import copy
import json

import pytest

from jobs.helm.errors import SpecError
from jobs.helm.state import read_scenario_state, renamed_model, source_metrics
from tests.jobs.helm.files import DEMO_ADAPTER, invoke, read_json, write_spec

QUESTIONS = [("What is 55 plus 56?", "111"), ("What is 48 plus 74?", "122"), ("What is 92 plus 98?", "190")]


def _helm_state():
    """A scenario state as HELM writes it (field names of HELM's RequestState, Instance, Request, RequestResult),
    with fields flexbatch does not use, which must survive."""
    states = []
    for i, (question, answer) in enumerate(QUESTIONS):
        states.append({
            "instance": {"input": {"text": question}, "references": [{"output": {"text": answer}, "tags": ["correct"]}],
                         "split": "test", "sub_split": "easy", "id": f"id{i}"},
            "train_trial_index": 0,
            "request": {"model_deployment": "openai/gpt2", "model": "openai/gpt2", "embedding": False,
                        "prompt": f"Q: What is 10 plus 11? A: 21\nQ: {question} A:", "temperature": 0.0,
                        "num_completions": 1, "top_k_per_token": 1, "max_tokens": 4, "stop_sequences": ["\n"],
                        "echo_prompt": False, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0},
            "result": {"success": True, "embedding": [], "completions": [
                {"text": " 7", "logprob": -1.5, "tokens": [{"text": " 7", "logprob": -1.5}]}],
                "cached": False, "request_time": 0.25, "request_datetime": 1700000000},
            "num_train_instances": 1, "prompt_truncated": False, "num_conditioning_tokens": 0,
            "annotations": {"note": "kept"},
        })
    adapter_spec = {"method": "generation", "instructions": "", "input_prefix": "Q: ", "output_prefix": "A: ",
                    "max_train_instances": 1, "num_outputs": 1, "model": "openai/gpt2",
                    "model_deployment": "openai/gpt2", "temperature": 0.0, "max_tokens": 4, "stop_sequences": ["\n"]}
    return {"adapter_spec": adapter_spec, "request_states": states,
            "annotator_specs": [{"class_name": "helm.benchmark.annotation.Annotator", "args": {}}]}


@pytest.fixture
def helm_run(tmp_path):
    run = tmp_path / "benchmark_output" / "runs" / "v1" / "arith:task=add,model=openai_gpt2"
    run.mkdir(parents=True)
    (run / "scenario_state.json").write_text(json.dumps(_helm_state(), indent=2))
    (run / "run_spec.json").write_text(json.dumps({
        "name": run.name, "scenario_spec": {"class_name": "helm.benchmark.scenarios.arith.ArithScenario",
                                            "args": {"task": "add"}},
        "metric_specs": [{"class_name": "helm.benchmark.metrics.basic_metrics.BasicGenerationMetric",
                          "args": {"names": ["exact_match", "bleu_4"]}}], "groups": ["arith"]}))
    return run


def test_read_keeps_every_field(helm_run):
    path = helm_run / "scenario_state.json"
    assert read_scenario_state(path) == json.loads(path.read_text())
    renamed = renamed_model(read_scenario_state(path), "demo-model")
    rs, original = renamed["request_states"][0], _helm_state()["request_states"][0]
    assert "result" not in rs and rs["request"]["model"] == rs["request"]["model_deployment"] == "demo-model"
    assert {k: v for k, v in rs["request"].items() if not k.startswith("model")} == \
        {k: v for k, v in original["request"].items() if not k.startswith("model")}
    assert rs["instance"] == original["instance"] and rs["annotations"] == {"note": "kept"}


def test_metrics_come_from_the_runs_run_spec(helm_run):
    assert source_metrics(helm_run / "scenario_state.json") == ("exact_match",)  # bleu_4 is not computed here


def test_rerun_writes_a_helm_run_folder(helm_run, tmp_path):
    result = invoke("--scenario-state", helm_run / "scenario_state.json", "--suite", "again", "--output",
                    tmp_path / "out", "--no-ray")
    assert result.exit_code == 0, (result.output, result.exception)
    run = tmp_path / "out" / "runs" / "again" / "arith:task=add,model=demo-model"
    assert "| arith:task=add,model=demo-model | done | 1.000 (3) |" in result.output
    out, source = read_json(run / "scenario_state.json"), _helm_state()
    assert out["annotator_specs"] == source["annotator_specs"]
    assert out["adapter_spec"] == {**source["adapter_spec"], "model": "demo-model", "model_deployment": "demo-model"}
    for got, was in zip(out["request_states"], source["request_states"]):
        assert {k: v for k, v in got.items() if k not in ("request", "result")} == \
            {k: v for k, v in was.items() if k not in ("request", "result")}
        assert got["request"]["prompt"] == was["request"]["prompt"]
        assert got["result"]["completions"][0]["text"].strip() == was["instance"]["references"][0]["output"]["text"]
    run_spec = read_json(run / "run_spec.json")
    assert run_spec["scenario_spec"]["args"] == {"task": "add"} and run_spec["groups"] == ["arith"]
    assert run_spec["metric_specs"][0]["args"]["names"] == ["exact_match"]


def test_our_scenario_state_round_trips(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", [{"scenario": "addition", "adapter": DEMO_ADAPTER}])
    first = invoke("--spec", spec, "--suite", "a", "--output", tmp_path / "out", "--no-ray", "--max-eval-instances", 3)
    assert first.exit_code == 0, (first.output, first.exception)
    run = tmp_path / "out" / "runs" / "a" / "addition:model=demo-model"
    state_path = run / "scenario_state.json"
    assert read_scenario_state(state_path) == read_json(state_path)
    second = invoke("--scenario-state", state_path, "--suite", "b", "--output", tmp_path / "out", "--no-ray")
    assert second.exit_code == 0, (second.output, second.exception)
    again = tmp_path / "out" / "runs" / "b" / "addition:model=demo-model"
    assert _without_logprobs(read_json(again / "scenario_state.json")) == _without_logprobs(read_json(state_path))
    assert _scores(again) == _scores(run)


def _without_logprobs(state):
    """The state with its completions' log-probabilities and its timing dropped (the same prompts in other
    batches may differ in the last bits; the batches' times differ)."""
    for rs in state["request_states"]:
        for name in TIMING:
            assert name in rs["result"]
            rs["result"].pop(name)
        for c in rs["result"]["completions"]:
            c.pop("logprob")
            for t in c["tokens"]:
                t.pop("logprob")
    return state


TIMING = ("request_time", "request_datetime", "batch_size", "batch_request_time")
VARYING = ("max_prob", "logprob", "perplexity", "bits_per_byte", "logprob_per_byte", "inference_runtime",
           "inference_denoised_runtime", "batch_size")


def _scores(run):
    return [(p["instance_id"], [(s["name"], s["sum"]) for s in p["stats"] if s["name"]["name"] not in VARYING])
            for p in read_json(run / "per_instance_stats.json")]


@pytest.mark.parametrize("change, fragment", [
    (lambda s: s["adapter_spec"].update(method="ranking_binary"), "cannot be re-run here"),
    (lambda s: s["adapter_spec"].update(method="multiple_choice_separate_original"), "score their prompt"),
    (lambda s: s["request_states"][1]["request"].pop("prompt"), "request_states[1]: missing request.prompt"),
    (lambda s: s["request_states"][0].update(reference_index=2), "per-reference request"),
    (lambda s: s["request_states"][2]["instance"]["references"][0].update(tags=[]), "no reference tagged"),
    (lambda s: s["request_states"][0]["request"].update(max_tokens=0), "request.max_tokens=0"),
    (lambda s: s.pop("request_states"), "no request_states list"),
    # fields HELM's metrics read after the run: refused before it
    (lambda s: s["request_states"][1].update(train_trial_index="first"), "request_states[1] is not HELM's"),
    (lambda s: s["adapter_spec"].update(max_tokens="four"), "adapter_spec is not HELM's"),
])
def test_bad_scenario_state(tmp_path, change, fragment):
    state = copy.deepcopy(_helm_state())
    change(state)
    path = tmp_path / "scenario_state.json"
    path.write_text(json.dumps(state))
    with pytest.raises(SpecError) as e:
        read_scenario_state(path)
    assert fragment in str(e.value) and str(path) in str(e.value)
