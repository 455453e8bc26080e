"""Metrics of the data-wrangling tasks (the paper's own counting, for `--data-dir`: jobs/wrangle/paper_metrics.py).

Matching and error detection are binary (the positive class is a match, an error):

- precision P = TP / (TP + FP), 0 when nothing is predicted positive;
- recall R = TP / (TP + FN), 0 when no gold label is positive;
- F1 = 2PR / (P + R), 0 when P + R = 0 (fm_data_tasks divides by max(1, P + R), which understates F1
  whenever P + R < 1; this does not);
- accuracy = (TP + TN) / n. An unparsed answer is never right: on a positive row it counts as a false
  negative, on a negative row it is neither a true negative nor a false positive.

Imputation: accuracy = exact matches after `normalize` / n.
Each also reports the chance level to beat: `majority_accuracy`, the accuracy of always giving the most frequent
gold answer (0.5 on balanced Yes/No data), and for the binary tasks `always_positive_f1`, the F1 of answering
positive every time (2p / (1 + p) for a positive rate p: 0.667 on balanced data).
"""

from __future__ import annotations

from collections import Counter

from jobs.wrangle.tasks import normalize


def f1(precision: float, recall: float, paper_denominator: bool = False) -> float:
    """The harmonic mean 2PR / (P + R); 0 when P + R = 0. `paper_denominator`: 2PR / max(1, P + R), the
    figure fm_data_tasks reports (understated whenever P + R < 1)."""
    total = max(1.0, precision + recall) if paper_denominator else precision + recall
    return 0.0 if total == 0 else 2 * precision * recall / total


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


def binary_metrics(golds: list[bool], preds: list[bool | None]) -> dict:
    if len(golds) != len(preds):
        raise ValueError(f"{len(golds)} gold labels but {len(preds)} predictions")
    tp = sum(g and p is True for g, p in zip(golds, preds))
    fp = sum(not g and p is True for g, p in zip(golds, preds))
    fn = sum(g and p is not True for g, p in zip(golds, preds))
    tn = sum(not g and p is False for g, p in zip(golds, preds))
    n, positives = len(golds), sum(golds)
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    return {
        "n": n, "accuracy": _ratio(tp + tn, n), "precision": precision, "recall": recall,
        "f1": f1(precision, recall), "tp": tp, "fp": fp, "fn": fn, "tn": tn,
        "unparsed": sum(p is None for p in preds), "positives": positives,
        "majority_accuracy": _ratio(max(positives, n - positives), n),
        "always_positive_f1": f1(_ratio(positives, n), 1.0 if positives else 0.0),
    }


def imputation_metrics(golds: list[str], preds: list[str | None]) -> dict:
    if len(golds) != len(preds):
        raise ValueError(f"{len(golds)} gold values but {len(preds)} predictions")
    wanted = [normalize(g) for g in golds]
    correct = sum(p is not None and normalize(p) == g for g, p in zip(wanted, preds))
    most_common = Counter(wanted).most_common(1)[0][1] if wanted else 0
    n = len(golds)
    return {"n": n, "accuracy": _ratio(correct, n), "correct": correct,
            "unparsed": sum(p is None for p in preds), "majority_accuracy": _ratio(most_common, n)}


def is_correct(gold: bool | str, pred: bool | str | None) -> bool:
    if pred is None:
        return False
    if isinstance(gold, bool):
        return pred is gold
    return normalize(pred) == normalize(gold)
