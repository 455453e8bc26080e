"""HELM's scenario_state.json as input: the request states of a real HELM run, re-run with our engine.

A scenario_state.json holds `adapter_spec` and `request_states`; each request state has `instance` (`input.text`,
`references[].output.text` and `tags`, `split`, `id`), `train_trial_index`, optional `output_mapping` and
`reference_index`, `request` (`prompt`, `temperature`, `max_tokens`, `stop_sequences`, `num_completions`,
`top_p`, ...) and `result` (`success`, `completions[].text` / `logprob` / `tokens`, ...). Everything is kept as
read, so that writing it back gives the same JSON; re-running replaces `result` and names our model in the
requests. HELM's `generation` and `multiple_choice_joint` runs (requests that generate from a prompt) and its
scoring runs, `language_modeling` and `multiple_choice_separate_*` (requests that score their prompt,
jobs/helm/echo_requests.py) can be re-run; chat `messages` requests cannot.
"""

from __future__ import annotations

import json
from pathlib import Path

from jobs.helm.echo_requests import SCORING_METHODS, scoring_problem
from jobs.helm.errors import SpecError
from jobs.helm.helm_objects import to_adapter_spec, to_request_state
from jobs.helm.metrics import EXACT_MATCH_METRICS, METRICS

RERUNNABLE_METHODS = ("generation", "multiple_choice_joint", *SCORING_METHODS)


def read_scenario_state(path: Path) -> dict:
    """The scenario state as read, after checking every field a re-run and the metrics need."""
    try:
        state = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read scenario_state {path} ({type(e).__name__}: {str(e).splitlines()[0]}); "
                        "expected the scenario_state.json of a HELM run folder") from e
    if not isinstance(state, dict) or not isinstance(state.get("request_states"), list):
        raise SpecError(f"{path}: no request_states list; expected the scenario_state.json of a HELM run folder")
    method = (state.get("adapter_spec") or {}).get("method", "generation")
    if method not in RERUNNABLE_METHODS:
        raise SpecError(f"{path}: adapter_spec.method {method!r} cannot be re-run here; supported: "
                        f"{', '.join(RERUNNABLE_METHODS)}")
    _as_helm(lambda: to_adapter_spec(state.get("adapter_spec") or {}), f"{path}: adapter_spec")
    for i, rs in enumerate(state["request_states"]):
        _check_request_state(rs, f"{path}: request_states[{i}]", method)
        _as_helm(lambda rs=rs: to_request_state({k: v for k, v in rs.items() if k != "result"}),
                 f"{path}: request_states[{i}]")
    return state


def _as_helm(convert, where: str) -> None:
    """HELM's metrics read the states as HELM's dataclasses: a field of the wrong type fails here, before the run."""
    import dacite

    try:
        convert()
    except (dacite.DaciteError, TypeError, ValueError) as e:
        raise SpecError(f"{where} is not HELM's ({' '.join(str(e).split())}); expected the scenario_state.json of a "
                        "HELM run folder") from e


def _check_request_state(rs, where: str, method: str = "generation") -> None:
    if not isinstance(rs, dict):
        raise SpecError(f"{where} is not an object")
    instance, request = rs.get("instance"), rs.get("request")
    if not isinstance(instance, dict) or not isinstance((instance.get("input") or {}).get("text"), str):
        raise SpecError(f"{where}: missing instance.input.text")
    refs = instance.get("references")
    if not isinstance(refs, list) or not all(isinstance((r or {}).get("output", {}).get("text"), str) for r in refs):
        raise SpecError(f"{where}: instance.references must be a list of {{output: {{text}}, tags}}")
    if method != "language_modeling" and not any("correct" in (r.get("tags") or []) for r in refs):
        raise SpecError(f"{where}: instance {instance.get('id')!r} has no reference tagged 'correct'")
    if rs.get("reference_index") is not None and not method.startswith("multiple_choice_separate"):
        raise SpecError(f"{where}: has a reference_index (a per-reference request) in a {method} run")
    if not isinstance(request, dict) or not isinstance(request.get("prompt"), str) or not request["prompt"]:
        raise SpecError(f"{where}: missing request.prompt (chat `messages` requests are not supported)")
    scoring = method in SCORING_METHODS
    if scoring != bool(request.get("echo_prompt")) or scoring_problem(request):
        raise SpecError(f"{where}: " + (scoring_problem(request) or f"a {method} run's requests "
                                        f"{'score' if scoring else 'do not echo'} their prompt (echo_prompt "
                                        f"{str(scoring).lower()}, max_tokens {0 if scoring else '>= 1'})"))
    for name, low in (("max_tokens", 0 if scoring else 1), ("num_completions", 1)):
        value = request.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpecError(f"{where}: request.{name}={value!r} is invalid; expected an integer >= {low}")


def source_metrics(path: Path) -> tuple[str, ...]:
    """The metrics the HELM run asked for (run_spec.json beside the scenario state) that flexbatch computes;
    HELM's exact-match set when there is no run_spec.json or it names none of them."""
    specs = source_file(path, "run_spec.json").get("metric_specs")
    specs = specs if isinstance(specs, list) else []
    names = [n for s in specs if isinstance(s, dict) for n in ((s.get("args") or {}).get("names") or [])]
    known = tuple(dict.fromkeys(n for n in names if isinstance(n, str) and n in METRICS))
    return known or EXACT_MATCH_METRICS


def source_file(path: Path, name: str) -> dict:
    """A JSON object of the HELM run folder the scenario state comes from (run_spec.json, scenario.json), or {}
    when there is none."""
    try:
        data = json.loads((Path(path).parent / name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def renamed_model(state: dict, model: str) -> dict:
    """The scenario state with `model` named in its adapter spec and requests, and no results yet."""
    adapter = {**state.get("adapter_spec", {}), "model": model, "model_deployment": model}
    request_states = []
    for rs in state["request_states"]:
        request = {**rs["request"], "model": model}
        if "model_deployment" in request:
            request["model_deployment"] = model
        request_states.append({k: v for k, v in {**rs, "request": request}.items() if k != "result"})
    return {**state, "adapter_spec": adapter, "request_states": request_states}


def downsample_states(state: dict, max_eval_instances: int | None) -> dict:
    """At most `max_eval_instances` instances' request states, drawn as `downsample_eval` draws instances."""
    from jobs.helm.scenarios import downsample_eval

    if max_eval_instances is None:
        return state
    ids = list(dict.fromkeys(str(rs["instance"].get("id")) for rs in state["request_states"]))
    pseudo = [{"id": i, "split": "test", "input": {"text": ""}, "references": []} for i in ids]
    kept = {inst["id"] for inst in downsample_eval(pseudo, max_eval_instances, ("test",))}
    return {**state, "request_states": [rs for rs in state["request_states"]
                                        if str(rs["instance"].get("id")) in kept]}
