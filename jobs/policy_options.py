"""Command-line options that set the engine's `Policy` and tier budgets by hand (shared by the job commands).
What is given is pinned; with the planner on (the default in `flexbatch run`) the planner chooses the rest,
and with --no-plan the rest keeps the `Policy` default: everything on the CPU, blocks of gbs x num_gb rows."""

from __future__ import annotations

from dataclasses import fields

import click

from engine.policy import PHASE_DEVICES, WEIGHT_FORMATS, Policy, parse_bytes

_P = {f.name: f.default for f in fields(Policy) if f.init}


def policy_options(fn):
    options = [
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
                                        "group 64) or int8 (row-wise, int8 x int8 GEMMs)."),
        click.option("--compress-cache", is_flag=True, help="4-bit group-wise KV cache (group 64)."),
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
        click.option("--cpu-mem", default=None, metavar="SIZE", help="CPU tier budget, e.g. 8GiB.  [default: no limit]"),
        click.option("--disk-mem", default=None, metavar="SIZE", help="Disk tier budget.  [default: no limit]"),
        click.option("--offload-dir", default=None, type=click.Path(), metavar="DIR",
                     help="Folder for disk-tier weights (written once per model and format, then reused) and "
                          "scratch files.  [default: ~/.cache/flexbatch/offload]"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def policy_from_options(o: dict) -> Policy:
    """Build the Policy from the parsed options (raises InvalidParamsError on bad values)."""
    gbs, num_gb = o.pop("gbs"), o.pop("num_gb")
    batch_size = o.pop("batch_size")
    if batch_size is not None:
        if gbs is not None or num_gb is not None:
            raise click.UsageError("--batch-size is shorthand for --gbs N --num-gb 1; give one or the other")
        gbs, num_gb = batch_size, 1
    kw = dict(gbs=gbs or _P["gbs"], num_gb=num_gb or _P["num_gb"], compress_weight=o["compress_weight"] is not None,
              weight_format=o.pop("compress_weight") or "int4",
              compress_cache=o.pop("compress_cache"), cpu_attention=o.pop("cpu_attention"),
              prefill_device=o.pop("prefill_device"), decode_device=o.pop("decode_device"),
              prefill_split_layer=o.pop("prefill_split_layer"), decode_split_layer=o.pop("decode_split_layer"))
    percent = o.pop("percent")
    return Policy.from_percent(tuple(percent), **kw) if percent else Policy(**kw)


def budgets_from_options(o: dict) -> dict[str, float | None]:
    return {tier: parse_bytes(o.pop(f"{tier}_mem"), f"--{tier}-mem") for tier in ("gpu", "cpu", "disk")}
