"""The planner in a job: the workload read from the input (row counts from the footers, prompt lengths from a
sample of prompts), this machine's hardware profile (measured once, then cached), and the CPU budget the plan
must fit, turned into the `Policy` the engine runs."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from engine.spec import ModelSpec
from pipeline.parquet_io import InputFile
from pipeline.storage import open_parquet

if TYPE_CHECKING:  # the planner (cvxpy, torch) is imported when a job plans, not for --help
    from engine.policy import Policy
    from pipeline.settings import EngineSettings
    from planner.hardware import HardwareSpec
    from planner.predict import Prediction
    from planner.search import Plan
    from planner.workload import Workload

log = logging.getLogger(__name__)
SAMPLE_PROMPTS = 256
CPU_BUDGET_SHARE = 0.8  # of the memory this process may still take (the rest: its working set grows)
TYPICAL_QUANTILE = 0.75  # blocks are length-bucketed; a block pads to about this quantile of its lengths
STOP_PRIOR = 0.5  # share of its max_new_tokens a row with a stop string is expected to generate, until measured


def sample_prompts(files: tuple[InputFile, ...], column: str, limit: int = SAMPLE_PROMPTS) -> list:
    """Up to `limit` prompts (strings, or conversations from a messages column), read row group by row group
    (one column) from the first files."""
    out: list = []
    for f in files:
        if f.format == "openai":
            from pipeline.openai_batch import sample_batch_prompts

            out += sample_batch_prompts(f.path, limit - len(out))
            if len(out) >= limit:
                return out[:limit]
            continue
        with open_parquet(f.path) as pf:
            for g in range(pf.num_row_groups):
                values = pf.read_row_group(g, columns=[column]).column(0).to_pylist()
                out += [v for v in values if (isinstance(v, str) and v) or isinstance(v, list)]
                if len(out) >= limit:
                    return out[:limit]
    return out


def workload_from_input(files, column: str, tokenizer, spec: ModelSpec, gen_len: int, dtype: str,
                        num_prompts: int | None = None, stop: tuple[str, ...] = ()) -> Workload:
    """prompt_len: the TYPICAL_QUANTILE of the sampled token lengths; max_prompt_len: the longest sampled, both
    capped at what the context leaves after gen_len tokens; num_prompts: every row of `files` unless given
    (a worker plans for its share). gen_len and stop are the job's; the sampled rows' own max_new_tokens and
    stop columns give the generation lengths (`generation_lengths`)."""
    rows = num_prompts or sum(f.num_rows for f in files)
    longest, expected = generation_lengths(sample_row_lengths(files, gen_len, stop), spec)
    work = workload_from_prompts(sample_prompts(files, column), tokenizer, spec, longest, dtype, rows)
    return dataclasses.replace(work, expected_gen_len=min(expected, work.gen_len))


def sample_row_lengths(files: tuple[InputFile, ...], gen_len: int, stop: tuple[str, ...],
                       limit: int = SAMPLE_PROMPTS) -> list[tuple[int, bool]]:
    """(max_new_tokens, whether a stop string may end it) of up to `limit` rows of the first Parquet files: each
    row's own `max_new_tokens` and `stop` columns where present and valid, else the job's. Batch files give
    the job's (their rows are measured as they finish)."""
    out: list[tuple[int, bool]] = []
    for f in files:
        if f.format == "openai":
            continue
        with open_parquet(f.path) as pf:
            names = [c for c in ("max_new_tokens", "stop") if c in pf.schema_arrow.names]
            for g in range(pf.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                cols = pf.read_row_group(g, columns=names).to_pydict() if names else {}
                for m, s in zip(cols.get("max_new_tokens", [None] * n), cols.get("stop", [None] * n)):
                    ok = isinstance(m, (int, float)) and m >= 1 and float(m).is_integer()
                    out.append((int(m) if ok else gen_len, bool(s) if s is not None else bool(stop)))
                if len(out) >= limit:
                    return out[:limit]
    return out or [(gen_len, bool(stop))]


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
    return dataclasses.replace(work, expected_gen_len=min(float(work.gen_len), max(1.0, tokens / rows)))


def refill_choice(settings: EngineSettings, work: Workload, spec: ModelSpec, policy: Policy) -> Policy:
    """`policy` with refill on or off as the planner prices it for `work` (the settings' pin wins): a worker asks
    again as rows finish, with what they really generated (`measured_workload`)."""
    from planner.search import with_refill_choice

    chosen = with_refill_choice(spec, hardware(settings.hardware), work, policy, settings.planner_pins())
    return dataclasses.replace(policy, refill=chosen.policy.refill)


def workload_from_prompts(prompts: list, tokenizer, spec: ModelSpec, gen_len: int, dtype: str,
                          num_prompts: int) -> Workload:
    """The workload of `num_prompts` prompts shaped like `prompts` (strings, token-id lists or conversations)."""
    from planner.workload import Workload

    room = max(1, spec.max_position_embeddings - gen_len)
    lengths = sorted(min(room, n) for n in (prompt_length(tokenizer, p) for p in prompts) if n) or [1]
    typical = max(1, lengths[min(len(lengths) - 1, int(TYPICAL_QUANTILE * len(lengths)))])
    return Workload(typical, gen_len, max(1, num_prompts), max_prompt_len=max(typical, lengths[-1]), dtype=dtype)


def prompt_length(tokenizer, prompt) -> int:
    """Tokens of a prompt string, or of a conversation rendered by the chat template (0 if it cannot be)."""
    if isinstance(prompt, str):
        return len(tokenizer(prompt)["input_ids"])
    if all(isinstance(t, int) for t in prompt):  # a batch file's prompt given as token ids
        return len(prompt)
    from engine.chat import chat_prompt_ids, messages_problem

    if messages_problem(prompt):
        return 0
    try:
        return len(chat_prompt_ids(tokenizer, prompt))
    except ValueError:
        return 0


def plan_budgets(budgets: dict, room=None) -> dict:
    """The tiers' capacities for planning: the user's budgets, and for a CPU without one CPU_BUDGET_SHARE of
    the memory this process may still take (`engine.memory_room`: MemAvailable or the memory cgroup's room,
    whichever is smaller). A --cpu-mem above that room is lowered to it, with a warning: the kernel would kill
    the process (or thrash its page cache) before the budget is reached."""
    from engine.memory_room import memory_room

    out = dict(budgets or {})
    room = room or memory_room()
    if room.available_bytes is None:
        return out
    share = room.available_bytes * CPU_BUDGET_SHARE
    given = out.get("cpu")
    if given is None:
        out["cpu"] = share
        log.info("CPU budget %.0f MiB: %.0f %% of what this process may still take (%s)", share / 2**20,
                 CPU_BUDGET_SHARE * 100, room.describe())
    elif given > share:
        out["cpu"] = share
        log.warning("--cpu-mem %.0f MiB is more than this process may still take (%s); planning with %.0f MiB: "
                    "give --cpu-mem %.0fMiB or less, or raise the memory limit", given / 2**20, room.describe(),
                    share / 2**20, share / 2**20)
    return out


def planning_process(hw: HardwareSpec, room) -> HardwareSpec:
    """`hw` with the room of the process that plans (and runs the plan): it decides how the disk tier is read
    and whether its scratch is charged to a binding memory limit (`planner.hardware.HardwareSpec`)."""
    from dataclasses import replace

    if room.available_bytes is None:
        return hw
    if room.limit_binds:
        log.info("a memory cgroup limit binds (%s): disk-tier scratch (KV cache, activations) counts in the CPU "
                 "budget, and disk-tier weights above %.0f MiB are read with O_DIRECT", room.describe(),
                 room.available_bytes / 2 / 2**20)
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


def choose_policy(settings: EngineSettings, work: Workload, spec: ModelSpec, allow_compression: bool = False) -> Plan:
    """The one policy decision, for `flexbatch plan` and for every engine of a job: the fastest policy for `work`
    on the settings' hardware (this machine's profile by default), within `plan_budgets(settings.budgets)`,
    keeping the settings' pins and compression; `allow_compression` lets the search choose 4-bit too. The
    hardware carries this process's memory room (`planning_process`)."""
    from engine.memory_room import memory_room
    from planner.search import search

    room = memory_room()
    hw = planning_process(hardware(settings.hardware), room)
    plan = search(spec, hw, work, pins=settings.planner_pins(), budgets=plan_budgets(settings.budgets, room),
                  allow_compression=allow_compression)
    p = plan.prediction
    log.info("planned for %d prompts (%d tokens typical, %d max) + %d new on %s: %s; predicted %.1f s, "
             "%.1f tokens/s", work.num_prompts, work.prompt_len, work.max_prompt_len, work.gen_len, hw.name,
             plan.policy.to_json(), p.total_s, p.tokens_per_s)
    return plan


def prediction_record(p: Prediction) -> dict:
    return {"seconds": p.total_s, "tokens_per_s": p.tokens_per_s, "prefill_s": p.prefill_s,
            "decode_token_s": p.decode_token_s, "workload": {"prompt_len": p.workload.prompt_len,
            "max_prompt_len": p.workload.max_prompt_len, "gen_len": p.workload.gen_len,
            "num_prompts": p.workload.num_prompts}}
