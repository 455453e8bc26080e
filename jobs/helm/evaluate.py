"""HELM's basic statistics of a run and their aggregation: what `BasicGenerationMetric` and
`InstancesPerSplitMetric` write to per_instance_stats.json and stats.json.

Per request state (HELM's `evaluate_generation`): `num_references`, `num_train_trials`; the efficiency stats
`num_prompt_tokens`, `num_completion_tokens`, `num_output_tokens`, and from the result's timing
`inference_runtime`, `batch_size`, `inference_denoised_runtime`; `finish_reason_{length,stop,endoftext,
unknown}` of the first completion; `num_train_instances`, `prompt_truncated`; the reference metrics and
`max_prob`; and `logprob`, `num_perplexity_tokens`, `num_bytes` of the first completion's tokens. Each stat
name carries the instance's context (`split`, `sub_split`, `perturbation`).

Aggregation (HELM's `Metric.evaluate`): per train trial, the instances' stats are merged; `perplexity`,
`bits_per_byte` and `logprob_per_byte` are derived per context; each trial then contributes its means.
`num_instances` is the number of instances per context, averaged over trials.

`training_co2_cost` and `training_energy_cost` have no value (count 0), as HELM writes them for a model its
tables do not know. Not written: `inference_idealized_runtime` (HELM's table of known models), calibration
(`ece_*`, `platt_*`, `selective_*`) and the worst-case robustness/fairness stats.
"""

from __future__ import annotations

import math
from collections import defaultdict

from jobs.helm.metrics import Stat, reference_stats

FINISH_REASONS = ("length", "stop", "endoftext", "unknown")
CONTEXT_FIELDS = ("split", "sub_split", "perturbation")


def add_context(stat: Stat, instance: dict) -> Stat:
    """The stat named in the instance's context, as HELM's `add_context` (None fields left out)."""
    context = {k: instance[k] for k in CONTEXT_FIELDS if instance.get(k) is not None}
    return Stat({**stat.name, **context}, stat.count, stat.sum, stat.sum_squared, stat.min, stat.max)


def num_bytes(tokens: list[dict]) -> int:
    """UTF-8 bytes of the tokens' texts; a `bytes:\\xe2\\x80` token counts its escaped bytes (as HELM)."""
    total = 0
    for token in tokens:
        text = token.get("text") or ""
        total += text.count("\\x") if text.startswith("bytes:") else len(text.encode("utf-8"))
    return total


def efficiency_stats(state: dict, usage: dict) -> list[Stat]:
    """Token counts and runtimes. With a batch's size and time, the runtime is the batch's and the denoised
    runtime its share per request (HELM's rule for offline batch inference)."""
    result = state.get("result") or {}
    completion_tokens = sum(len(c.get("tokens") or []) for c in result.get("completions") or [])
    stats = [Stat({"name": "num_prompt_tokens"}).add(usage.get("prompt_tokens", 0)),
             Stat({"name": "num_completion_tokens"}).add(completion_tokens),
             Stat({"name": "num_output_tokens"}).add(completion_tokens),
             # HELM looks these up in its tables of known models; none of ours is there: no value, count 0
             Stat({"name": "training_co2_cost"}), Stat({"name": "training_energy_cost"})]
    runtime, batch_size = result.get("request_time"), 1 if result.get("request_time") is not None else None
    if result.get("batch_request_time") is not None and result.get("batch_size") is not None:
        runtime, batch_size = result["batch_request_time"], result["batch_size"]
    if runtime is not None:
        stats.append(Stat({"name": "inference_runtime"}).add(runtime))
        stats.append(Stat({"name": "batch_size"}).add(batch_size))
        if result.get("batch_size") is not None:
            stats.append(Stat({"name": "inference_denoised_runtime"}).add(runtime / result["batch_size"]))
    return stats


def finish_reason_stats(state: dict) -> list[Stat]:
    first = ((state.get("result") or {}).get("completions") or [{}])[0]
    reason = (first.get("finish_reason") or {}).get("reason")
    reason = reason if reason in FINISH_REASONS else "unknown"
    return [Stat({"name": f"finish_reason_{r}"}).add(int(reason == r)) for r in FINISH_REASONS]


def language_modeling_stats(state: dict) -> list[Stat]:
    """Log-probability, token and byte counts of the first completion's tokens past the conditioning ones."""
    first = ((state.get("result") or {}).get("completions") or [{}])[0]
    tokens = (first.get("tokens") or [])[state.get("num_conditioning_tokens", 0):]
    return [Stat({"name": "logprob"}).add(sum(t.get("logprob") or 0.0 for t in tokens)),
            Stat({"name": "num_perplexity_tokens"}).add(len(tokens)),
            Stat({"name": "num_bytes"}).add(num_bytes(tokens))]


def request_state_stats(state: dict, names: tuple[str, ...], adapter_spec: dict, usage: dict) -> list[Stat]:
    """Every basic stat of one request state, in HELM's order, named in the instance's context."""
    instance = state["instance"]
    stats = [Stat({"name": "num_references"}).add(len(instance.get("references") or [])),
             Stat({"name": "num_train_trials"}).add(adapter_spec.get("num_train_trials", 1)),
             *efficiency_stats(state, usage), *finish_reason_stats(state),
             Stat({"name": "num_train_instances"}).add(state.get("num_train_instances", 0)),
             Stat({"name": "prompt_truncated"}).add(bool(state.get("prompt_truncated", False)))]
    if instance.get("references"):
        stats += reference_stats(state, names, adapter_spec.get("num_outputs", 1))
    stats += language_modeling_stats(state)
    return [add_context(s, instance) for s in stats]


def derived_stats(trial_stats: dict[str, Stat]) -> list[Stat]:
    """`perplexity`, `bits_per_byte` and `logprob_per_byte` of each context's summed tokens and bytes."""
    by_context: dict[str, dict[str, Stat]] = defaultdict(dict)
    for stat in trial_stats.values():
        by_context[_key({k: v for k, v in stat.name.items() if k != "name"})][stat.name["name"]] = stat
    out = []
    for stats in by_context.values():
        logprob, tokens, size = stats.get("logprob"), stats.get("num_perplexity_tokens"), stats.get("num_bytes")
        if logprob is None:
            continue
        context = {k: v for k, v in logprob.name.items() if k != "name"}
        if tokens is not None and tokens.sum > 0:
            out.append(Stat({"name": "perplexity", **context}).add(math.exp(-logprob.sum / tokens.sum)))
        if size is not None and size.sum > 0:
            out.append(Stat({"name": "bits_per_byte", **context}).add(-logprob.sum / size.sum / math.log(2)))
            out.append(Stat({"name": "logprob_per_byte", **context}).add(logprob.sum / size.sum))
    return out


def evaluate(states: list[dict], names: tuple[str, ...], adapter_spec: dict,
             usages: list[dict] | None = None) -> tuple[list[dict], list[dict]]:
    """HELM's per_instance_stats.json and stats.json content for request states that carry their results."""
    usages = usages or [{} for _ in states]
    by_trial: dict[int, list[tuple[dict, list[Stat]]]] = defaultdict(list)
    for state, usage in zip(states, usages):
        by_trial[state.get("train_trial_index", 0)].append(
            (state["instance"], request_state_stats(state, names, adapter_spec, usage)))
    per_instance, overall = [], {}
    for trial in sorted(by_trial):
        trial_stats: dict[str, Stat] = {}
        for instance, stats in by_trial[trial]:
            perturbation = {"perturbation": instance["perturbation"]} if instance.get("perturbation") else {}
            per_instance.append({"instance_id": instance.get("id"), **perturbation, "train_trial_index": trial,
                                 "stats": [s.to_json() for s in stats]})
            for s in stats:
                merge(trial_stats, s)
        for s in derived_stats(trial_stats):
            merge(trial_stats, s)
        for s in trial_stats.values():  # each trial contributes its means, as in HELM
            merge(overall, Stat(dict(s.name)).add(s.mean) if s.count else s)
    for s in instances_per_context(states):
        merge(overall, s)
    return per_instance, [s.to_json() for s in overall.values()]


def instances_per_context(states: list[dict]) -> list[Stat]:
    """HELM's `InstancesPerSplitMetric`: per trial, the distinct instances of each context; their mean."""
    overall: dict[str, Stat] = {}
    for trial in sorted({s.get("train_trial_index", 0) for s in states}):
        seen: dict[str, tuple[dict, set]] = {}
        for state in states:
            if state.get("train_trial_index", 0) == trial:
                named = add_context(Stat({"name": "num_instances"}), state["instance"])
                seen.setdefault(_key(named.name), (named.name, set()))[1].add(state["instance"].get("id"))
        for name, ids in seen.values():
            merge(overall, Stat(dict(name)).add(len(ids)))
    return list(overall.values())


def merge(stats: dict[str, Stat], stat: Stat) -> None:
    key = _key(stat.name)
    if key in stats:
        stats[key].merge(stat)
    else:
        stats[key] = Stat(dict(stat.name)).merge(stat)


def _key(name: dict) -> str:
    return repr(sorted((k, repr(v)) for k, v in name.items()))
