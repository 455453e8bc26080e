"""Every engine, decoding and job option (the answer constraint's too) is declared once (engine/options.py) and taken
by every surface made from the declaration, or listed there as absent with the reason; a bad value is one
`OptionError` from the command line, Python, the Ray Data stage and lm-eval's model_args, naming the option as each
spells it."""

import dataclasses
import inspect

import pytest
from click.testing import CliRunner

import flexbatch
from engine.options import OPTION_DEFAULT, SURFACES, Option, OptionError, options_of
from engine.policy import BATCH_SIZE, PERCENT, Pins, Policy
from engine.request import SamplingParams
from flexbatch.api import JOB_OPTIONS, SAMPLING_OPTIONS
from flexbatch.ray import Processor
from jobs import cli
from pipeline.job import GUIDED, RunConfig
from pipeline.plan.settings import BUDGETS

POLICY = options_of(Policy)
JOB = options_of(RunConfig)  # the engine settings' options, truncate's and the job's own
DECLARED = [*options_of(SamplingParams).values(), *POLICY.values(), BATCH_SIZE, PERCENT, *JOB.values(),
            *BUDGETS.values(), *GUIDED.values()]


def _cli_flags() -> set[str]:
    return {flag for p in cli.main.commands["run"].params for flag in (*p.opts, *p.secondary_opts)}


def _takes(o: Option, surface: str) -> bool:
    """Whether `surface` really takes option `o` (Policy fields as pins, tier budgets in `budgets`)."""
    if surface == "cli":
        return (o.flag.name.split("/")[0] if o.flag else o.via) in _cli_flags()
    keyword = o.keyword.partition("[")[0] or o.name  # budgets['cpu'] is an entry of budgets=
    if surface == "python":
        if o.name in POLICY:
            return "pins" in JOB_OPTIONS and Pins({o.name: o.default})[o.name] == o.default
        return keyword in (*inspect.signature(flexbatch.run_config).parameters, *JOB_OPTIONS, *SAMPLING_OPTIONS)
    if surface == "ray":
        return keyword in inspect.signature(Processor).parameters
    from flexbatch.lm_eval import read_model_args

    try:
        read_model_args({o.name: o.default})
    except OptionError:
        return True  # known, and checked (a default that alone makes no whole policy, e.g. a split layer)
    except flexbatch.FlexbatchError:
        return False
    return True


@pytest.mark.parametrize("option", DECLARED, ids=[o.name for o in DECLARED])
def test_every_declared_option_is_on_every_surface_or_says_why_not(option):
    if "model_args" not in dict(option.absent):
        pytest.importorskip("lm_eval")
    for surface in SURFACES:
        why = dict(option.absent).get(surface)
        assert _takes(option, surface) == (why is None), (option.name, surface, why)
        assert why is None or len(why) > 10, (option.name, surface)


def test_the_run_commands_options_have_the_declared_defaults():
    params = {p.name: p for p in cli.main.commands["run"].params}
    flagged = {name: o for name, o in {**options_of(SamplingParams), **JOB, **GUIDED}.items() if o.flag}
    assert set(flagged) <= set(params)
    for name, o in flagged.items():
        if o.default is dataclasses.MISSING:  # a field the job must be given: by the flag, unless it has a default
            assert params[name].required == (o.flag.default is OPTION_DEFAULT), name
        elif o.flag.default_text is None and o.kind != "texts":  # a repeatable flag's default is click's ()
            assert params[name].default == o.default, name
        assert o.help in params[name].help, name


@pytest.mark.parametrize(("args", "named"), [
    (["--truncate", "right"], "Invalid value for '--truncate'"),  # a choice: click refuses it, naming the flag
    (["--temperature", "-1"], "flexbatch: error: --temperature=-1.0 is invalid: expected a number >= 0"),
    (["--cpu-mem", "lots"], "flexbatch: error: --cpu-mem='lots' is invalid: expected a size"),
    (["--shard-rows", "0"], "Invalid value for '--shard-rows'"),
    (["--prompt-column", ""], "flexbatch: error: --prompt-column='' is invalid: expected a non-empty string"),
    (["--choice", " Yes", "--choice", ""], "flexbatch: error: --choice='' is invalid: expected a list of non-empty"),
])
def test_a_bad_value_on_the_command_line_names_the_flag(tmp_path, no_model_load, args, named):
    result = CliRunner().invoke(cli.main, ["run", "--no-ray", "--input", str(tmp_path / "in.parquet"),
                                           "--output", str(tmp_path / "out"), *args])
    assert result.exit_code == 2 and named in result.stderr, result.stderr


@pytest.mark.parametrize(("options", "named"), [
    ({"truncate": "right"}, "truncate='right' is invalid: expected one of error, left"),
    ({"temperature": -1}, "temperature=-1 is invalid: expected a number >= 0 (0 is greedy)"),
    ({"budgets": {"cpu": "lots"}}, "budgets['cpu']='lots' is invalid: expected a size"),
    ({"pins": {"gbs": 0}}, "gbs=0 is invalid: expected a whole number >= 1"),
    ({"chat": "yes"}, "chat='yes' is invalid: expected one of auto, on, off"),
    ({"format": "csv"}, "format='csv' is invalid: expected one of auto, parquet, openai"),
    ({"shard_rows": 0}, "shard_rows=0 is invalid: expected a whole number >= 1, or None"),
    ({"progress_seconds": -1}, "progress_seconds=-1 is invalid: expected a number >= 0"),
    ({"prompt_column": ""}, "prompt_column='' is invalid: expected a non-empty string (a column name)"),
    ({"guided": {"choice": [" Yes", ""]}}, "guided['choice']='' is invalid: expected a list of non-empty strings"),
    ({"guided": {"regex": ""}}, "guided['regex']='' is invalid: expected a non-empty string"),
])
def test_a_bad_value_in_python_names_the_keyword(tmp_path, demo_model_dir, options, named):
    with pytest.raises(OptionError) as caught:
        flexbatch.run_config(demo_model_dir, str(tmp_path / "in.parquet"), tmp_path / "out", **options)
    assert str(caught.value) == named or str(caught.value).startswith(named), str(caught.value)


def test_the_ray_stage_refuses_a_bad_value_by_its_keyword(demo_model_dir):
    with pytest.raises(OptionError, match="^truncate='right' is invalid: expected one of error, left$"):
        Processor(demo_model_dir, truncate="right")
    with pytest.raises(OptionError, match=r"^top_p=0 is invalid: expected a number in \(0, 1\]"):
        Processor(demo_model_dir, top_p=0)
    with pytest.raises(OptionError, match="^chat='yes' is invalid: expected one of auto, on, off$"):
        Processor(demo_model_dir, chat="yes")


def test_a_rows_own_constraint_is_not_a_job_option():
    """A job refuses a bad job-wide constraint before it runs; the same constraint in a row is that row's, and fails
    it alone when the engine prepares it (engine/guided.py)."""
    from engine.guided import Guided

    assert Guided.from_mapping({"choice": [" Yes", ""]}).choice == (" Yes", "")


def test_the_engine_refuses_a_bad_dtype_or_backend_as_the_declared_option():
    """The engine reads dtype and backend itself (Engine.load, the profiler): a bad one is the same OptionError that
    EngineSettings raises, named as each surface spells it."""
    from engine.dtypes import DTYPE, resolve_dtype
    from engine.kernels.backend import BACKEND, load_kernels

    assert (JOB["dtype"], JOB["backend"]) == (DTYPE, BACKEND)
    with pytest.raises(OptionError) as caught:
        resolve_dtype("float16")
    assert str(caught.value) == "dtype='float16' is invalid: expected one of auto, float32, bfloat16"
    assert str(caught.value.given("cli")).startswith("--dtype='float16' is invalid")
    with pytest.raises(OptionError, match="^backend='cuda' is invalid: expected one of native, aten, ipex, auto$"):
        load_kernels("cuda")


@pytest.mark.parametrize(("args", "named"), [
    ({"cpu_mem": "lots"}, "model_args cpu_mem='lots' is invalid: expected a size"),
    ({"gbs": 0}, "model_args gbs=0 is invalid: expected a whole number >= 1"),
    ({"dtype": "float16"}, "model_args dtype='float16' is invalid: expected one of auto"),
    ({"max_length": 0}, "model_args max_length=0 is invalid: expected a whole number >= 1"),
])
def test_a_bad_model_arg_names_it_as_lm_eval_spells_it(tmp_path, args, named):
    pytest.importorskip("lm_eval")
    from flexbatch.lm_eval import FlexbatchLM

    with pytest.raises(OptionError) as caught:
        FlexbatchLM(pretrained=tmp_path / "not-loaded", **args)  # refused before the model is read
    assert str(caught.value).startswith(named), str(caught.value)


def test_one_error_type_whichever_way_a_value_came_in():
    """An OptionError is the ConfigError a job raised for a bad option and the InvalidParamsError the engine
    raised, so that code catching either still catches it."""
    from engine.errors import InvalidParamsError
    from pipeline.errors import ConfigError

    with pytest.raises(OptionError) as caught:
        SamplingParams(top_k=-1)
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, InvalidParamsError)
    assert str(caught.value.given("cli")) == "--top-k=-1 is invalid: expected a whole number >= 0 (0 disables it)"
    assert str(caught.value.given("model_args")).startswith("model_args top_k=-1 is invalid")
