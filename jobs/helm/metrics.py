"""HELM's metrics of one request state, computed by HELM's own `BasicGenerationMetric.evaluate_generation`: the
basic stats (`num_references`, `num_train_trials`, HELM's efficiency stats with the prompt's tokens counted by the
checkpoint's tokenizer, `finish_reason_*`, `num_train_instances`, `prompt_truncated`), the reference metrics named
by the run (HELM's `exact_match`, `quasi_exact_match`, `quasi_leave_articles_exact_match`, `prefix_exact_match`,
`quasi_prefix_exact_match`, `f1_score`; each with `@k` when the adapter asks for several outputs) with `max_prob`,
and `logprob`, `num_perplexity_tokens`, `num_bytes` of the first completion.

Inputs HELM's code cannot take are given as HELM means them: a result without completions is HELM's failed
request (one empty completion), a completion without text, log-probability or tokens has empty ones, and a multiple-choice answer that is no choice's letter is the empty prediction
(HELM maps it to None, which its `f1_score` cannot read). Stats are HELM's `Stat`, named by a dict (HELM's
MetricName as written to the JSON files) so that a perturbation keeps every field its run wrote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging

from helm.benchmark.metrics.statistic import Stat

from jobs.helm.helm_objects import to_json

log = logging.getLogger(__name__)

METRICS = ("exact_match", "quasi_exact_match", "quasi_leave_articles_exact_match", "prefix_exact_match",
           "quasi_prefix_exact_match", "f1_score")
EXACT_MATCH_METRICS = ("exact_match", "quasi_exact_match", "prefix_exact_match", "quasi_prefix_exact_match")
CONTEXT_FIELDS = ("split", "sub_split", "perturbation")
EMPTY_COMPLETION = {"text": "", "logprob": 0.0, "tokens": []}


def basic_metrics():
    """HELM's basic_metrics module. Importing it makes nltk fetch its `punkt_tab` data, which only HELM's BLEU and
    ROUGE use: nltk's printed failure, where offline, is logged instead."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        from helm.benchmark.metrics import basic_metrics
    if out.getvalue().strip():
        log.debug("importing HELM's metrics: %s", " ".join(out.getvalue().split()))
    return basic_metrics


class _ChoiceOrEmpty(dict):
    """An output mapping whose unknown letters map to the empty prediction."""

    def get(self, key, default=""):
        return super().get(key, default)


def helm_request_state(state: dict):
    """HELM's RequestState of a request state with its result, as HELM's metrics can read it."""
    from jobs.helm.helm_objects import to_request_state

    result = {"success": False, "embedding": [], "completions": [], "cached": False, **(state.get("result") or {})}
    result["completions"] = [{**c, "text": c.get("text") or "", "logprob": c.get("logprob") or 0.0,
                              "tokens": c.get("tokens") or []} for c in result["completions"]] or [EMPTY_COMPLETION]
    helm = to_request_state({**state, "result": result})
    if helm.output_mapping is not None:
        helm = dataclasses.replace(helm, output_mapping=_ChoiceOrEmpty(helm.output_mapping))
    return helm


def reference_stats(states: list[dict], adapter_spec, service) -> list[Stat]:
    """HELM's stats of one instance of a `multiple_choice_separate_*` run, by HELM's `BasicReferenceMetric`: each
    choice scored from its request's echoed tokens (the mean log-probability of the choice's tokens, or with the
    calibrated method its log-probability less that of its calibration request), the best one chosen
    (`predicted_index`, `exact_match`, `max_prob`) and the request states' basic stats summed; named in the
    instance's context."""
    metric = basic_metrics().BasicReferenceMetric()
    stats = metric.evaluate_references(adapter_spec, [helm_request_state(s) for s in states], service, "")
    return [with_context(Stat({"name": s.name.name}).merge(s), states[0]["instance"]) for s in stats]


def request_state_stats(state: dict, metric, adapter_spec, service) -> list[Stat]:
    """HELM's stats of one request state (`metric`: HELM's BasicGenerationMetric of the run's metric names), each
    named in the instance's context as HELM's `add_context` names it."""
    with _quiet("absl"):  # HELM builds its ROUGE scorers for every request state; each logs its tokenizer
        stats = metric.evaluate_generation(adapter_spec, helm_request_state(state), service, "")
    return [with_context(Stat({"name": s.name.name}).merge(s), state["instance"]) for s in stats]


@contextlib.contextmanager
def _quiet(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def with_context(stat: Stat, instance: dict) -> Stat:
    """The stat named in the instance's context (None fields left out)."""
    context = {k: instance[k] for k in CONTEXT_FIELDS if instance.get(k) is not None}
    return Stat({**stat.name, **context}).merge(stat)


def stat_json(stat: Stat) -> dict:
    """As HELM writes it in stats.json and per_instance_stats.json."""
    return to_json(stat)
