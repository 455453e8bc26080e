"""The lm-evaluation-harness backend (`flexbatch`) against lm-eval's own `hf` backend on the same random-weight
checkpoint, offline, on tasks defined here (a JSONL dataset and a task YAML made in tmp_path): the same answer for
every request (log-likelihoods to 1e-4, is_greedy equal, generated text equal) and the same metrics."""

import json
import sys

import pytest

lm_eval = pytest.importorskip("lm_eval")

VARIANT = "llama_gqa_llama3"
QUESTIONS = [
    ("Q: What is 12 plus 30? A:", [" 42", " 12", " thirty", " forty two"], 0),
    ("The quick brown fox", [" jumps", " sleeps", " runs over the lazy dog"], 0),
    ("Product A is a red kettle; product B a blue one. Same? Answer:", [" yes", " no"], 1),
    ("copy: abc ->", [" abc", " abd", " cba"], 0),
    ("Pack my box with five dozen", [" liquor jugs", " eggs"], 0),
    ("x", [" y", "y", " z"], 2),
]
TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "def add(a, b):\n    return a + b\n", "hello world"]
TASKS = {
    "fb_mc": {"output_type": "multiple_choice", "doc_to_text": "{{question}}", "doc_to_choice": "{{choices}}",
              "doc_to_target": "{{answer}}", "metric_list": [{"metric": "acc"}]},
    "fb_ppl": {"output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
               "metric_list": [{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}]},
    "fb_gen": {"output_type": "generate_until", "doc_to_text": "{{question}}", "doc_to_target": "{{target}}",
               "generation_kwargs": {"until": ["\n"], "max_gen_toks": 6, "do_sample": False},
               "metric_list": [{"metric": "exact_match"}]},
}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """The three tasks' folder (passed to lm-eval as include_path), and HF's offline switches."""
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    rows = {"fb_mc": [{"question": q, "choices": c, "answer": a} for q, c, a in QUESTIONS],
            "fb_ppl": [{"text": t} for t in TEXTS],
            "fb_gen": [{"question": q, "target": c[a]} for q, c, a in QUESTIONS]}
    for name, spec in TASKS.items():
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows[name]))
        task = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
                "test_split": "test", **spec}
        (folder / f"{name}.yaml").write_text(json.dumps(task))  # JSON is YAML
    return folder


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """HF's offline switches, and lm-eval's TaskManager kept to the tasks made here: indexing lm-eval's own
    thousands of task files takes ~30 s on this machine."""
    from lm_eval.tasks import TaskManager

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    init = TaskManager.__init__
    monkeypatch.setattr(TaskManager, "__init__", lambda self, *a, **kw: init(self, *a, **{**kw,
                                                                                      "include_defaults": False}))


def _evaluate(model: str, model_args: str, tasks):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import flexbatch.lm_eval  # noqa: F401  (registers the flexbatch model)

    return simple_evaluate(model=model, model_args=model_args, tasks=list(TASKS), log_samples=True,
                           task_manager=TaskManager(include_path=str(tasks)), batch_size=4, device="cpu")


def _answers(result, task):
    return [doc["filtered_resps"] for doc in sorted(result["samples"][task], key=lambda d: d["doc_id"])]


def test_flexbatch_answers_every_request_as_the_hf_backend(checkpoint, tasks, offline):
    model = checkpoint(VARIANT)
    max_length = json.loads((model / "config.json").read_text())["max_position_embeddings"] - 2  # flexbatch's default
    hf = _evaluate("hf", f"pretrained={model},dtype=float32,max_length={max_length}", tasks)
    fb = _evaluate("flexbatch", f"pretrained={model},dtype=float32", tasks)
    for ours, theirs in zip(_answers(fb, "fb_mc"), _answers(hf, "fb_mc")):
        assert len(ours) == len(theirs) > 1
        for (lp, greedy), (ref_lp, ref_greedy) in zip(ours, theirs):
            assert lp == pytest.approx(ref_lp, abs=1e-4) and greedy == ref_greedy
    ppl = [a[0] if isinstance(a, list) else a for a in _answers(fb, "fb_ppl")]
    ref = [a[0] if isinstance(a, list) else a for a in _answers(hf, "fb_ppl")]
    assert ppl == pytest.approx(ref, abs=1e-3) and all(v < 0 for v in ppl)
    assert _answers(fb, "fb_gen") == _answers(hf, "fb_gen")
    for task, metric in (("fb_mc", "acc,none"), ("fb_ppl", "word_perplexity,none"), ("fb_gen", "exact_match,none")):
        assert fb["results"][task][metric] == pytest.approx(hf["results"][task][metric], rel=1e-5), task


def test_the_module_runs_lm_evals_command_line_and_refuses_unknown_args(checkpoint, tasks, offline, tmp_path,
                                                                       monkeypatch):
    from flexbatch.lm_eval import main

    model = checkpoint(VARIANT)
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "flexbatch", "--model_args",
                                      f"pretrained={model},dtype=float32,plan=False,gbs=4", "--tasks", "fb_mc",
                                      "--include_path", str(tasks), "--output_path", str(tmp_path / "results")])
    main()  # python -m flexbatch.lm_eval ..., in this process
    result = json.loads(next((tmp_path / "results").rglob("results_*.json")).read_text())
    assert 0 <= result["results"]["fb_mc"]["acc,none"] <= 1 and result["config"]["model"] == "flexbatch"
    from flexbatch.lm_eval import FlexbatchLM
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model_args \['temprature'\] are not known"):
        FlexbatchLM(pretrained=model, temprature=0.5)
    with pytest.raises(ConfigError, match="max_length=0 is invalid"):
        FlexbatchLM(pretrained=model, max_length=0)


def test_a_continuation_longer_than_max_length_is_refused_as_the_hf_backend_refuses_it(checkpoint):
    """Only its last max_length tokens could be scored: a partial sum is not the request's log-likelihood."""
    from flexbatch.lm_eval import FlexbatchLM, RequestFailed

    lm = FlexbatchLM(pretrained=checkpoint(VARIANT), dtype="float32", max_length=8, plan=False)
    fits = lm._loglikelihood_tokens([(None, [1, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14])])
    assert len(fits) == 1 and fits[0][0] < 0
    with pytest.raises(RequestFailed, match="request 1: its continuation has 9 tokens, more than max_length=8"):
        lm._loglikelihood_tokens([(None, [1, 5], [7, 8]), (None, [1, 5, 6], list(range(7, 16)))])
