"""Timed generations for the benchmarks: one engine block or one `transformers` batch as a callable of gen_len,
timed one call at a time (`timed`), such callables as the lines of the one runner (`generations`), and the memory
one engine adds."""

from __future__ import annotations

import dataclasses
import gc
import time
from functools import partial
from pathlib import Path

import torch

from engine.engine import Engine
from engine.policy import Policy
from engine.request import Request, SamplingParams
from jobs.bench import models as bm
from jobs.bench.side_by_side import side_by_side
from planner.microbench import timed_call

DTYPE = "bfloat16"


def timed(fn, gen_len: int) -> dict:
    """One call of fn(gen_len) -> generated tokens, on the one timer: wall time, tokens/s and the peak RSS growth
    during the call; also the CPU seconds of this process over the call and tokens per CPU second, which another
    process sharing the cores barely changes where the line runs one thread (it counts OpenMP's spin-waiting
    where it runs more), and the call's prefill and decode seconds where fn keeps them (`fn.phase_seconds`)."""
    gc.collect()
    reset_ok = bm.reset_peak_rss()
    rss0 = bm.rss_bytes()
    cpu0 = time.process_time()
    tokens, seconds = timed_call(lambda: fn(gen_len))
    cpu_s = time.process_time() - cpu0
    growth = bm.peak_rss_bytes() - rss0 if reset_ok else None
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "peak_rss_growth_bytes": growth,
            "cpu_seconds": cpu_s, "tokens_per_cpu_s": tokens / cpu_s if cpu_s > 0 else None,
            "phase_seconds": getattr(fn, "phase_seconds", None)}


def generations(runners: dict, gen_len: int, repeats: int, warm_up: bool = True) -> dict[str, dict]:
    """Each runner (gen_len -> generated tokens) a line of `side_by_side`: a `timed` call of gen_len tokens a round,
    after a warm-up call of 2 tokens (the same shapes) unless warm_up is False."""
    lines = {name: partial(timed, fn, gen_len) for name, fn in runners.items()}
    return side_by_side(lines, repeats, {name: partial(fn, 2) for name, fn in runners.items()} if warm_up else None)


def best(results: dict[str, dict]) -> str:
    return max(results, key=lambda k: results[k]["tokens_per_s"])


def engine_runner(eng: Engine, prompts: list[list[int]], gbs: int, num_gb: int):
    """`rows_runner` of one block of gbs * num_gb prompts (the block shape only changes the schedule, not where the
    weights live, so one loaded engine serves every block shape)."""
    return rows_runner(eng, prompts[: gbs * num_gb], dataclasses.replace(eng.policy, gbs=gbs, num_gb=num_gb))


def rows_runner(eng: Engine, prompts: list[list[int]], policy: Policy, guided=None):
    """fn(gen_len) -> generated tokens: `generate` for every prompt under `policy` (and `guided`'s constraint), each
    row keeping its whole prompt and generating exactly gen_len tokens. After a call, `run.completions`,
    `run.phase_seconds` (prefill and decode) and `run.schedule_counts` hold its own."""
    def run(gen_len: int) -> int:
        reqs = [Request(f"r{i}", bm.prompt_text(ids), SamplingParams(max_new_tokens=gen_len, guided=guided))
                for i, ids in enumerate(prompts)]
        comps = eng.generate(reqs, policy)
        bad = [c for c in comps if c.error or c.prompt_tokens != len(prompts[0]) or c.completion_tokens != gen_len]
        assert not bad, f"{len(bad)} rows failed, ended early or were tokenized to another length: {bad[0]}"
        run.completions, run.phase_seconds = comps, dict(eng.phase_seconds)
        run.schedule_counts = dict(eng.schedule_counts)
        return sum(c.completion_tokens for c in comps)

    return run


def hf_runner(model, prompts: list[list[int]], batch: int):
    """`generate` on one batch, greedy, exactly gen_len new tokens per row (min_new_tokens = max_new_tokens)."""
    ids = torch.tensor(prompts[:batch])

    def run(gen_len: int) -> int:
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=gen_len, min_new_tokens=gen_len, pad_token_id=0)
        return (out.shape[1] - ids.shape[1]) * ids.shape[0]

    return run


def block_name(gbs: int, num_gb: int) -> str:
    return f"ours {gbs}x{num_gb}"


def memory_probe(model_dir: Path, policy: Policy, prompts, block: tuple[int, int], gen_len: int):
    """Load an engine and run the block once (untimed, it also warms up): the peak RSS over both, less the RSS
    before. The run matters: weights read from a safetensors file are mapped, and count once touched."""
    gc.collect()
    bm.reset_peak_rss()
    rss0 = bm.rss_bytes()
    eng = Engine.load(model_dir, dtype=DTYPE, policy=policy)
    engine_runner(eng, prompts, *block)(gen_len)
    return eng, bm.peak_rss_bytes() - rss0
