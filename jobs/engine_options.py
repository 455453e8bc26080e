"""The command-line options, made from the declared options (engine/options.py): the engine options of every command
that runs or plans engines (`run`, `helm`, `wrangle`, `plan`) and the `EngineSettings` they make, and the decoding
and job options of `run`. Policy options that are given are pinned; with the planner on (the default) it chooses the rest,
and with --no-plan the rest keeps the `Policy` default: everything on the CPU, blocks of gbs x num_gb rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
from click.core import ParameterSource

from engine.options import OPTION_DEFAULT, Option, options_of
from engine.policy import BATCH_SIZE, FRACTION_NAMES, PERCENT, Pins, Policy
from engine.request import TRUNCATE, SamplingParams
from pipeline.plan.settings import BUDGETS, EngineSettings

_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
_ENGINE = options_of(EngineSettings)
_JOB_ONLY = ("plan", "use_ray", "address", "workers")  # where the engines run: not for `plan`, which runs none
_PINS = {name: o for name, o in options_of(Policy).items() if o.flag}  # the policy fields with a flag of their own
SAMPLING = {name: o for name, o in options_of(SamplingParams).items() if o.flag}


def click_option(o: Option):
    """The click option of a declared option: its flag, type, default and help."""
    f = o.flag
    default = o.default if f.default is OPTION_DEFAULT else f.default
    kw = {"default": default, "show_default": f.default_text is None, "metavar": f.metavar,
          "help": o.help + (f"  [default: {f.default_text}]" if f.default_text else "")}
    if default is dataclasses.MISSING:  # a required field: a required flag (no default, not even None)
        del kw["default"]
        kw.update(show_default=False, required=True)
    if f.words:
        kw.update(type=click.Choice(tuple(w for w, _ in f.words)))
        if f.flag_value is not None:
            kw.update(is_flag=False, flag_value=f.flag_value, show_default=False)
    elif o.kind == "bool" and "/" not in f.name:  # a pair such as --plan/--no-plan is a boolean flag already
        kw.update(is_flag=True)
    elif o.kind == "texts":
        kw.update(multiple=True, default=None, show_default=False)
    elif o.kind != "bool":
        kw.update(type=_type(o), nargs=f.nargs)
    return click.option(f.name, o.name, **kw)


class _PathText(click.Path):
    """A path, with the empty text kept as it is given (click.Path reads '' as '.', the folder the command runs in),
    so that the declared check refuses it."""

    def __init__(self):
        super().__init__(path_type=Path)

    def convert(self, value, param, ctx):
        return value if value == "" else super().convert(value, param, ctx)


def _type(o: Option):
    if o.kind == "choice":
        return click.Choice(o.choices)
    if o.kind == "int":
        return click.IntRange(min=o.low) if o.flag.checked else int
    if o.kind == "number":
        return float
    return _PathText() if o.kind == "path" else None


def declared_options(*options: Option):
    """A decorator adding the click options of `options` to a command, in this order."""
    def decorate(fn):
        for o in reversed(options):
            fn = click_option(o)(fn)
        return fn

    return decorate


def engine_options(fn=None, *, job: bool = True):
    """Add the engine options to a click command; `job=False` (for `plan`, which runs nothing) leaves out
    --plan/--no-plan and where the engines run (--ray, --address, --workers)."""
    engine = [_ENGINE[name] for name in ("dtype", "backend", "hardware", *(_JOB_ONLY if job else ()))]
    blocks = [_PINS["gbs"], _PINS["num_gb"], BATCH_SIZE, PERCENT]
    policy = [*blocks, *(o for o in _PINS.values() if o not in blocks)]

    def decorate(fn):
        return declared_options(*engine, *policy, *BUDGETS.values(), _ENGINE["offload_dir"])(fn)

    return decorate(fn) if fn is not None else decorate


def sampling_options(fn):
    """Add the decoding options (--max-new-tokens, --temperature, ...) and --truncate to a click command; its
    function takes them by their keywords (`sampling_values` gathers them)."""
    return declared_options(*SAMPLING.values(), TRUNCATE)(fn)


def sampling_values(options: dict) -> dict:
    """The decoding options by keyword, taken out of the parsed `options` (stop strings as a tuple)."""
    values = {name: options.pop(name) for name in SAMPLING}
    values["stop"] = tuple(values["stop"] or ())
    return values


def engine_settings(ctx: click.Context, options: dict) -> EngineSettings:
    """The settings from the parsed options, which are taken out of `options` (raises an OptionError,
    InvalidParamsError or ConfigError on bad values)."""
    pins = _pins(ctx, options)
    engine = {name: options.pop(name) for name in _ENGINE if name in options}
    budgets = {tier: options.pop(o.name) for tier, o in BUDGETS.items()}
    return EngineSettings(pins=pins, budgets=budgets, **engine)


def _pins(ctx: click.Context, options: dict) -> Pins:
    """The Policy fields the user set on the command line (defaults are not pins); the policy options are taken
    out of `options`."""
    given = {name for name in (*_PINS, BATCH_SIZE.name, PERCENT.name) if ctx.get_parameter_source(name) in _GIVEN}
    o = {name: options.pop(name) for name in (*_PINS, BATCH_SIZE.name, PERCENT.name)}
    pins = {}
    for name, opt in _PINS.items():
        words = dict(opt.flag.words)
        if opt.flag.word_field and name in given:  # the word is a second field (--compress-weight int8)
            pins[opt.flag.word_field] = o[name]
        value = words.get(o[name]) if words else o[name] if name in given else None
        if value is not None:
            pins[name] = value
    if "batch_size" in given and o["batch_size"] is not None:
        if "gbs" in pins or "num_gb" in pins:
            raise click.UsageError("--batch-size is shorthand for --gbs N --num-gb 1; give one or the other")
        pins.update(gbs=o["batch_size"], num_gb=1)
    if "percent" in given and o["percent"]:
        placed = Policy.from_percent(tuple(o["percent"]))  # six numbers in [0, 100], each kind summing to <= 100
        pins.update({name: getattr(placed, name) for name in FRACTION_NAMES})
    Policy(**pins)  # the options given make a whole policy with the defaults (a split names its first GPU layer)
    return Pins(pins)
