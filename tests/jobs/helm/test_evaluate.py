"""HELM's basic statistics and their aggregation (per_instance_stats.json, stats.json), on hand-made request
states; the same names and values HELM's BasicGenerationMetric and InstancesPerSplitMetric compute (checked
against the real crfm-helm in test_helm_tools.py)."""

import math

from engine.tokenizer import load_tokenizer
from jobs.common import demo_model_dir
from jobs.helm.evaluate import evaluate
from jobs.helm.fit import register_deployment
from jobs.helm.helm_objects import to_adapter_spec
from jobs.helm.metrics import basic_metrics, request_state_stats

ADAPTER = {"method": "generation", "num_train_trials": 1, "num_outputs": 1, "model_deployment": "demo-model"}
PROMPT = "Q: What is 55 plus 56? A:"


def request_state_stats_of(state, names, adapter=ADAPTER):
    service = register_deployment("demo-model", demo_model_dir())
    return request_state_stats(state, basic_metrics().BasicGenerationMetric(list(names)), to_adapter_spec(adapter),
                               service)


def _state(text, tokens, trial=0, instance_id="i", reason="stop", split="test", result=None, perturbation=None):
    instance = {"id": instance_id, "split": split, "input": {"text": "q"},
                "references": [{"output": {"text": "111"}, "tags": ["correct"]}, {"output": {"text": "0"}, "tags": []}]}
    if perturbation is not None:
        instance["perturbation"] = perturbation
    completion = {"text": text, "logprob": sum(lp for _, lp in tokens),
                  "tokens": [{"text": t, "logprob": lp} for t, lp in tokens], "finish_reason": {"reason": reason}}
    return {"instance": instance, "train_trial_index": trial, "num_train_instances": 2, "prompt_truncated": False,
            "num_conditioning_tokens": 0, "request": {"prompt": PROMPT, "num_completions": 1},
            "result": result or {"success": True, "completions": [completion], "request_time": 0.5,
                                 "batch_size": 4, "batch_request_time": 2.0}}


def _by_name(stats):
    return {s.name["name"]: s for s in stats}


def test_one_request_state_has_helms_basic_stats_in_its_context():
    stats = request_state_stats_of(_state("111", [("1", -0.5), ("11", -1.0), ("\u00e9", -0.25)]), ("exact_match",))
    by = _by_name(stats)
    assert all(s.name["split"] == "test" for s in stats)
    assert by["num_references"].sum == 2 and by["num_train_trials"].sum == 1
    prompt_tokens = len(load_tokenizer(demo_model_dir())(PROMPT)["input_ids"])  # as the engine counts them
    assert by["num_prompt_tokens"].sum == prompt_tokens and by["num_completion_tokens"].sum == 3 == by["num_output_tokens"].sum
    assert by["inference_runtime"].sum == 2.0 and by["batch_size"].sum == 4  # the batch's time and size
    assert by["inference_denoised_runtime"].sum == 0.5
    assert [by[f"finish_reason_{r}"].sum for r in ("length", "stop", "endoftext", "unknown")] == [0, 1, 0, 0]
    assert by["num_train_instances"].sum == 2 and by["prompt_truncated"].sum == 0
    assert by["exact_match"].sum == 1 and math.isclose(by["max_prob"].sum, math.exp(-1.75))
    assert math.isclose(by["logprob"].sum, -1.75) and by["num_perplexity_tokens"].sum == 3
    assert by["num_bytes"].sum == 1 + 2 + 2  # é is two bytes in UTF-8


def test_a_request_time_without_a_batch_is_a_batch_of_one():
    state = _state("111", [("111", -0.1)])
    state["result"] = {"success": True, "completions": state["result"]["completions"], "request_time": 0.3}
    by = _by_name(request_state_stats_of(state, ("exact_match",)))
    assert by["inference_runtime"].sum == 0.3 and by["batch_size"].sum == 1 and "inference_denoised_runtime" not in by


def test_a_failed_request_counts_as_helms_empty_completion():
    failed = {"success": False, "error": "prompt too long", "completions": [{"text": "", "logprob": 0.0, "tokens": []}],
              "error_flags": {"is_retriable": False, "is_fatal": False}}
    by = _by_name(request_state_stats_of(_state("", [], result=failed), ("exact_match",)))
    assert by["exact_match"].sum == 0 and by["finish_reason_unknown"].sum == 1 and by["num_bytes"].sum == 0
    assert by["num_completion_tokens"].sum == 0 and "inference_runtime" not in by


def test_num_bytes_counts_byte_tokens_as_helm():
    state = _state("\u2019 world", [("bytes:\\xe2\\x80", -0.1), ("bytes:\\x99", -0.1), (" world", -0.1)])
    assert _by_name(request_state_stats_of(state, ("exact_match",)))["num_bytes"].sum == 2 + 1 + 6


def test_evaluate_takes_the_mean_of_each_train_trial_and_derives_perplexity():
    states = []
    for trial, texts in enumerate((["111", "0", "0", "0"], ["111", "111"])):
        for i, text in enumerate(texts):
            states.append(_state(text, [(text, -1.0), ("\n", -1.0)], trial=trial, instance_id=f"i{i}"))
    per_instance, stats = evaluate(states, ("exact_match",), {**ADAPTER, "num_train_trials": 2},
                                   demo_model_dir())
    assert [(p["instance_id"], p["train_trial_index"]) for p in per_instance][:2] == [("i0", 0), ("i1", 0)]
    assert len(per_instance) == 6 and all("perturbation" not in p for p in per_instance)
    by = {s["name"]["name"]: s for s in stats}
    assert by["exact_match"]["count"] == 2 and math.isclose(by["exact_match"]["mean"], (0.25 + 1.0) / 2)
    assert by["num_instances"]["name"] == {"name": "num_instances", "split": "test"}
    assert by["num_instances"]["count"] == 2 and by["num_instances"]["mean"] == 3  # (4 + 2) / 2, as HELM
    assert math.isclose(by["perplexity"]["mean"], math.e)  # every token has logprob -1
    # trial 0: "111\n" and "0\n" x3, 8 tokens in 10 bytes; trial 1: "111\n" x2, 4 tokens in 8 bytes
    assert math.isclose(by["bits_per_byte"]["sum"], (8 / 10 + 4 / 8) / math.log(2))
    assert by["bits_per_byte"]["count"] == 2 and math.isclose(by["logprob_per_byte"]["sum"], -0.8 - 0.5)


def test_perturbed_instances_carry_their_perturbation():
    typo = {"name": "typos", "robustness": True, "fairness": False, "computed_on": "perturbed", "prob": 0.1}
    states = [_state("111", [("111", -0.1)]), _state("0", [("0", -0.1)], perturbation=typo)]
    states[1]["instance"]["id"] = "i"
    per_instance, stats = evaluate(states, ("exact_match",), ADAPTER, demo_model_dir())
    assert per_instance[1]["perturbation"] == typo and "perturbation" not in per_instance[0]
    em = [s for s in stats if s["name"]["name"] == "exact_match"]
    assert {(s["name"].get("perturbation") or {}).get("name"): s["sum"] for s in em} == {None: 1, "typos": 0}
    assert all(s["name"]["perturbation"] == typo for s in per_instance[1]["stats"])
