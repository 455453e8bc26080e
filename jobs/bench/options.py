"""The options every single-engine benchmark (`bench prefix`, `score`, `guided`) shares, declared once: the model
preset, dtype, rounds, threads, checkpoint cache and report path; each command's defaults come from its config.
Also --vllm-venv, the vLLM line of `bench workloads` and `bench score` (a venv of its own: vLLM pins its own torch
and transformers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from jobs.bench import models as bm


@dataclass(frozen=True)
class BlockBenchConfig:
    """The settings `bench_options(..., block=True)` declares, with their defaults: a benchmark on one loaded engine
    running blocks of gbs x num_gb rows."""

    preset: str = "110m"
    dtype: str = "auto"
    gbs: int = 64
    num_gb: int = 2
    repeats: int = 3
    cache_dir: str = str(bm.DEFAULT_CACHE_DIR)


def bench_options(config, report: str, block: bool = False):
    """--preset, --dtype, [--gbs, --num-gb with `block`], --repeats, --threads, --cache-dir and --output
    (default out/bench/`report`), defaults from the dataclass `config`."""
    options = [
        click.option("--preset", type=click.Choice(sorted(bm.PRESETS)), default=config.preset, show_default=True,
                     help="Model shape (a random-weight Llama built once and cached)."),
        click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default=config.dtype,
                     show_default=True, help="Compute dtype (auto: bfloat16 where the CPU has AVX512-BF16 or AMX)."),
    ]
    if block:
        options += [click.option("--gbs", type=click.IntRange(min=1), default=config.gbs, show_default=True),
                    click.option("--num-gb", type=click.IntRange(min=1), default=config.num_gb, show_default=True)]
    options += [
        click.option("--repeats", type=click.IntRange(min=1), default=config.repeats, show_default=True),
        click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads.  [default: torch's]"),
        click.option("--cache-dir", default=config.cache_dir, show_default=True, help="Checkpoints."),
        click.option("--output", type=click.Path(path_type=Path), default=Path("out/bench") / report,
                     show_default=True),
    ]

    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


DEFAULT_VLLM_VENV = ".venv-vllm"  # what scripts/setup_vllm_cpu_venv.sh builds


def vllm_option(what: str):
    """--vllm-venv [DIR]: add a vLLM line (`what`) run by DIR/bin/python; the option alone means .venv-vllm."""
    return click.option("--vllm-venv", type=click.Path(path_type=Path, file_okay=False), is_flag=False,
                        flag_value=Path(DEFAULT_VLLM_VENV), default=None,
                        help=f"Add a vLLM line: {what}, run by DIR/bin/python (jobs/bench/vllm_script.py; build the "
                             f"venv with scripts/setup_vllm_cpu_venv.sh DIR; the option alone: {DEFAULT_VLLM_VENV})."
                             "  [default: no vLLM line]")


def vllm_python(venv: Path | None) -> Path | None:
    """The python of the vLLM venv `venv` (None: no vLLM line); a clear error where it is missing."""
    if venv is None:
        return None
    python = Path(venv) / "bin" / "python"
    if not python.is_file():
        raise click.UsageError(f"no vLLM venv at {venv} ({python} is missing): build it with "
                               f"scripts/setup_vllm_cpu_venv.sh {venv}, or leave --vllm-venv out")
    return python.absolute()  # not resolved: a venv's python is a link out of it
