"""Adaptation as HELM does it: instances become prompts (instructions, few-shot examples from the train split,
the evaluated input) and HELM request states, for the `generation` and `multiple_choice_joint` methods.

A prompt is `global_prefix + instance_prefix.join([instructions] + train blocks + [eval block]) + global_suffix`,
where a block is `input_prefix + input + input_suffix + output_prefix + answer + output_suffix`, and the
evaluated block ends with `output_prefix.rstrip()` instead of the answer. For multiple choice, each block lists
the choices after the input (`reference_prefix` with its letter advanced per choice, e.g. "A. ", "B. ") and the
answer is the right choice's letter; the request's `output_mapping` maps letters back to choices.
"""

from __future__ import annotations

from jobs.helm.errors import SpecError
from jobs.helm.fit import PromptWindow, fit_prompt
from jobs.helm.scenarios import CORRECT_TAG, sample_train
from jobs.helm.spec import AdapterSpec

NO_CORRECT_REFERENCE = "n/a"


def reference_prefix(prefix: str, index: int) -> str:
    """`prefix` with its letter (its first non-space character) advanced by `index`: "A. ", 2 -> "C. "."""
    letter = prefix.lstrip()[0]
    return prefix.replace(letter, chr(ord(letter) + index))


def _correct_indices(instance: dict) -> list[int]:
    return [i for i, ref in enumerate(instance["references"]) if CORRECT_TAG in ref["tags"]]


def _answer(adapter: AdapterSpec, instance: dict) -> str:
    """The gold output of a few-shot example: the first correct reference (all of them with multi_label)."""
    right = _correct_indices(instance)
    if not right:
        return NO_CORRECT_REFERENCE
    if adapter.method == "multiple_choice_joint":
        letters = [reference_prefix(adapter.reference_prefix.lstrip()[0], i) for i in right]
    else:
        letters = [instance["references"][i]["output"]["text"] for i in right]
    return ", ".join(letters) if adapter.multi_label else letters[0]


def example_block(adapter: AdapterSpec, instance: dict, include_output: bool) -> str:
    text = adapter.input_prefix + instance["input"]["text"] + adapter.input_suffix
    if adapter.method == "multiple_choice_joint":
        for i, ref in enumerate(instance["references"]):
            text += reference_prefix(adapter.reference_prefix, i) + ref["output"]["text"] + adapter.reference_suffix
    if include_output:
        return text + adapter.output_prefix + _answer(adapter, instance) + adapter.output_suffix
    return text + adapter.output_prefix.rstrip()


def prompt_text(adapter: AdapterSpec, train: list[dict], instance: dict) -> str:
    blocks = ([adapter.instructions] if adapter.instructions else []) + \
        [example_block(adapter, t, include_output=True) for t in train] + \
        [example_block(adapter, instance, include_output=False)]
    return adapter.global_prefix + adapter.instance_prefix.join(blocks) + adapter.global_suffix


def output_mapping(adapter: AdapterSpec, instance: dict) -> dict[str, str]:
    letter = adapter.reference_prefix.lstrip()[0]
    return {reference_prefix(letter, i): ref["output"]["text"] for i, ref in enumerate(instance["references"])}


def helm_request(adapter: AdapterSpec, prompt: str, model: str) -> dict:
    """HELM's Request. Multiple choice asks for one completion (HELM puts num_outputs in top_k_per_token) and
    uses no stop sequences, as HELM does."""
    joint = adapter.method == "multiple_choice_joint"
    request = {
        "model_deployment": adapter.model_deployment or model, "model": adapter.model or model, "embedding": False,
        "prompt": prompt, "temperature": adapter.temperature, "num_completions": 1 if joint else adapter.num_outputs,
        "top_k_per_token": adapter.num_outputs if joint else 1, "max_tokens": adapter.max_tokens,
        "stop_sequences": [] if joint else list(adapter.stop_sequences), "echo_prompt": False, "top_p": 1,
        "presence_penalty": 0, "frequency_penalty": 0,
    }
    if adapter.random is not None:
        request["random"] = adapter.random
    return request


def adapt(adapter: AdapterSpec, instances: list[dict], model: str, window: PromptWindow | None = None) -> list[dict]:
    """HELM request states, trial by trial: each trial draws its few-shot examples from the train split (seeded
    by the trial index, shared by every evaluated instance) and makes one request per evaluated instance. With
    a `window`, each prompt is fitted to the model's context as HELM does (fewer examples, then cut)."""
    train = [inst for inst in instances if inst["split"] == "train"]
    evals = [inst for inst in instances if inst["split"] in adapter.splits_evaluated]
    if not evals:
        raise SpecError(f"no instance of split {' or '.join(adapter.splits_evaluated)} to evaluate; check the "
                        "scenario's split column and adapter.eval_splits")
    if adapter.max_train_instances > 0 and not train:
        raise SpecError(f"adapter.max_train_instances={adapter.max_train_instances} but the scenario has no "
                        "instance of split train; add train instances or set max_train_instances: 0")
    if adapter.method == "multiple_choice_joint":
        for inst in evals:
            if len(inst["references"]) < 2:
                raise SpecError(f"instance {inst['id']!r} has {len(inst['references'])} reference; "
                                "multiple_choice_joint needs the choices (a choices column, or every option as a "
                                "reference with the right ones tagged correct)")
    states = []
    for trial in range(adapter.num_train_trials):
        shots = sample_train(train, adapter.max_train_instances, seed=trial, sample=adapter.sample_train)
        for inst in evals:
            state = {"instance": inst, "train_trial_index": trial}
            if adapter.method == "multiple_choice_joint":
                state["output_mapping"] = output_mapping(adapter, inst)
            if window is None:
                prompt, kept, truncated = prompt_text(adapter, shots, inst), len(shots), False
            else:
                prompt, kept, truncated = fit_prompt(window, adapter.max_tokens,
                                                     lambda examples, i=inst: prompt_text(adapter, examples, i), shots)
            state["request"] = helm_request(adapter, prompt, model)
            state.update(num_train_instances=kept, prompt_truncated=truncated, num_conditioning_tokens=0)
            states.append(state)
    return states
