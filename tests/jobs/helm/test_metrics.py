"""HELM's metrics, as flexbatch calls them, against hand-worked cases, including the corners of HELM's
normalization, the best of several references and predictions, multiple-choice letters and failed requests."""

import math

import pytest
from helm.benchmark.metrics.statistic import Stat

from jobs.common import demo_model_dir
from jobs.helm.fit import register_deployment
from jobs.helm.helm_objects import to_adapter_spec
from jobs.helm.metrics import METRICS, basic_metrics, request_state_stats, stat_json

_reference_metrics = basic_metrics().compute_reference_metrics.__globals__  # HELM's evaluate_reference_metrics
normalize_text, exact_match, f1_score = (_reference_metrics[n] for n in ("normalize_text", "exact_match", "f1_score"))
prefix_exact_match, quasi_exact_match = _reference_metrics["prefix_exact_match"], _reference_metrics["quasi_exact_match"]
quasi_leave_articles_exact_match = _reference_metrics["quasi_leave_articles_exact_match"]
quasi_prefix_exact_match = _reference_metrics["quasi_prefix_exact_match"]


def test_every_metric_a_spec_may_name_is_helms():
    assert all(callable(_reference_metrics[name]) for name in METRICS)


@pytest.mark.parametrize("text, expected", [
    ("The  Cat, sat!", "cat sat"),
    ("an apple a day", "apple day"),
    ("Theater in Anna's town", "theater in annas town"),  # articles are whole words only
    ("the-end", "theend"),  # punctuation goes first, so this is no longer the article "the"
    ("A.", ""),  # "A." -> "a" -> article
    ("  tabs\tand\nnewlines ", "tabs and newlines"),
    ("café’s «quote»", "café’s «quote»"),  # only ASCII punctuation is removed
])
def test_normalize_text(text, expected):
    assert normalize_text(text) == expected


def test_normalize_text_can_keep_articles():
    assert normalize_text("The Cat!", should_remove_articles=False) == "the cat"


@pytest.mark.parametrize("gold, pred, expected", [
    ("111", " 111 ", 1), ("111", "1110", 0), ("111", "", 0), ("", "", 0), ("Paris", "paris", 0),
    ("a b", "a  b", 0),  # only the ends are stripped
])
def test_exact_match(gold, pred, expected):
    assert exact_match(gold, pred) == expected


@pytest.mark.parametrize("gold, pred, expected", [
    ("Paris", "paris.", 1), ("The Eiffel Tower", "eiffel   tower!", 1), ("42", "forty-two", 0), ("x", "", 0),
    ("A", "a.", 1),  # both normalize to "", and the prediction is not empty: HELM scores 1
    ("the end", "the-end", 0),
])
def test_quasi_exact_match(gold, pred, expected):
    assert quasi_exact_match(gold, pred) == expected


def test_quasi_leave_articles_exact_match():
    assert quasi_leave_articles_exact_match("The cat!", "the cat") == 1
    assert quasi_leave_articles_exact_match("the cat", "cat") == 0
    assert quasi_exact_match("the cat", "cat") == 1


@pytest.mark.parametrize("gold, pred, expected", [
    ("111", "111 apples", 1), ("111", "  111", 1), ("111", "1 11", 0), ("Yes", "yes", 0), ("Yes", "", 0),
])
def test_prefix_exact_match(gold, pred, expected):
    assert prefix_exact_match(gold, pred) == expected


@pytest.mark.parametrize("gold, pred, expected", [
    ("The Answer", "answer: yes", 1), ("Yes", "yes, it is", 1), ("no", "None", 1),  # a string prefix, not a word
    ("the", "anything", 1),  # the gold normalizes to "", a prefix of everything
    ("yes", "", 0), ("cat", "a dog", 0),
])
def test_quasi_prefix_exact_match(gold, pred, expected):
    assert quasi_prefix_exact_match(gold, pred) == expected


@pytest.mark.parametrize("gold, pred, expected", [
    ("the cat sat", "cat sat down", 0.8),  # P = 2/3, R = 1
    ("cat cat", "cat", 1.0),  # sets of words
    ("New York City", "york", 0.5),  # P = 1, R = 1/3
    ("cat", "", 0.0), ("the", "the", 0.0),  # an empty set after normalizing scores 0
    ("red", "blue", 0.0),
])
def test_f1_score(gold, pred, expected):
    assert math.isclose(f1_score(gold, pred), expected)


def _state(refs, completions, mapping=None, split="test"):
    state = {"instance": {"id": "i", "split": split, "input": {"text": "q"},
                          "references": [{"output": {"text": t}, "tags": ["correct"] if ok else []} for t, ok in refs]},
             "train_trial_index": 0, "request": {"prompt": "q"},
             "result": {"completions": [{"text": t, "logprob": lp} for t, lp in completions]}}
    if mapping is not None:
        state["output_mapping"] = mapping
    return state


def reference_stats(state, names, num_outputs=1):
    """flexbatch's call of HELM's BasicGenerationMetric on one request state."""
    service = register_deployment("demo-model", demo_model_dir())
    spec = to_adapter_spec({"method": "generation", "model_deployment": "demo-model", "num_outputs": num_outputs})
    return request_state_stats(state, basic_metrics().BasicGenerationMetric(list(names)), spec, service)


def _scores(state, names, num_outputs=1):
    wanted = set(names) | {f"{n}@{num_outputs}" for n in names}
    return {s.name["name"]: s.sum for s in reference_stats(state, names, num_outputs) if s.name["name"] in wanted}
def test_score_is_the_best_correct_reference():
    refs = [("Paris", True), ("London", False), ("paris france", True)]
    assert _scores(_state(refs, [(" London", 0.0)]), ("exact_match",)) == {"exact_match": 0}
    assert _scores(_state(refs, [("Paris France", 0.0)]), ("exact_match", "quasi_exact_match")) == \
        {"exact_match": 0, "quasi_exact_match": 1}


def test_top_prediction_is_the_likeliest_and_at_k_takes_every_prediction():
    state = _state([("111", True)], [("112", -0.1), ("111", -2.0), ("110", -3.0)])
    assert _scores(state, ("exact_match",), num_outputs=3) == {"exact_match": 0, "exact_match@3": 1}
    state = _state([("111", True)], [("112", -2.0), (" 111\n", -0.1)])
    assert _scores(state, ("exact_match",)) == {"exact_match": 1}


def test_multiple_choice_letters_map_to_choices():
    refs = [("22", False), ("81", True)]
    mapping = {"A": "22", "B": "81"}
    assert _scores(_state(refs, [(" B", 0.0)], mapping), ("exact_match",)) == {"exact_match": 1}
    assert _scores(_state(refs, [(" A", 0.0)], mapping), ("exact_match",)) == {"exact_match": 0}
    assert _scores(_state(refs, [(" Z", 0.0)], mapping), ("exact_match", "f1_score")) == \
        {"exact_match": 0, "f1_score": 0}


def test_max_prob_is_the_likeliest_completions_probability():
    stats = reference_stats(_state([("111", True)], [("112", -2.0), ("111", -0.5)]), ("exact_match",), 2)
    assert math.isclose(next(s.sum for s in stats if s.name["name"] == "max_prob"), math.exp(-0.5))


def test_a_failed_request_scores_zero():
    state = _state([("111", True)], [])
    assert _scores(state, ("exact_match", "quasi_prefix_exact_match", "f1_score")) == \
        {"exact_match": 0, "quasi_prefix_exact_match": 0, "f1_score": 0}


def test_stat_is_written_with_helms_fields():
    s = Stat({"name": "exact_match", "split": "test"}).add(1).add(0).add(1).add(True)
    d = stat_json(s)
    assert d["count"] == 4 and d["sum"] == 3 and d["sum_squared"] == 3 and d["min"] == 0 and d["max"] == 1
    assert d["mean"] == 0.75 and math.isclose(d["variance"], 0.1875) and math.isclose(d["stddev"], 0.1875 ** 0.5)
    assert stat_json(Stat(**d)) == d
    assert stat_json(Stat({"name": "x"})) == {"name": {"name": "x"}, "count": 0, "sum": 0.0, "sum_squared": 0.0}
