"""`flexbatch plan` (explain the policy the planner picks for a model, a workload and a machine) and
`flexbatch profile` (measure this machine into a hardware spec). The policy is chosen as `flexbatch run` chooses
it (`pipeline.plan.planning.choose_policy`), with the same budgets."""

from __future__ import annotations

import json
from pathlib import Path

import click

from engine.errors import FlexbatchError
from jobs.common import demo_model_dir, fail
from jobs.engine_options import engine_options, engine_settings


def _workload(model_dir: Path, spec, prompt_len, gen_len, num_prompts, input_, prompt_column, dtype):
    from pipeline.plan.planning import workload_dtype

    dtype_name = workload_dtype(dtype)
    if input_ is None:
        from planner.workload import Workload

        return Workload(prompt_len, gen_len, num_prompts, dtype=dtype_name)
    from engine.tokenizer import load_tokenizer
    from pipeline.input.parquet import MESSAGES_COLUMN
    from pipeline.job import inspect_job_inputs
    from pipeline.plan.planning import workload_from_input

    files, chat = inspect_job_inputs(input_, prompt_column)  # Parquet prompts or conversations, or a batch file
    column = MESSAGES_COLUMN if chat else prompt_column
    return workload_from_input(files, column, load_tokenizer(model_dir), spec, gen_len, dtype_name)


@click.command("plan", short_help="Pick and explain a policy for a model, a workload and a machine.")
@click.option("--model", type=click.Path(path_type=Path), default=None,
              help="Checkpoint folder (only config.json is read).  [default: the demo model]")
@click.option("--prompt-len", type=click.IntRange(min=1), default=512, show_default=True,
              help="Prompt tokens (ignored with --input).")
@click.option("--gen-len", type=click.IntRange(min=1), default=32, show_default=True, help="New tokens per prompt.")
@click.option("--num-prompts", type=click.IntRange(min=1), default=64, show_default=True,
              help="Prompts in the job (ignored with --input).")
@click.option("--input", "input_", default=None, metavar="PATH",
              help="Input to read the workload from (row counts, a sample of prompt lengths): Parquet, with a "
                   "prompt or a messages column, or an OpenAI Batch file (*.jsonl).")
@click.option("--prompt-column", default="prompt", show_default=True, help="Prompt column of --input.")
@click.option("--allow-compression", is_flag=True, help="Let the search choose 4-bit weights/cache (lossy).")
@click.option("--plot", type=click.Path(path_type=Path), default=None, help="Also draw the plan as a PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print the chosen policy as JSON only.")
@engine_options(job=False)
@click.pass_context
def plan_command(ctx, model, prompt_len, gen_len, num_prompts, input_, prompt_column, allow_compression, plot,
                 as_json, **engine_opts) -> None:
    """Search the policy space (FlexGen placement and block shape, FlexInfer compute per phase) with the cost
    model, and explain the choice: the top alternatives, the binding constraint, where tensors live and each
    phase's timeline. Policy options given here are pinned; the search fills in the rest.

    \b
    Example:
      flexbatch plan --model DIR --prompt-len 1024 --gen-len 32 --num-prompts 256 \\
        --hardware infra/hardware/h100-80gb-sapphirerapids.json --plot plan.png
    """
    from engine.spec import load_model_spec
    from pipeline.plan.planning import choose_policy, hardware
    from planner.explain import explain_text, plot_png

    try:
        settings = engine_settings(ctx, engine_opts)
        model_dir = model or demo_model_dir()
        spec = load_model_spec(model_dir)
        work = _workload(model_dir, spec, prompt_len, gen_len, num_prompts, input_, prompt_column, settings.dtype)
        plan = choose_policy(settings, work, spec, allow_compression=allow_compression)
        hw = hardware(settings.hardware)
    except FlexbatchError as e:
        fail(e)
    if as_json:
        click.echo(plan.policy.to_json())
        return
    click.echo(explain_text(plan, spec, hw))
    if plot:
        click.echo(f"\nplot: {plot_png(plan, spec, plot)}")


@click.command("profile", short_help="Measure this machine into a hardware spec (cached).")
@click.option("--output", type=click.Path(path_type=Path), default=None,
              help="Where to write the spec.  [default: ~/.cache/flexbatch/hardware.json, used by plan and run]")
def profile_command(output) -> None:
    """Measure GEMM rates by row count, the int4/int8 kernels on compressed weights (and so the engine's
    crossovers for those shapes), decode attention over bf16 and 4-bit caches, dequantization, the engine's
    per-call costs, memory, disk and page-cache rates (and the GPU and its links when CUDA exists)."""
    from planner.hardware import save_hardware
    from planner.profiler import DEFAULT_CACHE, profile_this_machine

    try:
        spec = profile_this_machine(refresh_kernels=True)
        path = save_hardware(spec, output or DEFAULT_CACHE)
    except FlexbatchError as e:
        fail(e)
    click.echo(json.dumps(spec.to_dict(), indent=1))
    click.echo(f"saved: {path}")
