"""The planner in a job: the workload of the input (row counts from the footers; prompt and generation lengths
from the sample the driver took, pipeline/input/sample.py), this machine's hardware profile (measured once, then
cached), and the CPU budget the plan must fit, turned into the `Policy` the engine runs."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from engine.batching import block_gen_length
from engine.spec import ModelSpec
from pipeline.input.sample import InputSample, take_sample
from pipeline.plan.settings import CPU_BUDGET_SHARE

if TYPE_CHECKING:  # the planner (cvxpy, torch) is imported when a job plans, not for --help
    from engine.policy import Policy
    from pipeline.job import JobSetup
    from pipeline.plan.settings import EngineSettings
    from planner.hardware import HardwareSpec
    from planner.predict import Prediction
    from planner.search import Plan
    from planner.workload import Workload

log = logging.getLogger(__name__)
TYPICAL_QUANTILE = 0.75  # blocks are length-bucketed; a block pads to about this quantile of its lengths
STOP_PRIOR = 0.5  # share of its max_new_tokens a row with a stop string is expected to generate, until measured


def workload_from_input(files, column: str, tokenizer, spec: ModelSpec, gen_len: int, dtype: str,
                        num_prompts: int | None = None, stop: tuple[str, ...] = ()) -> Workload:
    """The workload of `files` (every row unless `num_prompts` is given), sampled as a job samples it."""
    sample = take_sample(files, column, tokenizer, gen_len, stop, vocab_size=spec.vocab_size)
    return workload_from_sample(sample, spec, dtype, num_prompts or sum(f.num_rows for f in files))


def job_workload(job: JobSetup, num_prompts: int | None = None) -> Workload | None:
    """The workload a job's engine plans for: `num_prompts` of its rows (a worker's share; all by default), their
    lengths from the sample the driver took (no input read, no prompt tokenized here); None with --no-plan. A
    scoring job (`--score`) runs the LM head at every position of a row's own tokens in its prefill
    (Workload.scored_len)."""
    if not job.config.plan:
        return None
    if job.sample is None:
        raise ValueError("a planned job needs its input sample; prepare it with prepare_job")
    work = workload_from_sample(job.sample, job.spec, workload_dtype(job.config.dtype),
                                num_prompts or sum(f.num_rows for f in job.files),
                                share_prefix=job.config.pinned("share_prefix"))
    return dataclasses.replace(work, scored_len=work.prompt_len) if job.config.score else work


def workload_from_sample(sample: InputSample, spec: ModelSpec, dtype: str, num_prompts: int,
                         share_prefix: bool = True) -> Workload:
    """prompt_len: the TYPICAL_QUANTILE of the sampled token lengths; max_prompt_len: the longest sampled, both
    capped at what the context leaves after the longest generation; the sampled rows' own max_new_tokens and
    stop give the generation lengths (`generation_lengths`); num_prompts: the job's rows, or a worker's share.
    With `share_prefix`, the leading tokens the sampled prompts share are the workload's shared_len, and the
    prompt lengths count what is left of each (the engine computes a shared prefix once per block)."""
    rows = list(sample.row_lengths)
    longest, expected = generation_lengths(rows, spec)
    work = workload_from_lengths(sample.prompt_lengths, spec, longest, dtype, num_prompts)
    shared = shared_tokens(sample, spec, work.total_len) if share_prefix else 0
    if shared:
        own = [n - shared for n in sample.prompt_lengths if n]
        work = dataclasses.replace(workload_from_lengths(own, spec, longest, dtype, num_prompts), shared_len=shared)
    expected = min(expected, work.gen_len)
    block = block_gen_length([min(m, work.gen_len) for m, _ in rows])
    return dataclasses.replace(work, expected_gen_len=expected, block_gen_len=max(expected, block))


def shared_tokens(sample: InputSample, spec: ModelSpec, total_len: int) -> int:
    """The leading tokens the sampled prompts share, as the engine finds them in a block
    (`engine.loop.schedule.BlockExecutor.shared_tokens`): none where a sliding window would not cover a row."""
    from engine.loop.shared_prefix import shared_length

    prompts = [ids for ids in sample.prompt_ids.values() if ids]
    if not prompts or (spec.sliding_window is not None and total_len > spec.sliding_window):
        return 0
    return shared_length(prompts)


def generation_lengths(rows: list[tuple[int, bool]], spec: ModelSpec) -> tuple[int, float]:
    """The largest max_new_tokens of `rows` (it sizes the KV cache) and the tokens a row is expected to generate
    before any is measured: its own max_new_tokens, STOP_PRIOR of it where a stop string may end it earlier."""
    longest = min(max(m for m, _ in rows), max(1, spec.max_position_embeddings - 1))
    expected = sum(min(m, longest) * (STOP_PRIOR if s else 1.0) for m, s in rows) / len(rows)
    return longest, max(1.0, expected)


def measured_workload(work: Workload, rows: int, tokens: int) -> Workload:
    """`work` with the tokens its finished rows really generated on average (stop strings and EOS included)."""
    if rows < 1:
        return work
    expected = min(work.block_gen_len, max(1.0, tokens / rows))
    return dataclasses.replace(work, expected_gen_len=expected)


def refill_choice(settings: EngineSettings, work: Workload, spec: ModelSpec, policy: Policy) -> Policy:
    """`policy` with refill on or off as the planner prices it for `work` (the settings' pin wins): a worker asks
    again as rows finish, with what they really generated (`measured_workload`)."""
    from planner.search import with_refill_choice

    chosen = with_refill_choice(spec, hardware(settings.hardware), work, policy, settings.pins)
    return dataclasses.replace(policy, refill=chosen.policy.refill)


def refill_after(settings: EngineSettings, work: Workload, spec: ModelSpec, policy: Policy, rows: int,
                 tokens: int) -> Policy:
    """`policy` with refill chosen again for the rows to come, now that `rows` finished rows generated `tokens`
    (`measured_workload`); as it was where refill is pinned or nothing was measured."""
    if rows < 1 or "refill" in settings.pins:
        return policy
    measured = measured_workload(work, rows, tokens)
    chosen = refill_choice(settings, measured, spec, policy)
    if chosen.refill != policy.refill:
        log.info("refill %s: rows generate %.1f tokens on average (%d measured), of up to %d",
                 "on" if chosen.refill else "off", measured.expected_gen_len, rows, work.gen_len)
    return chosen


def workload_from_lengths(prompt_lengths, spec: ModelSpec, gen_len: int, dtype: str, num_prompts: int) -> Workload:
    """The workload of `num_prompts` prompts with token counts like `prompt_lengths` (a 0 is left out)."""
    from planner.workload import Workload

    room = max(1, spec.max_position_embeddings - gen_len)
    lengths = sorted(min(room, n) for n in prompt_lengths if n) or [1]
    typical = max(1, lengths[min(len(lengths) - 1, int(TYPICAL_QUANTILE * len(lengths)))])
    return Workload(typical, gen_len, max(1, num_prompts), max_prompt_len=max(typical, lengths[-1]), dtype=dtype)


def plan_budgets(budgets: dict, room=None, engines: int = 1) -> dict:
    """The tiers' capacities, for planning and for the engine that runs the plan (with or without planning): the
    user's budgets, and for a CPU without one CPU_BUDGET_SHARE of the memory this process may still take
    (`engine.memory.room`: MemAvailable or the memory cgroup's room, whichever is smaller), split evenly
    among the `engines` that start together on this node and share that room. A --cpu-mem above the share is
    lowered to it, with a warning: the kernel would kill the process (or thrash its page cache) before the
    budget is reached."""
    from engine.memory.room import memory_room

    out = dict(budgets or {})
    if room is None:
        import engine.engine  # noqa: F401  (torch and the engine: the room is read after their ~100 MiB, which
        import engine.tokenizer  # noqa: F401  the process holds anyway once it loads the model, not from it)
        room = memory_room()
    if room.available_bytes is None:
        return out
    share = room.available_bytes * CPU_BUDGET_SHARE / max(1, engines)
    of = f"{CPU_BUDGET_SHARE * 100:.0f} %" + (f" / {engines} engines on this node" if engines > 1 else "")
    given = out.get("cpu")
    if given is None:
        out["cpu"] = share
        log.info("CPU budget %.0f MiB: %s of what this process may still take (%s)", share / 2**20, of,
                 room.describe())
    elif given > share:
        out["cpu"] = share
        log.warning("--cpu-mem %.0f MiB is more than %s of what this process may still take (%s); planning and "
                    "running with %.0f MiB: give --cpu-mem %.0fMiB or less, or raise the memory limit",
                    given / 2**20, of, room.describe(), share / 2**20, share / 2**20)
    return out


def planning_process(hw: HardwareSpec, room) -> HardwareSpec:
    """`hw` with the room of the process that plans (and runs the plan): it decides how the disk tier is read
    and whether its scratch is charged to a binding memory limit (`planner.hardware.HardwareSpec`)."""
    from dataclasses import replace

    if room.available_bytes is None:
        return hw
    if room.limit_binds:
        log.info("a memory cgroup limit binds (%s): memory-mapped disk-tier scratch (activations, a 4-bit KV "
                 "cache) counts in the CPU budget, and disk-tier weights above %.0f MiB are read with O_DIRECT",
                 room.describe(), room.available_bytes / 2 / 2**20)
    return replace(hw, memory_room_bytes=room.available_bytes, memory_limit_binds=room.limit_binds)


def hardware(path: Path | None) -> HardwareSpec:
    from planner.hardware import load_hardware
    from planner.profiler import load_or_profile

    if path is not None:
        return load_hardware(path)

    return load_or_profile()


def workload_dtype(dtype: str) -> str:
    """The name of the compute dtype `dtype` ("auto", "float32", "bfloat16") resolves to on this machine."""
    from engine.dtypes import resolve_dtype

    return str(resolve_dtype(dtype)).removeprefix("torch.")


def choose_policy(settings: EngineSettings, work: Workload, spec: ModelSpec, allow_compression: bool = False,
                  budgets: dict | None = None) -> Plan:
    """The one policy decision, for `flexbatch plan` and for every engine of a job: the fastest policy for `work`
    on the settings' hardware (this machine's profile by default), within `budgets` (an engine passes the
    `plan_budgets` it then loads with; by default `plan_budgets(settings.budgets)`), keeping the settings' pins
    and compression; `allow_compression` lets the search choose 4-bit too. The hardware carries this process's
    memory room (`planning_process`)."""
    from engine.memory.room import memory_room
    from planner.search import search

    room = memory_room()
    hw = planning_process(hardware(settings.hardware), room)
    budgets = plan_budgets(settings.budgets, room) if budgets is None else budgets
    plan = search(spec, hw, work, pins=settings.pins, budgets=budgets, allow_compression=allow_compression)
    p = plan.prediction
    log.info("planned for %d prompts (%d tokens typical, %d max) + %d new on %s: %s; predicted %.1f s, "
             "%.1f tokens/s", work.num_prompts, work.prompt_len, work.max_prompt_len, work.gen_len, hw.name,
             plan.policy.to_json(), p.total_s, p.tokens_per_s)
    return plan


def planned_policy(settings: EngineSettings, planned: Policy) -> Policy:
    """The policy an engine runs from the planner's: with the user's weight format (the planner prices a pinned
    format's kernel but counts 4-bit bytes), unless the planner chose bfloat16 at rest itself, a lossless form it
    takes unasked (engine/compression/bf16.py)."""
    chose_bf16 = planned.compress_weight and planned.weight_format == "bf16" and "weight_format" not in settings.pins
    return planned if chose_bf16 else dataclasses.replace(planned, weight_format=settings.pinned("weight_format"))


def unplanned_policy(settings: EngineSettings, spec: ModelSpec) -> Policy:
    """The policy an engine runs without planning: the pins, Policy's defaults for the rest, and for the weights,
    where neither compress_weight nor weight_format is pinned, the form this machine class keeps the checkpoint in
    unasked (`bf16.kept_unasked`: bfloat16 at rest in a float32 run on the avx2 class), as the planner's search
    does."""
    from engine.compression import bf16
    from engine.dtypes import resolve_dtype

    policy = settings.policy
    if {"compress_weight", "weight_format"} & set(settings.pins):
        return policy
    if bf16.kept_unasked(spec, resolve_dtype(settings.dtype).itemsize):
        return dataclasses.replace(policy, compress_weight=True, weight_format="bf16")
    return policy


def prediction_record(p: Prediction) -> dict:
    return {"seconds": p.total_s, "tokens_per_s": p.tokens_per_s, "prefill_s": p.prefill_s,
            "decode_token_s": p.decode_token_s, "workload": {"prompt_len": p.workload.prompt_len,
            "max_prompt_len": p.workload.max_prompt_len, "gen_len": p.workload.gen_len,
            "num_prompts": p.workload.num_prompts}}
