"""The Python API checks the type of every option: a bad value raises a `flexbatch.FlexbatchError` naming the
value and what is expected, before Ray starts or a model loads (never a bare TypeError deep in the run, nor
a string such as "no" taken as true)."""

import pytest

import flexbatch
from engine.errors import FlexbatchError as EngineFlexbatchError
from pipeline.plan.settings import EngineSettings

BAD_OPTIONS = [
    ({"shard_rows": 2.5}, "shard_rows=2.5"),
    ({"shard_rows": True}, "shard_rows=True"),
    ({"budgets": "lots"}, "budgets='lots'"),
    ({"budgets": {"tpu": 2**30}}, "['tpu']"),
    ({"budgets": {"cpu": "lots"}}, "budgets['cpu']='lots'"),
    ({"budgets": {"cpu": -5}}, "budgets['cpu']=-5"),
    ({"budgets": {"cpu": [1]}}, "budgets['cpu']=[1]"),
    ({"use_ray": "no"}, "use_ray='no'"),
    ({"plan": "yes"}, "plan='yes'"),
    ({"overwrite": 1}, "overwrite=1"),
    ({"logprobs": "yes"}, "logprobs='yes'"),
    ({"stop": "\n"}, "stop='\\n'"),
    ({"stop": 5}, "stop=5"),
    ({"temperature": "hot"}, "temperature='hot'"),
    ({"workers": 1.5}, "workers=1.5"),
    ({"workers": 0}, "workers=0"),
    ({"max_shard_retries": -1}, "max_shard_retries=-1"),
    ({"progress_seconds": "fast"}, "progress_seconds='fast'"),
    ({"hardware": 5}, "hardware=5"),
    ({"offload_dir": ["a"]}, "offload_dir=['a']"),
    ({"address": 7}, "address=7"),
    ({"pins": ["gbs"]}, "pins=['gbs']"),
    ({"pins": {"nope": 1}}, "pins={'nope': 1}"),
    ({"params": {"max_new_tokens": 3}}, "params={'max_new_tokens': 3}"),
    ({"prompt_column": 3}, "prompt_column=3"),
]


@pytest.mark.parametrize(("options", "named"), BAD_OPTIONS, ids=[str(o) for o, _ in BAD_OPTIONS])
def test_a_bad_option_raises_a_flexbatch_error_naming_it_and_the_fix(tmp_path, demo_model_dir, no_model_load,
                                                                      options, named):
    with pytest.raises(flexbatch.FlexbatchError) as caught:
        flexbatch.run(demo_model_dir, str(tmp_path / "missing.parquet"), tmp_path / "out", **options)
    message = str(caught.value)
    assert named in message, message
    assert any(fix in message for fix in ("expected", "e.g.", ": use ")), message  # what would do instead
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("where", "value"), [("model", None), ("input", 3.0), ("output", ""), ("output", 4)])
def test_a_bad_model_input_or_output_is_named(tmp_path, demo_model_dir, where, value):
    args = {"model": demo_model_dir, "input": str(tmp_path / "in.parquet"), "output": tmp_path / "out", where: value}
    with pytest.raises(flexbatch.FlexbatchError, match=f"{where}={value!r} is invalid"):
        flexbatch.run_config(**args)


def test_sizes_become_bytes_and_whole_numbers_stay_accepted(tmp_path, demo_model_dir):
    np = pytest.importorskip("numpy")
    config = flexbatch.run_config(demo_model_dir, "in.parquet", tmp_path / "out", shard_rows=np.int64(64),
                                  budgets={"cpu": "8GiB", "gpu": 16e9, "disk": None}, progress_seconds=0,
                                  workers=2, use_ray=False, logprobs=True, stop=("\n",))
    assert config.budgets == {"cpu": 8 * 2**30, "gpu": 16e9, "disk": None}
    assert config.shard_rows == 64 and type(config.shard_rows) is int and config.params.logprobs is True
    assert EngineSettings(budgets=None).budgets == {}


def test_flexbatch_error_is_the_one_every_user_error_derives_from():
    assert flexbatch.FlexbatchError is EngineFlexbatchError
    assert "FlexbatchError" in flexbatch.__all__
