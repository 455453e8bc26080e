"""The engine options, declared once for every command that runs or plans engines (`run`, `helm`, `wrangle`,
`plan`), and the `EngineSettings` they make. Policy options that are given are pinned; with the planner on (the
default) it chooses the rest, and with --no-plan the rest keeps the `Policy` default: everything on the CPU,
blocks of gbs x num_gb rows."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import click
from click.core import ParameterSource

from engine.dtypes import DTYPE_CHOICES
from engine.kernels.backend import BACKEND_CHOICES
from engine.policy import FRACTION_NAMES, PHASE_DEVICES, WEIGHT_FORMATS, Pins, Policy, parse_bytes
from pipeline.plan.planning import CPU_BUDGET_SHARE
from pipeline.plan.settings import EngineSettings

_P = {f.name: f.default for f in fields(Policy) if f.init}
_E = {f.name: f.default for f in fields(EngineSettings)}
_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
_PINNABLE = ("gbs", "num_gb", "compress_weight", "compress_cache", "cpu_attention", "prefill_device",
             "decode_device", "prefill_split_layer", "decode_split_layer")
_POLICY_OPTIONS = (*_PINNABLE, "batch_size", "percent", "refill", "prefix_sharing")
_JOB_ONLY = ("plan", "use_ray", "address", "workers")


def engine_options(fn=None, *, job: bool = True):
    """Add the engine options to a click command; `job=False` (for `plan`, which runs nothing) leaves out
    --plan/--no-plan and where the engines run (--ray, --address, --workers)."""
    def decorate(fn):
        options = _run_options() if job else []
        for option in reversed(_engine_options() + options + _policy_options()):
            fn = option(fn)
        return fn

    return decorate(fn) if fn is not None else decorate


def engine_settings(ctx: click.Context, options: dict) -> EngineSettings:
    """The settings from the parsed options, which are taken out of `options` (raises InvalidParamsError or
    ConfigError on bad values)."""
    pins = _pins(ctx, options)
    job = {name: options.pop(name) for name in _JOB_ONLY if name in options}
    return EngineSettings(dtype=options.pop("dtype"), backend=options.pop("backend"), pins=pins,
                          budgets=_budgets(options), offload_dir=options.pop("offload_dir"),
                          hardware=options.pop("hardware"), **job)


def _engine_options() -> list:
    return [
        click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default=_E["dtype"], show_default=True,
                     help="Compute dtype; auto is bfloat16 on CPUs with native bf16 (AMX, AVX512-BF16), else float32."),
        click.option("--backend", type=click.Choice(BACKEND_CHOICES), default=_E["backend"], show_default=True,
                     help="CPU kernels: native (PyTorch, dense weights reordered for oneDNN where measured faster); "
                          "aten (native with every dense Linear through aten's F.linear as loaded); ipex (Intel Extension for PyTorch, in its own torch 2.8 "
                          "environment: scripts/setup_ipex_venv.sh); auto (ipex where it imports, else native)."),
        click.option("--hardware", type=click.Path(path_type=Path), default=None,
                     help="Hardware spec for the planner (e.g. infra/hardware/*.json).  [default: this machine, "
                          "profiled on first use and cached]"),
    ]


def _run_options() -> list:
    return [
        click.option("--plan/--no-plan", "plan", default=_E["plan"], show_default=True,
                     help="Pick the policy with the planner (keeping the policy options given here); --no-plan runs "
                          "the options as given, with defaults for the rest."),
        click.option("--ray/--no-ray", "use_ray", default=_E["use_ray"], show_default=True,
                     help="Run the engines as Ray actors; --no-ray runs one engine in this process (no cluster "
                          "needed)."),
        click.option("--address", default=None, metavar="ADDR",
                     help="Ray cluster to join (e.g. 10.0.0.5:6379, or auto).  [default: RAY_ADDRESS if set, else a "
                          "local Ray started for this job]"),
        click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Engines on CPU-only nodes, spread over them.  [default: one per CPU node; GPU nodes "
                          "always get one per GPU]"),
    ]


def _policy_options() -> list:
    return [
        click.option("--gbs", type=click.IntRange(min=1), default=None,
                     help=f"GPU batch size: rows computed together.  [default: planned; {_P['gbs']} with --no-plan]"),
        click.option("--num-gb", type=click.IntRange(min=1), default=None,
                     help=f"GPU batches per block; a layer's weights are loaded once per block.  "
                          f"[default: planned; {_P['num_gb']} with --no-plan]"),
        click.option("--batch-size", type=click.IntRange(min=1), default=None,
                     help="Shorthand for --gbs N --num-gb 1."),
        click.option("--percent", type=float, nargs=6, default=None, metavar="WG WC CG CC HG HC",
                     help="FlexGen's placement: percent of weights, KV cache and activations on the gpu and on "
                          "the cpu; the rest goes to disk.  [default: planned; 0 100 0 100 0 100 with --no-plan]"),
        click.option("--compress-weight", type=click.Choice(WEIGHT_FORMATS), is_flag=False, flag_value="int4",
                     default=None, help="Compressed weights: int4 (the default when given alone: 4-bit group-wise, "
                                        "group 64), int8 (row-wise, int8 x int8 GEMMs; the LM head "
                                        "in int8 too) or bf16 (kept and read in bfloat16, computed in float32: "
                                        "lossless for a bf16 checkpoint, half the bytes of float32)."),
        click.option("--compress-cache", is_flag=True, help="4-bit group-wise KV cache (group 64)."),
        click.option("--refill", type=click.Choice(("auto", "on", "off")), default="auto", show_default=True,
                     help="Finished rows' slots take waiting rows: auto lets the planner decide from the rows' "
                          "max_new_tokens and stop strings, then from what rows really generate; off with "
                          "--no-plan unless on."),
        click.option("--prefix-sharing", type=click.Choice(("auto", "off")), default="auto", show_default=True,
                     help="The leading tokens every row of a block shares (a few-shot prompt's instructions and "
                          "examples, a chat's system prompt) are computed and cached once, and each row holds only "
                          "its own tokens: blocks hold more rows and prefill skips the repeats. auto: where rows "
                          "share at least 32 tokens; off: every row's prompt is computed whole."),
        click.option("--cpu-attention/--no-cpu-attention", default=_P["cpu_attention"], show_default=True,
                     help="Decode attention runs where the KV cache lives."),
        click.option("--prefill-device", type=click.Choice(PHASE_DEVICES), default=_P["prefill_device"],
                     show_default=True, help="Where prefill computes; split = CPU below --prefill-split-layer."),
        click.option("--decode-device", type=click.Choice(PHASE_DEVICES), default=_P["decode_device"],
                     show_default=True, help="Where decode computes; split = CPU below --decode-split-layer."),
        click.option("--prefill-split-layer", type=click.IntRange(min=0), default=0, show_default=True,
                     help="First layer computed on the GPU in prefill when --prefill-device split."),
        click.option("--decode-split-layer", type=click.IntRange(min=0), default=0, show_default=True,
                     help="First layer computed on the GPU in decode when --decode-device split."),
        click.option("--gpu-mem", default=None, metavar="SIZE", help="GPU tier budget, e.g. 16GiB.  [default: no limit]"),
        click.option("--cpu-mem", default=None, metavar="SIZE", help=f"CPU tier budget, e.g. 8GiB.  [default: {CPU_BUDGET_SHARE:.0%} of the memory this process may still take "
                          "(MemAvailable or its memory cgroup's room), shared by the engines starting on the node]"),
        click.option("--disk-mem", default=None, metavar="SIZE", help="Disk tier budget.  [default: no limit]"),
        click.option("--offload-dir", default=None, type=click.Path(), metavar="DIR",
                     help="Folder for disk-tier weights (written once per model and format, then reused) and "
                          "scratch files.  [default: ~/.cache/flexbatch/offload]"),
    ]


def _pins(ctx: click.Context, options: dict) -> Pins:
    """The Policy fields the user set on the command line (defaults are not pins); the policy options are taken
    out of `options`."""
    given = {name for name in _POLICY_OPTIONS if ctx.get_parameter_source(name) in _GIVEN}
    o = {name: options.pop(name) for name in _POLICY_OPTIONS}
    pins = {name: o[name] for name in _PINNABLE if name in given and o[name] is not None}
    if "compress_weight" in pins:  # the option names a format; the pin is whether weights are compressed
        pins.update(compress_weight=True, weight_format=o["compress_weight"])
    if o["refill"] != "auto":
        pins["refill"] = o["refill"] == "on"
    if o["prefix_sharing"] == "off":
        pins["share_prefix"] = False
    if "batch_size" in given and o["batch_size"] is not None:
        if "gbs" in pins or "num_gb" in pins:
            raise click.UsageError("--batch-size is shorthand for --gbs N --num-gb 1; give one or the other")
        pins.update(gbs=o["batch_size"], num_gb=1)
    if "percent" in given and o["percent"]:
        placed = Policy.from_percent(tuple(o["percent"]))  # six numbers in [0, 100], each kind summing to <= 100
        pins.update({name: getattr(placed, name) for name in FRACTION_NAMES})
    Policy(**pins)  # the options given make a whole policy with the defaults (a split names its first GPU layer)
    return Pins(pins)


def _budgets(o: dict) -> dict[str, float | None]:
    return {tier: parse_bytes(o.pop(f"{tier}_mem"), f"--{tier}-mem") for tier in ("gpu", "cpu", "disk")}
