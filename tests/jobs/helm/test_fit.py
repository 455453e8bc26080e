"""HELM's choice of evaluation instances and its prompt fitting, checked against crfm-helm's own functions
(`downsample_eval_instances`, `InContextLearningAdapter._make_prompt_fit`) on constructed cases."""

import pytest

from jobs.common import demo_model_dir
from jobs.helm.adapter import adapt, example_block, prompt_text
from jobs.helm.fit import PromptWindow, fit_prompt, load_window
from jobs.helm.scenarios import downsample_eval, load_instances
from jobs.helm.spec import AdapterSpec

QA = AdapterSpec(input_prefix="Q: ", input_suffix=" ", output_prefix="A: ", instance_prefix="", max_train_instances=5,
                 num_outputs=1, temperature=0, max_tokens=4, stop_sequences=("\n",), instructions="Answer.")


@pytest.fixture(scope="module")
def window():
    return load_window(demo_model_dir())


@pytest.mark.parametrize("population, size", [(7, 1), (7, 6), (50, 3), (50, 49), (132, 10), (132, 40)])
def test_eval_instances_are_helms_draw(population, size):
    from helm.benchmark.runner import downsample_eval_instances
    from helm.benchmark.scenarios.scenario import Input, Instance

    ours = [{"id": f"id{i}", "split": "test" if i % 3 else "valid", "input": {"text": str(i)}, "references": []}
            for i in range(population)] + [{"id": "t", "split": "train", "input": {"text": "t"}, "references": []}]
    theirs = [Instance(input=Input(text=o["input"]["text"]), references=[], split=o["split"], id=o["id"]) for o in ours]
    expected = [i.id for i in downsample_eval_instances(theirs, size, ["valid", "test"])]
    assert [i["id"] for i in downsample_eval(ours, size, ("valid", "test"))] == expected


def _helm_fit(window, adapter, shots, instance):
    """HELM's own `_make_prompt_fit` on our blocks, with its window service answering from `window`."""
    from helm.benchmark.adaptation.adapters.generation_adapter import GenerationAdapter
    from helm.benchmark.adaptation.prompt import Prompt

    class Window:  # HELM's window-service methods that _make_prompt_fit calls
        def fits_within_context_window(self, text, expected_completion_token_length=0):
            return window.fits(text, expected_completion_token_length)

        def truncate_from_right(self, text, expected_completion_token_length=0):
            return window.truncate_from_right(text, expected_completion_token_length)

    helm = GenerationAdapter.__new__(GenerationAdapter)
    helm.adapter_spec, helm.window_service = adapter, Window()
    prompt = Prompt(global_prefix=adapter.global_prefix, global_suffix=adapter.global_suffix,
                    instance_prefix=adapter.instance_prefix, substitutions=[], instructions_block=adapter.instructions,
                    train_instance_blocks=[example_block(adapter, s, include_output=True) for s in shots],
                    eval_instance_block=example_block(adapter, instance, include_output=False))
    fitted = helm._make_prompt_fit(prompt)
    return fitted.text, fitted.num_train_instances, fitted.truncated


@pytest.mark.parametrize("context", [200, 80, 60, 40, 12])
def test_fitting_keeps_the_longest_prefix_of_examples_that_fits_as_helm(window, context):
    small = PromptWindow(window.tokenizer, context)
    instances = load_instances("facts")
    shots, instance = [i for i in instances if i["split"] == "train"][:5], instances[-1]
    prompt, kept, truncated = fit_prompt(small, QA.max_tokens, lambda ex: prompt_text(QA, ex, instance), shots)
    assert (prompt, kept, truncated) == _helm_fit(small, QA, shots, instance)
    assert small.fits(prompt, QA.max_tokens)
    if 0 < kept < len(shots):
        assert not small.fits(prompt_text(QA, shots[:kept + 1], instance), QA.max_tokens)
    if truncated:  # no example fits: the prompt is cut from the right to the longest start that fits
        full = prompt_text(QA, [], instance)
        assert kept == 0 and full.startswith(prompt) and not small.fits(full[:len(prompt) + 1], QA.max_tokens)


def test_fitted_states_record_examples_kept_and_truncation(window):
    instances = load_instances("addition")[:25]
    states = adapt(QA, instances, "m", PromptWindow(window.tokenizer, 60))
    assert all(s["num_train_instances"] < 5 for s in states)
    assert all(PromptWindow(window.tokenizer, 60).fits(s["request"]["prompt"], 4) for s in states)
    roomy = adapt(QA, instances, "m", window)
    assert all(s["num_train_instances"] == 5 and not s["prompt_truncated"] for s in roomy)
    assert [s["request"]["prompt"] for s in roomy] == [s["request"]["prompt"] for s in adapt(QA, instances, "m")]


def test_no_room_for_the_answer_leaves_the_prompt_to_the_engine(window):
    tight = PromptWindow(window.tokenizer, 4)
    assert tight.truncate_from_right("Q: What is 1 plus 2? A:", 4) == "Q: What is 1 plus 2? A:"
