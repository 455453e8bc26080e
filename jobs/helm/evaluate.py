"""The stats of a run, as HELM's `BasicGenerationMetric` and `InstancesPerSplitMetric` write them to
per_instance_stats.json and stats.json: each request state's stats by HELM's own code (jobs/helm/metrics.py),
aggregated as HELM's `Metric.evaluate` aggregates them. The scoring methods take HELM's metric of their run
specs: `language_modeling` HELM's `LanguageModelingMetric` (per request state: one entry per document window, as
HELM writes it), `multiple_choice_separate_*` HELM's `BasicReferenceMetric` (per instance and trial, over its
choices' request states: the chosen choice, `exact_match`, `max_prob`).

Aggregation: per train trial, the instances' stats are merged; HELM's `compute_perplexity_metrics` derives
`perplexity`, `bits_per_byte` and `logprob_per_byte` per context; each trial then contributes its means.
`num_instances` is the number of instances per context, averaged over trials.

The aggregation is flexbatch's own because HELM's `Metric.evaluate` keys stats by HELM's MetricName, whose
perturbation is HELM's base `PerturbationDescription`: a perturbation's own fields (a typo's `prob`) would be
lost from the stats' names. Not written (as before): calibration (`ece_*`, `platt_*`, `selective_*`) and the
worst-case robustness/fairness stats, which `Metric.evaluate` adds.
"""

from __future__ import annotations

from collections import defaultdict

from helm.benchmark.metrics.statistic import Stat

from jobs.helm.helm_objects import to_adapter_spec
from jobs.helm.metrics import basic_metrics, reference_stats, request_state_stats, stat_json, with_context


def evaluate(states: list[dict], names: tuple[str, ...], adapter_spec: dict, model_dir=None) -> tuple[list, list]:
    """HELM's per_instance_stats.json and stats.json content for request states that carry their results; with
    `model_dir`, the prompt tokens are counted by that checkpoint's tokenizer (else HELM's count without one)."""
    from jobs.helm.fit import register_deployment

    spec = to_adapter_spec(adapter_spec)
    service = register_deployment(spec.model_deployment, model_dir)
    by_trial: dict[int, list[tuple[dict, list[Stat]]]] = defaultdict(list)
    if spec.method.startswith("multiple_choice_separate"):
        for (trial, _), group in _by_instance(states).items():
            by_trial[trial].append((group[0]["instance"], reference_stats(group, spec, service)))
    else:
        metric = _generation_metric(spec.method, names)
        for state in states:
            by_trial[state.get("train_trial_index", 0)].append(
                (state["instance"], request_state_stats(state, metric, spec, service)))
    per_instance, overall = [], {}
    for trial in sorted(by_trial):
        trial_stats: dict[str, Stat] = {}
        for instance, stats in by_trial[trial]:
            perturbation = {"perturbation": instance["perturbation"]} if instance.get("perturbation") else {}
            per_instance.append({"instance_id": instance.get("id"), **perturbation, "train_trial_index": trial,
                                 "stats": [stat_json(s) for s in stats]})
            for s in stats:
                merge(trial_stats, s)
        for s in derived_stats(trial_stats):
            merge(trial_stats, s)
        for s in trial_stats.values():  # each trial contributes its means, as in HELM
            merge(overall, s.take_mean())
    for s in instances_per_context(states):
        merge(overall, s)
    return per_instance, [stat_json(s) for s in overall.values()]


def _generation_metric(method: str, names):
    """HELM's metric that scores one request state at a time for this adapter method."""
    if method == "language_modeling":
        from helm.benchmark.metrics.language_modeling_metrics import LanguageModelingMetric

        basic_metrics()  # its import, quiet (the language-modelling metrics import it)
        return LanguageModelingMetric(list(names))
    return basic_metrics().BasicGenerationMetric(list(names))


def _by_instance(states: list[dict]) -> dict[tuple, list[dict]]:
    """The request states of each (train trial, instance), in order (a choice's original and calibration
    requests among them)."""
    groups: dict[tuple, list[dict]] = {}
    for state in states:
        key = (state.get("train_trial_index", 0), _key(state["instance"]))
        groups.setdefault(key, []).append(state)
    return groups


def derived_stats(trial_stats: dict[str, Stat]) -> list[Stat]:
    """HELM's `compute_perplexity_metrics` on each context's stats, named in that context."""
    from helm.benchmark.metrics.metric_name import MetricName

    by_context: dict[str, dict] = defaultdict(dict)
    for stat in trial_stats.values():
        context = {k: v for k, v in stat.name.items() if k != "name"}
        name = MetricName(stat.name["name"])
        by_context[_key(context)][name] = (context, Stat(name).merge(stat))
    out = []
    for stats in by_context.values():
        context = next(iter(stats.values()))[0]
        for s in basic_metrics().compute_perplexity_metrics({k: v for k, (_, v) in stats.items()}):
            out.append(Stat({"name": s.name.name, **context}).merge(s))
    return out


def instances_per_context(states: list[dict]) -> list[Stat]:
    """HELM's `InstancesPerSplitMetric`: per trial, the distinct instances of each context; their mean."""
    overall: dict[str, Stat] = {}
    for trial in sorted({s.get("train_trial_index", 0) for s in states}):
        seen: dict[str, tuple[dict, set]] = {}
        for state in states:
            if state.get("train_trial_index", 0) == trial:
                named = with_context(Stat({"name": "num_instances"}), state["instance"])
                seen.setdefault(_key(named.name), (named.name, set()))[1].add(state["instance"].get("id"))
        for name, ids in seen.values():
            merge(overall, Stat(dict(name)).add(len(ids)))
    return list(overall.values())


def merge(stats: dict[str, Stat], stat: Stat) -> None:
    """HELM's `merge_stat`, for stats named by a dict."""
    key = _key(stat.name)
    if key in stats:
        stats[key].merge(stat)
    else:
        stats[key] = Stat(dict(stat.name)).merge(stat)


def _key(name: dict) -> str:
    return repr(sorted((k, repr(v)) for k, v in name.items()))
