"""HELM's scoring methods through `flexbatch helm`: `language_modeling` and `multiple_choice_separate_*` requests
(`echo_prompt`, `max_tokens` 0) answered from the engine's prompt scores, then scored by HELM's own metrics."""

import json
import math

import pytest
import torch

from tests.jobs.helm.files import invoke, read_json, write_jsonl, write_spec

DOCS = ["The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
        "def add(a, b):\n    return a + b\n",
        "Q: What is 12 plus 30? A: 42"]
CHOICES = [("The fox jumps over the", ["dog", "box", "jugs"], "dog"),
           ("Pack my box with five", ["dozen", "liquor"], "dozen"),
           ("Q: What is 12 plus 30? A:", ["42", "30", "12"], "42")]


def _transformers_logprobs(model_dir, ids: list[int]) -> list[float]:
    """log p(token_j | tokens before) for j = 1..n-1, by transformers' forward pass in float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return [logp[j - 1, ids[j]].item() for j in range(1, len(ids))]


def _run(tmp_path, checkpoint_dir, scenario_rows, adapter, name="r"):
    spec = write_spec(tmp_path / "spec.yaml", [{"scenario": str(write_jsonl(tmp_path / "s.jsonl", scenario_rows)),
                                                "model": str(checkpoint_dir), "name": name, "adapter": adapter}])
    result = invoke("--spec", spec, "--suite", "s", "--output", tmp_path / "out", "--no-ray", "--dtype", "float32")
    assert result.exit_code == 0, (result.output, result.exception)
    return tmp_path / "out" / "runs" / "s" / name


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, checkpoint):
    model_dir = checkpoint("llama_gqa_llama3")
    rows = [{"id": f"d{i}", "input": doc, "references": [], "split": "test"} for i, doc in enumerate(DOCS)]
    return model_dir, _run(tmp_path_factory.mktemp("lm"), model_dir, rows, {"method": "language_modeling"})


def test_echoed_logprobs_equal_transformers(lm_run):
    from engine.tokenizer import load_tokenizer

    model_dir, run_dir = lm_run
    tokenizer = load_tokenizer(model_dir)
    states = read_json(run_dir / "scenario_state.json")["request_states"]
    assert len(states) == len(DOCS)
    for rs in states:
        request, [completion] = rs["request"], rs["result"]["completions"]
        assert request["echo_prompt"] and request["max_tokens"] == 0 and rs["result"]["success"]
        ids = tokenizer(request["prompt"])["input_ids"]
        expected = [0.0, *_transformers_logprobs(model_dir, ids)]  # this tokenizer adds no BOS: the first has none
        assert [t["logprob"] for t in completion["tokens"]] == pytest.approx(expected, abs=1e-4)
        assert "".join(t["text"] for t in completion["tokens"]) == request["prompt"]
        assert completion["logprob"] == pytest.approx(sum(expected), abs=1e-3)


def test_language_modeling_stats_are_helms(lm_run):
    """Each document's stats by HELM's LanguageModelingMetric; stats.json's perplexity and bits per byte by HELM's
    compute_perplexity_metrics over them."""
    _, run_dir = lm_run
    per_instance = read_json(run_dir / "per_instance_stats.json")
    states = read_json(run_dir / "scenario_state.json")["request_states"]
    logprob = nbytes = ntokens = 0.0
    for rec, rs in zip(per_instance, states):
        stats = {s["name"]["name"]: s["sum"] for s in rec["stats"]}
        tokens = rs["result"]["completions"][0]["tokens"][rs["num_conditioning_tokens"]:]
        assert stats["logprob"] == pytest.approx(sum(t["logprob"] for t in tokens))
        assert stats["num_perplexity_tokens"] == len(tokens)
        assert stats["num_bytes"] == len(rs["request"]["prompt"].encode())  # every byte of the document
        logprob, nbytes, ntokens = logprob + stats["logprob"], nbytes + stats["num_bytes"], ntokens + len(tokens)
    overall = {s["name"]["name"]: s.get("mean") for s in read_json(run_dir / "stats.json")
               if s["name"].get("split") == "test"}
    assert overall["perplexity"] == pytest.approx(math.exp(-logprob / ntokens))
    assert overall["bits_per_byte"] == pytest.approx(-logprob / nbytes / math.log(2))
    spec = read_json(run_dir / "run_spec.json")
    assert spec["metric_specs"][0]["class_name"].endswith("LanguageModelingMetric")


@pytest.mark.parametrize("method", ["multiple_choice_separate_original", "multiple_choice_separate_calibrated"])
def test_multiple_choice_separate_picks_helms_best_choice(tmp_path, checkpoint, method):
    from engine.tokenizer import load_tokenizer

    model_dir = checkpoint("llama_gqa_llama3")
    rows = [{"id": f"q{i}", "input": q, "choices": c, "references": [a], "split": "test"}
            for i, (q, c, a) in enumerate(CHOICES)]
    run_dir = _run(tmp_path, model_dir, rows, {"method": method, "max_train_instances": 0})
    tokenizer = load_tokenizer(model_dir)
    states = read_json(run_dir / "scenario_state.json")["request_states"]
    per_instance = {r["instance_id"]: {s["name"]["name"]: s["sum"] for s in r["stats"]}
                    for r in read_json(run_dir / "per_instance_stats.json")}
    for i, (_, choices, answer) in enumerate(CHOICES):
        scores = {}
        for rs in [s for s in states if s["instance"]["id"] == f"q{i}"]:
            assert rs["request"]["echo_prompt"] and rs["request"]["max_tokens"] == 0
            n = len(tokenizer(" " + choices[rs["reference_index"]], add_special_tokens=False)["input_ids"])
            ids = tokenizer(rs["request"]["prompt"])["input_ids"]
            lp = sum(_transformers_logprobs(model_dir, ids)[-n:])  # the choice's own tokens, as HELM cuts them
            scores[(rs["reference_index"], rs["request_mode"])] = (lp, n)
        if method.endswith("original"):
            final = [scores[(k, "original")][0] / scores[(k, "original")][1] for k in range(len(choices))]
        else:
            final = [scores[(k, "original")][0] - scores[(k, "calibration")][0] for k in range(len(choices))]
        best = max(range(len(choices)), key=lambda k: final[k])
        assert per_instance[f"q{i}"]["predicted_index"] == best, (final, per_instance[f"q{i}"])
        assert per_instance[f"q{i}"]["exact_match"] == float(choices[best] == answer)
    summary = json.loads((run_dir.parent / "flexbatch_summary.json").read_text())
    [metric] = summary["runs"][0]["metrics"]
    assert metric["name"] == "exact_match" and metric["count"] == len(CHOICES)
