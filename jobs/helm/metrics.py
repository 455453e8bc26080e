"""HELM's reference metrics and statistics, with HELM's definitions and names.

Each metric compares one gold text with one prediction and gives 0..1; an instance's score is the maximum over
its correct references (`name`, on the prediction with the highest log-probability) and, when the adapter asks
for several outputs, over every prediction too (`name@k`). Predictions are the completions stripped of
surrounding whitespace and, for multiple choice, mapped from the letter to the choice's text (a letter that is
no choice maps to the empty prediction). An empty prediction scores 0.

`Stat` is HELM's running statistic (count, sum, sum of squares, min, max, mean, variance, stddev), and the
aggregation is HELM's `Metric.evaluate` (jobs/helm/evaluate.py).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable
from dataclasses import dataclass

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_text(text: str, remove_articles: bool = True) -> str:
    """HELM's (QuAC's) normalization: lowercase, drop ASCII punctuation, then the words a/an/the, then collapse
    whitespace to single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    if remove_articles:
        text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(gold: str, pred: str) -> float:
    if not pred:
        return 0.0
    return 1.0 if gold.strip() == pred.strip() else 0.0


def quasi_exact_match(gold: str, pred: str) -> float:
    if not pred:
        return 0.0
    return 1.0 if normalize_text(gold) == normalize_text(pred) else 0.0


def quasi_leave_articles_exact_match(gold: str, pred: str) -> float:
    if not pred:
        return 0.0
    return 1.0 if normalize_text(gold, False) == normalize_text(pred, False) else 0.0


def prefix_exact_match(gold: str, pred: str) -> float:
    """The prediction starts with the gold answer (a model that keeps talking after the answer still scores)."""
    if not pred:
        return 0.0
    return 1.0 if pred.strip().startswith(gold.strip()) else 0.0


def quasi_prefix_exact_match(gold: str, pred: str) -> float:
    if not pred:
        return 0.0
    return 1.0 if normalize_text(pred).startswith(normalize_text(gold)) else 0.0


def f1_score(gold: str, pred: str) -> float:
    """F1 of the sets of normalized words: 2PR / (P + R); 0 when either set is empty or they share no word."""
    gold_words, pred_words = set(normalize_text(gold).split()), set(normalize_text(pred).split())
    common = len(gold_words & pred_words)
    if not gold_words or not pred_words or common == 0:
        return 0.0
    precision, recall = common / len(pred_words), common / len(gold_words)
    return 2 * precision * recall / (precision + recall)


METRICS: dict[str, Callable[[str, str], float]] = {
    "exact_match": exact_match,
    "quasi_exact_match": quasi_exact_match,
    "quasi_leave_articles_exact_match": quasi_leave_articles_exact_match,
    "prefix_exact_match": prefix_exact_match,
    "quasi_prefix_exact_match": quasi_prefix_exact_match,
    "f1_score": f1_score,
}
EXACT_MATCH_METRICS = ("exact_match", "quasi_exact_match", "prefix_exact_match", "quasi_prefix_exact_match")


@dataclass
class Stat:
    """HELM's `Stat`: a running aggregate of the values added to it. `name` is HELM's MetricName as a dict
    (`name`, and `split` when the value belongs to one)."""

    name: dict
    count: int = 0
    sum: float = 0.0
    sum_squared: float = 0.0
    min: float | None = None
    max: float | None = None

    def add(self, value: float | None) -> Stat:
        if value is None:  # HELM skips missing values (a count of 0 says none was known)
            return self
        value = float(value)
        self.count += 1
        self.sum += value
        self.sum_squared += value * value
        self.min = value if self.min is None else min(self.min, value)
        self.max = value if self.max is None else max(self.max, value)
        return self

    def merge(self, other: Stat) -> Stat:
        self.count += other.count
        self.sum += other.sum
        self.sum_squared += other.sum_squared
        for bound, pick in (("min", min), ("max", max)):
            theirs, ours = getattr(other, bound), getattr(self, bound)
            if theirs is not None:
                setattr(self, bound, theirs if ours is None else pick(ours, theirs))
        return self

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def to_json(self) -> dict:
        """As HELM writes it in stats.json and per_instance_stats.json (no null fields)."""
        out = {"name": dict(self.name), "count": self.count, "sum": self.sum, "sum_squared": self.sum_squared}
        if self.count:
            variance = max(0.0, self.sum_squared / self.count - self.mean**2)
            out.update(min=self.min, max=self.max, mean=self.mean, variance=variance, stddev=math.sqrt(variance))
        return out

    @classmethod
    def from_json(cls, d: dict) -> Stat:
        return cls(dict(d["name"]), d["count"], d["sum"], d["sum_squared"], d.get("min"), d.get("max"))


def predictions(state: dict) -> list[str]:
    """The completions' texts, likeliest first, stripped, mapped through the output mapping (multiple choice);
    a request that returned nothing counts as one empty prediction."""
    result = state.get("result") or {}
    completions = sorted(result.get("completions") or [], key=lambda c: -(c.get("logprob") or 0.0))
    preds = [(c.get("text") or "").strip() for c in completions] or [""]
    mapping = state.get("output_mapping")
    if mapping is not None:
        preds = [mapping.get(p) or "" for p in preds]
    return preds


def correct_texts(instance: dict) -> list[str]:
    return [ref["output"]["text"] for ref in instance.get("references", []) if "correct" in ref.get("tags", [])]


def reference_stats(state: dict, names: tuple[str, ...], num_outputs: int) -> list[Stat]:
    """Each metric's score for one request state: the best correct reference against the top prediction and,
    when `num_outputs` != 1, `name@k` against every prediction; then `max_prob`, the probability of the
    likeliest completion. Names carry no context yet (see `evaluate.add_context`)."""
    golds, preds = correct_texts(state["instance"]), predictions(state)
    stats = []
    for name in names:
        score = METRICS[name]
        stats.append(Stat({"name": name}).add(max(score(g, preds[0]) for g in golds)))
        if num_outputs != 1:
            best = max(score(g, p) for g in golds for p in preds)
            stats.append(Stat({"name": f"{name}@{num_outputs}"}).add(best))
    completions = (state.get("result") or {}).get("completions") or []
    if completions:
        stats.append(Stat({"name": "max_prob"}).add(math.exp(max(c.get("logprob") or 0.0 for c in completions))))
    return stats
