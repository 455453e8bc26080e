"""Scores against hand-worked cases, the zero cases included."""

from __future__ import annotations

import pytest

from jobs.wrangle.metrics import binary_metrics, f1, imputation_metrics, is_correct

T, F = True, False


def test_one_of_each():
    m = binary_metrics([T, T, F, F], [T, F, T, F])
    assert (m["tp"], m["fn"], m["fp"], m["tn"]) == (1, 1, 1, 1)
    assert m["precision"] == m["recall"] == m["f1"] == m["accuracy"] == 0.5
    assert m["majority_accuracy"] == 0.5 and m["n"] == 4 and m["unparsed"] == 0
    assert m["always_positive_f1"] == pytest.approx(2 / 3)  # P = 1/2, R = 1


def test_precision_one_recall_two_thirds():
    m = binary_metrics([T, T, T, F], [T, T, F, F])
    assert m["precision"] == 1.0 and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(0.8)  # 2 * 1 * 2/3 / (5/3)
    assert m["accuracy"] == 0.75 and m["majority_accuracy"] == 0.75


def test_f1_is_the_harmonic_mean_when_precision_plus_recall_is_below_one():
    m = binary_metrics([T, T, T, T, F], [T, F, F, F, T])  # TP 1, FN 3, FP 1
    assert m["precision"] == 0.5 and m["recall"] == 0.25
    assert m["f1"] == pytest.approx(1 / 3)  # 2 * 0.125 / 0.75; dividing by max(1, P + R) would give 0.25
    assert m["accuracy"] == 0.2


def test_one_f1_holds_both_denominators():
    assert f1(0.5, 0.25) == pytest.approx(1 / 3)  # 2PR / (P + R)
    assert f1(0.5, 0.25, paper_denominator=True) == pytest.approx(0.25)  # 2PR / max(1, P + R): fm_data_tasks'
    assert f1(1.0, 0.5, paper_denominator=True) == f1(1.0, 0.5)  # P + R >= 1: the same figure


def test_zero_cases():
    assert f1(0.0, 0.0) == 0.0 and f1(0.0, 0.0, paper_denominator=True) == 0.0
    nothing_predicted = binary_metrics([T, F], [F, F])  # no positive prediction: P = 0 by definition
    assert (nothing_predicted["precision"], nothing_predicted["recall"], nothing_predicted["f1"]) == (0, 0, 0)
    assert nothing_predicted["accuracy"] == 0.5
    no_positives = binary_metrics([F, F], [F, F])  # no positive gold label: R = 0 by definition
    assert (no_positives["precision"], no_positives["recall"], no_positives["f1"]) == (0, 0, 0)
    assert no_positives["accuracy"] == 1.0 and no_positives["always_positive_f1"] == 0.0
    empty = binary_metrics([], [])
    assert empty["accuracy"] == empty["f1"] == empty["majority_accuracy"] == empty["always_positive_f1"] == 0.0


def test_unparsed_answers_are_never_right():
    m = binary_metrics([T, F, T], [None, None, T])
    assert (m["tp"], m["fn"], m["fp"], m["tn"], m["unparsed"]) == (1, 1, 0, 0, 2)
    assert m["accuracy"] == pytest.approx(1 / 3) and m["precision"] == 1.0 and m["recall"] == 0.5


def test_imputation_exact_match_after_normalization():
    m = imputation_metrics(["Yarish", "Vinto", "Hommo", "Yarish"], ["yarish.", None, "Hom mo", "  YARISH "])
    assert (m["correct"], m["unparsed"], m["n"]) == (2, 1, 4)
    assert m["accuracy"] == 0.5 and m["majority_accuracy"] == 0.5  # "yarish" is half of the gold values


def test_lengths_must_agree():
    with pytest.raises(ValueError):
        binary_metrics([T], [])
    with pytest.raises(ValueError):
        imputation_metrics(["a"], [])


def test_is_correct():
    assert is_correct(True, True) and not is_correct(True, None) and not is_correct(False, True)
    assert is_correct("New York", "new york.") and not is_correct("Yarish", None)
