"""Timed runs for the engine benchmarks: one engine block or one `transformers` batch as a callable of gen_len,
timed one call at a time and interleaved round by round (`side_by_side`), and the memory one engine adds."""

from __future__ import annotations

import dataclasses
import gc
import logging
import statistics
import time
from pathlib import Path

import torch

from engine.engine import Engine
from engine.policy import Policy
from engine.request import Request, SamplingParams
from jobs.bench import models as bm
from planner.microbench import timed_call

log = logging.getLogger(__name__)
DTYPE = "bfloat16"


def timed(fn, gen_len: int) -> dict:
    """One call of fn(gen_len) -> generated tokens, on the one timer: wall time, tokens/s and the peak RSS growth
    during the call; also the CPU seconds of this process over the call and tokens per CPU second, which another
    process sharing the cores barely changes where the line runs one thread (it counts OpenMP's spin-waiting
    where it runs more)."""
    gc.collect()
    reset_ok = bm.reset_peak_rss()
    rss0 = bm.rss_bytes()
    cpu0 = time.process_time()
    tokens, seconds = timed_call(lambda: fn(gen_len))
    cpu_s = time.process_time() - cpu0
    growth = bm.peak_rss_bytes() - rss0 if reset_ok else None
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "rss_growth_bytes": growth,
            "cpu_seconds": cpu_s, "tokens_per_cpu_s": tokens / cpu_s if cpu_s > 0 else None}


def side_by_side(runners: dict, gen_len: int, repeats: int, warmup: bool = True) -> dict[str, dict]:
    """Warm every runner up (2 tokens, same shapes), then time them interleaved, `repeats` rounds."""
    for name, fn in runners.items() if warmup else ():
        log.info("warm-up %s", name)
        fn(2)
    runs: dict[str, list[dict]] = {name: [] for name in runners}
    for r in range(repeats):
        for name, fn in runners.items():
            runs[name].append(timed(fn, gen_len))
            log.info("repeat %d %s: %.2f s, %.1f tokens/s", r + 1, name, runs[name][-1]["seconds"],
                     runs[name][-1]["tokens_per_s"])
    return {name: summarize(v) for name, v in runs.items()}


def summarize(runs: list[dict]) -> dict:
    growth = [r["rss_growth_bytes"] for r in runs if r["rss_growth_bytes"] is not None]
    per_cpu = [r["tokens_per_cpu_s"] for r in runs if r.get("tokens_per_cpu_s")]
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
            "tokens_per_cpu_s": statistics.median(per_cpu) if per_cpu else None,
            "seconds": statistics.median(r["seconds"] for r in runs), "tokens": runs[0]["tokens"],
            "peak_rss_growth_bytes": max(growth) if growth else None, "runs": runs}


def best(results: dict[str, dict]) -> str:
    return max(results, key=lambda k: results[k]["tokens_per_s"])


def engine_runner(eng: Engine, prompts: list[list[int]], gbs: int, num_gb: int):
    """Generate for one block of gbs * num_gb prompts (the block shape only changes the schedule, not where
    the weights live, so one loaded engine serves every block shape)."""
    rows = prompts[: gbs * num_gb]

    def run(gen_len: int) -> int:
        reqs = [Request(f"r{i}", bm.prompt_text(ids), SamplingParams(max_new_tokens=gen_len))
                for i, ids in enumerate(rows)]
        comps = eng.generate(reqs, dataclasses.replace(eng.policy, gbs=gbs, num_gb=num_gb))
        bad = [c for c in comps if c.error or c.prompt_tokens != len(rows[0])]
        assert not bad, f"{len(bad)} rows failed or were tokenized to another length: {bad[0]}"
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
