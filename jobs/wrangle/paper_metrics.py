"""The paper's metrics (fm_data_tasks `utils.compute_metrics`), counted its way.

Answer and gold are stripped and lower-cased. An answer is right when it equals the gold (entity matching,
imputation), starts with it (schema matching, Hospital's spelling errors), or when the last blank-line
separated part of it ends with it (Adult; the paper's code stops in a debugger there, this is the rule it
states). On a row whose gold is "yes" a right answer is a true positive and any other a false negative; on a
"no" row a right answer is a true negative and any other (an empty one, "yes.", "maybe") a false positive.
precision = TP / max(1, TP + FP), recall = TP / max(1, TP + FN), accuracy = right / n and
F1 = 2PR / max(1, P + R), so F1 is understated whenever P + R < 1: the paper's figure, kept as it is.
"""

from __future__ import annotations

import math

from jobs.wrangle.metrics import f1

PAPER_METRICS = ("prec", "rec", "f1", "acc")


def is_right(pred: str, gold: str, task: str) -> bool:
    pred, gold = pred.strip().lower(), gold.strip().lower()
    if task in ("data_imputation", "entity_matching"):
        return pred == gold
    if task in ("schema_matching", "error_detection_spelling"):
        return pred.startswith(gold)
    if task == "error_detection":
        return pred.split("\n\n")[-1].endswith(gold)
    raise ValueError(f"unknown task {task!r}")


def compute_metrics(preds: list[str], golds: list[str], task: str) -> dict[str, float]:
    """prec, rec, f1, acc of one trial, and its counts."""
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} answers but {len(golds)} gold answers")
    c = {"tp": 0, "tn": 0, "fp": 0, "fn": 0, "crc": 0}
    for pred, gold in zip(preds, golds):
        right = is_right(pred or "", gold, task)
        c["crc"] += right
        label = gold.strip().lower()
        if label == "yes":
            c["tp" if right else "fn"] += 1
        elif label == "no":
            c["tn" if right else "fp"] += 1
    prec = c["tp"] / max(1, c["tp"] + c["fp"])
    rec = c["tp"] / max(1, c["tp"] + c["fn"])
    acc = c["crc"] / len(golds) if golds else 0.0
    return {"prec": prec, "rec": rec, "f1": f1(prec, rec, paper_denominator=True), "acc": acc, **c,
            "n": len(golds)}


def trial_summary(trials: list[dict[str, float]]) -> dict:
    """Per-trial lists and their mean and population standard deviation (numpy's np.average / np.std)."""
    out: dict = {}
    for name in PAPER_METRICS:
        values = [t[name] for t in trials]
        mean = sum(values) / len(values)
        out[name] = values
        out[f"{name}_avg"] = mean
        out[f"{name}_std"] = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return out
