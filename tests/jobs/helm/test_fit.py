"""HELM's choice of evaluation instances, checked against crfm-helm's `downsample_eval_instances`, and HELM's
prompt fitting (`InContextLearningAdapter._make_prompt_fit`) with the window service of the checkpoint's
tokenizer, on contexts small enough to drop examples and to cut the prompt."""

import dataclasses

import pytest

from engine.spec import load_model_spec
from engine.tokenizer import load_tokenizer
from jobs.common import demo_model_dir
from jobs.helm.adapter import adapt
from jobs.helm.fit import CLIENT, SERVICE, WINDOW, register_deployment
from jobs.helm.run_entries import AdapterSpec
from jobs.helm.scenarios import downsample_eval, load_instances

QA = AdapterSpec(input_prefix="Q: ", input_suffix=" ", output_prefix="A: ", instance_prefix="", max_train_instances=5,
                 num_outputs=1, temperature=0, max_tokens=4, stop_sequences=("\n",), instructions="Answer.")


DEMO = "demo-model"


def window_service(name):
    from helm.benchmark.window_services.window_service_factory import WindowServiceFactory

    return WindowServiceFactory.get_window_service(name, SERVICE)


@pytest.fixture(scope="module")
def window():
    """HELM's window service of the demo model, as `flexbatch helm` registers it."""
    register_deployment(DEMO, demo_model_dir())
    return window_service(DEMO)


@pytest.mark.parametrize("population, size", [(7, 1), (7, 6), (50, 3), (50, 49), (132, 10), (132, 40)])
def test_eval_instances_are_helms_draw(population, size):
    from helm.benchmark.runner import downsample_eval_instances
    from helm.benchmark.scenarios.scenario import Input, Instance

    ours = [{"id": f"id{i}", "split": "test" if i % 3 else "valid", "input": {"text": str(i)}, "references": []}
            for i in range(population)] + [{"id": "t", "split": "train", "input": {"text": "t"}, "references": []}]
    theirs = [Instance(input=Input(text=o["input"]["text"]), references=[], split=o["split"], id=o["id"]) for o in ours]
    expected = [i.id for i in downsample_eval_instances(theirs, size, ["valid", "test"])]
    assert [i["id"] for i in downsample_eval(ours, size, ("valid", "test"))] == expected


def _deployment(tokenizer, context: int) -> str:
    """A deployment of the demo model's tokenizer with a context of `context` tokens, in HELM's registry."""
    from helm.benchmark.model_deployment_registry import (
        ClientSpec,
        ModelDeployment,
        WindowServiceSpec,
        register_model_deployment,
    )

    name = f"demo-context-{context}"
    SERVICE.tokenizers[name] = tokenizer
    register_model_deployment(ModelDeployment(name=name, client_spec=ClientSpec(CLIENT, {}), tokenizer_name=name,
                                              max_sequence_length=context, window_service_spec=WindowServiceSpec(WINDOW, {})))
    return name


def _fit(name, adapter, shots, instance):
    """(prompt, examples kept, truncated) of HELM's adapter on `instance` with the examples `shots`, in order."""
    adapter = dataclasses.replace(adapter, sample_train=False, max_train_instances=len(shots), model_deployment=name)
    [state] = adapt(adapter, [*shots, instance], name)
    return state["request"]["prompt"], state["num_train_instances"], state["prompt_truncated"]


def test_the_window_counts_tokens_as_the_engine(window):
    from jobs.common import demo_model_dir

    tokenizer = load_tokenizer(demo_model_dir())
    for text in ("", "Q: What is 1 plus 2? A:", "Answer.\nQ: Where is Torwyn? A: north"):
        assert window.get_num_tokens(text) == len(tokenizer(text)["input_ids"])
    assert window.max_request_length == load_model_spec(demo_model_dir()).max_position_embeddings


@pytest.mark.parametrize("context", [200, 80, 60, 40, 12])
def test_fitting_keeps_the_longest_prefix_of_examples_that_fits(window, context):
    name = _deployment(window.service.tokenizers[DEMO], context)
    small = window_service(name)
    instances = load_instances("facts")
    shots, instance = [i for i in instances if i["split"] == "train"][:5], instances[-1]
    prompt, kept, truncated = _fit(name, QA, shots, instance)
    assert small.fits_within_context_window(prompt, QA.max_tokens)
    if 0 < kept < len(shots):
        longer, _, _ = _fit(DEMO, QA, shots[:kept + 1], instance)
        assert not small.fits_within_context_window(longer, QA.max_tokens)
    if truncated:  # no example fits: the prompt is cut from the right to the longest start that fits
        full, _, _ = _fit(DEMO, QA, [], instance)
        assert kept == 0 and full.startswith(prompt)
        assert not small.fits_within_context_window(full[:len(prompt) + 1], QA.max_tokens)
    assert (kept, truncated) == {200: (5, False), 12: (0, True)}.get(context, (kept, truncated))


def test_fitted_states_record_examples_kept_and_truncation(window):
    instances = load_instances("addition")[:25]
    name = _deployment(window.service.tokenizers[DEMO], 60)
    states = adapt(dataclasses.replace(QA, model_deployment=name), instances, "m")
    assert all(s["num_train_instances"] < 5 for s in states)
    assert all(window_service(name).fits_within_context_window(s["request"]["prompt"], 4) for s in states)
    roomy = adapt(QA, instances, DEMO, demo_model_dir())
    assert all(s["num_train_instances"] == 5 and not s["prompt_truncated"] for s in roomy)
    unfitted = adapt(dataclasses.replace(QA, model_deployment="unfitted"), instances, "m")
    assert [s["request"]["prompt"] for s in roomy] == [s["request"]["prompt"] for s in unfitted]


def test_no_room_for_the_answer_leaves_the_prompt_to_the_engine(window):
    tight = window_service(_deployment(window.service.tokenizers[DEMO], 4))
    assert tight.truncate_from_right("Q: What is 1 plus 2? A:", 4) == "Q: What is 1 plus 2? A:"
