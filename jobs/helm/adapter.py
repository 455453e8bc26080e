"""Adaptation by HELM's own adapters (`GenerationAdapter`, `MultipleChoiceJointAdapter`,
`MultipleChoiceSeparateAdapter`, `MultipleChoiceCalibratedAdapter`, `LanguageModelingAdapter`): instances become
prompts (instructions, few-shot examples from the train split, the evaluated input; for language modelling, the
document cut into windows) and HELM request states, fitted to the model's context by the deployment's window
service (jobs/helm/fit.py).

flexbatch checks the instances first, so that a scenario HELM would adapt into useless requests (nothing to
evaluate, few-shot examples asked of a scenario without any, a multiple-choice question without choices) is a
user error naming the fix.
"""

from __future__ import annotations

import dataclasses
import random

from jobs.helm.errors import SpecError
from jobs.helm.fit import register_deployment, scoring_window
from jobs.helm.helm_objects import kept_random_state, to_instance, to_json
from jobs.helm.run_entries import AdapterSpec
from jobs.helm.scenarios import CORRECT_TAG


def adapt(adapter: AdapterSpec, instances: list[dict], model: str, model_dir=None) -> list[dict]:
    """HELM request states (as JSON), trial by trial: each trial draws its few-shot examples from the train split
    (HELM's `sample_examples`, seeded by the trial index, shared by every evaluated instance) and makes one request
    per evaluated instance. `model` names the deployment where the adapter names none; with `model_dir`, prompts
    are fitted to that checkpoint's context as HELM does (fewer examples, then cut)."""
    from helm.benchmark.adaptation.adapters.adapter_factory import AdapterFactory

    adapter = dataclasses.replace(adapter, model=adapter.model or model,
                                  model_deployment=adapter.model_deployment or model)
    train = [inst for inst in instances if inst["split"] == "train"]
    evals = [inst for inst in instances if inst["split"] in adapter.splits_evaluated]
    _check(adapter, train, evals)
    service = register_deployment(adapter.model_deployment, model_dir)
    helm = AdapterFactory.get_adapter(adapter, service)
    train_instances, eval_instances = [to_instance(i) for i in train], [to_instance(i) for i in evals]
    if adapter.method == "language_modeling":  # HELM's `adapt` of it maps `_generate_requests` over the documents
        helm.window_service = scoring_window(adapter.model_deployment, helm.window_service)
        return [to_json(rs) for inst in eval_instances for rs in helm._generate_requests(inst)]
    states = []
    # HELM's `adapt` does this loop too, but through `parallel_map`, which draws a progress bar and logs every
    # line of the first prompt
    for trial in range(adapter.num_train_trials):
        shots = few_shot_examples(adapter, service, train_instances, trial)
        for inst in eval_instances:
            states.extend(to_json(rs) for rs in helm.generate_requests(inst, trial, shots))
    return states


def few_shot_examples(adapter: AdapterSpec, service, train: list, trial: int) -> list:
    """HELM's `sample_examples` for train trial `trial`. Where the train instances with a correct reference run out
    before `max_train_instances` while others have none, HELM's loop over the labels never ends: then HELM draws
    every labelled instance, and the rest from the unlabelled ones with the same generator, as its docstring says."""
    from helm.benchmark.adaptation.adapters.adapter_factory import AdapterFactory

    labelled = sum(inst.first_correct_reference is not None for inst in train)
    wanted = min(len(train), adapter.max_train_instances)
    short = adapter.sample_train and labelled < wanted
    helm = AdapterFactory.get_adapter(dataclasses.replace(adapter, max_train_instances=labelled) if short else
                                      adapter, service)
    with kept_random_state():
        shots = helm.sample_examples(train, seed=trial, sample_train=adapter.sample_train)
        if short:
            shots += random.sample([inst for inst in train if inst.first_correct_reference is None], wanted - labelled)
    return shots


def _check(adapter: AdapterSpec, train: list[dict], evals: list[dict]) -> None:
    if not evals:
        raise SpecError(f"no instance of split {' or '.join(adapter.splits_evaluated)} to evaluate; check the "
                        "scenario's split column and adapter.eval_splits")
    if adapter.max_train_instances > 0 and not train:
        raise SpecError(f"adapter.max_train_instances={adapter.max_train_instances} but the scenario has no "
                        "instance of split train; add train instances or set max_train_instances: 0")
    for inst in train:
        right = [r for r in inst["references"] if CORRECT_TAG in r["tags"]]
        if right and not right[0]["output"]["text"]:
            raise SpecError(f"train instance {inst['id']!r}: its first correct reference is empty; HELM's few-shot "
                            "sampling stops at an empty answer: give it an answer or remove the instance")
    if adapter.method.startswith("multiple_choice"):
        for inst in evals:
            if len(inst["references"]) < 2:
                raise SpecError(f"instance {inst['id']!r} has {len(inst['references'])} reference; "
                                f"{adapter.method} needs the choices (a choices column, or every option as a "
                                "reference with the right ones tagged correct)")
