"""`flexbatch bench prefix`: few-shot workloads, where every row starts with one long shared prefix (HELM's
in-context examples, a wrangling table's k demonstrations), run with the shared prefix computed once
(engine/loop/shared_prefix.py) and without, side by side on one loaded engine:

    W5  rows x (512 shared + 64 own tokens), generate 8        (a 5-shot MMLU-shaped prompt)
    EM  rows x (900 shared + 100 own tokens), generate 4       (a k=10 entity-matching-shaped prompt)

Per line: generated tokens/s (median of the rounds, interleaved), its ratio to the run without sharing, whether
the greedy tokens are the same with and without sharing, and the rows a block can hold per GiB of KV cache and
activations (the engine's own budget arithmetic, `BlockExecutor.block_bytes`): what a memory limit lets a block
hold."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import torch

from engine.engine import Engine
from engine.policy import Policy
from jobs.bench import models as bm
from jobs.bench.options import BlockBenchConfig, bench_options
from jobs.bench.report import run_and_save
from jobs.bench.runs import generations, rows_runner
from jobs.bench.table import Column, format_table
from jobs.bench.workloads import cpu_flags
from jobs.common import setup_logging

log = logging.getLogger(__name__)
WORKLOADS = {"W5": (512, 64, 8), "EM": (900, 100, 4)}  # shared tokens, own tokens, generated
GIB = 2**30


@dataclass(frozen=True)
class PrefixConfig(BlockBenchConfig):
    workloads: tuple[str, ...] = ("W5", "EM")
    rows: int = 1024
    repeats: int = 2


def few_shot_prompts(rows: int, shared: int, own: int, vocab_size: int) -> list[list[int]]:
    """`rows` prompts of one random `shared`-token prefix, each followed by `own` random tokens of its own (the
    first differs from row to row's neighbours' in all but chance)."""
    prefix = bm.prompt_ids(1, shared, vocab_size, seed=1)[0]
    return [prefix + tail for tail in bm.prompt_ids(rows, own, vocab_size, seed=2)]


def rows_per_gib(eng: Engine, policy: Policy, shared: int, own: int, gen: int, share: bool) -> float:
    """Rows of a block that 1 GiB of KV cache and activations holds, by the engine's budget arithmetic."""
    ex = eng.executor(policy)
    rows = policy.block_size
    p = shared if share else 0
    need = sum(ex.block_bytes(rows, shared + own - p, shared + own + gen - p, shared=p).values())
    return rows * GIB / need


def run_prefix(cfg: PrefixConfig) -> dict:
    model_dir = bm.build_checkpoint(cfg.preset, cfg.cache_dir)
    base = Policy(gbs=cfg.gbs, num_gb=cfg.num_gb)
    eng = Engine.load(model_dir, dtype=cfg.dtype, policy=base)
    policies = {"flexbatch shared prefix": base, "flexbatch no sharing": dataclasses.replace(base, share_prefix=False)}
    results = []
    for name in cfg.workloads:
        shared, own, gen = WORKLOADS[name]
        prompts = few_shot_prompts(cfg.rows, shared, own, eng.spec.vocab_size)
        runners = {k: rows_runner(eng, prompts, p) for k, p in policies.items()}
        timed = generations(runners, gen, cfg.repeats)
        on, off = ([c.token_ids for c in r.completions] for r in runners.values())
        counts = runners["flexbatch shared prefix"].schedule_counts
        alone = timed["flexbatch no sharing"]["tokens_per_s"]
        results.append({
            "workload": name, "rows": cfg.rows, "shared": shared, "own": own, "generated": gen,
            "same_tokens": on == off, "shared_tokens_per_block": counts["shared_tokens"], "counts": counts,
            "lines": [{"line": k, "tokens_per_s": r["tokens_per_s"], "vs_no_sharing": r["tokens_per_s"] / alone,
                       "rows_per_gib": rows_per_gib(eng, p, shared, own, gen, p.share_prefix),
                       "runs_tokens_per_s": [x["tokens_per_s"] for x in r["runs"]]}
                      for (k, r), p in zip(timed.items(), policies.values())]})
    return {"config": asdict(cfg), "dtype": str(eng.dtype), "machine": bm.machine_info() | {"cpu_flags": cpu_flags()},
            "workloads": results}


COLUMNS = tuple(Column(t) for t in ("workload", "line", "tokens/s (median)", "vs no sharing", "same tokens",
                                     "block rows per GiB"))


def table_text(report: dict) -> str:
    rows = [(f"{w['workload']} {w['rows']} x ({w['shared']} shared + {w['own']}) gen {w['generated']}", ln["line"],
             f"{ln['tokens_per_s']:.1f}", f"{ln['vs_no_sharing']:.2f}x", "yes" if w["same_tokens"] else "NO",
             f"{ln['rows_per_gib']:.0f}") for w in report["workloads"] for ln in w["lines"]]
    return format_table(COLUMNS, rows, markdown=True, above=[
        f"CPU flags: {report['machine']['cpu_flags']}",
        f"{report['dtype']}, blocks of {report['config']['gbs']} x {report['config']['num_gb']} rows, one engine, "
        f"lines interleaved, median of {report['config']['repeats']} rounds after a warm-up:"])


@click.command("prefix")
@click.option("--workload", "workloads", type=click.Choice(sorted(WORKLOADS)), multiple=True,
              help="Workloads to run (repeatable).  [default: all]")
@click.option("--rows", type=click.IntRange(min=2), default=PrefixConfig.rows, show_default=True,
              help="Rows of each workload (the run without sharing prefills every row's whole prompt: on a 2-core "
                   "CPU, 128 rows take about a minute a round).")
@bench_options(PrefixConfig, "prefix.json", block=True)
def prefix_command(workloads, threads, output: Path, **kw):
    """W5 / EM few-shot workloads: a shared prefix computed once vs every row prefilled whole, side by side.

    \b
    Example:
      flexbatch bench prefix --rows 128 --threads 2
    """
    setup_logging()
    if threads:
        torch.set_num_threads(threads)
    cfg = PrefixConfig(workloads=tuple(workloads) or PrefixConfig.workloads, **kw)
    click.echo(table_text(run_and_save(run_prefix, cfg, output)))
