"""The paper's scores (fm_data_tasks compute_metrics) on hand-made answers: exact lower-cased match, any
answer but the gold on a "no" row a false positive, P and R over max(1, count), F1 over max(1, P + R)."""

from __future__ import annotations

import math

import pytest

from jobs.wrangle.paper_metrics import compute_metrics, is_right, trial_summary


def test_matching_counts_only_an_exact_lowercased_answer():
    golds = ["Yes\n", "No\n", "Yes\n", "No\n", "No\n", "Yes\n"]
    preds = ["yes", " Yes ", "Yes.", "", "no", "YES"]
    m = compute_metrics(preds, golds, "entity_matching")
    # "Yes." is not "yes" (false negative); "Yes" and "" on "no" rows are false positives
    assert (m["tp"], m["fp"], m["fn"], m["tn"], m["crc"]) == (2, 2, 1, 1, 3)
    assert m["prec"] == pytest.approx(0.5) and m["rec"] == pytest.approx(2 / 3) and m["acc"] == pytest.approx(0.5)
    assert m["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))


def test_f1_is_divided_by_max_1_p_plus_r():
    m = compute_metrics(["yes", "no", "yes", "yes"], ["Yes\n", "Yes\n", "No\n", "No\n"], "entity_matching")
    assert (m["tp"], m["fn"], m["fp"]) == (1, 1, 2)
    p, r = 1 / 3, 1 / 2
    assert m["prec"] == pytest.approx(p) and m["rec"] == pytest.approx(r)
    assert m["f1"] == pytest.approx(2 * p * r)  # P + R = 5/6 < 1: the paper's F1 is 1/3, not 0.4


def test_no_positive_answers_gives_zero_not_an_error():
    m = compute_metrics(["", "no"], ["No\n", "No\n"], "entity_matching")
    assert (m["prec"], m["rec"], m["f1"], m["acc"]) == (0.0, 0.0, 0.0, 0.5) and m["fp"] == 1


def test_imputation_is_exact_after_strip_and_lower():
    m = compute_metrics(["New York", " denver", "new york city", ""], ["new york\n", "Denver\n", "new york\n",
                                                                      "boaz\n"], "data_imputation")
    assert m["acc"] == 0.5 and m["tp"] == m["fp"] == 0


@pytest.mark.parametrize(("pred", "gold", "task", "right"), [
    ("Yes, it is", "Yes\n", "error_detection_spelling", True),  # starts with the gold
    ("yes", "No\n", "error_detection_spelling", False),
    ("No.", "No\n", "schema_matching", True),
    ("No.", "No\n", "entity_matching", False),
    ("some text\n\nthe answer is yes", "Yes\n", "error_detection", True),  # last part ends with the gold
    ("yes\n\nno", "Yes\n", "error_detection", False),
])
def test_rules_by_task(pred, gold, task, right):
    assert is_right(pred, gold, task) is right


def test_trials_mean_and_population_std():
    trials = [{"prec": v, "rec": v, "f1": v, "acc": v} for v in (0.5, 1.0, 0.0)]
    s = trial_summary(trials)
    assert s["f1"] == [0.5, 1.0, 0.0] and s["f1_avg"] == pytest.approx(0.5)
    assert s["acc_std"] == pytest.approx(math.sqrt(1 / 6))  # numpy's np.std (ddof 0), as the paper reports
