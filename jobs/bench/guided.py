"""`flexbatch bench guided`: the cost of constrained decoding (engine/loop/grammar.py) on a bulk workload, rows
whose answer must be one of a few choices vs the same rows unconstrained, side by side on one loaded engine.

Both lines generate the same number of tokens per row: each choice is `gen - 1` tokens long (the row then ends
with EOS, its last token; `gen` tokens for a checkpoint without EOS, whose rows end with the grammar), and the
free rows generate `gen` tokens. The benchmark checkpoints' tokenizer is
word-level (tokens `w1` .. `wN`, joined by spaces when decoded) and xgrammar reads each token as its own text, so a
choice is written as its tokens' text run together (`w5w17w3`). Per line: generated tokens/s (median of the
rounds, interleaved), its ratio to the free line, and the decode seconds per row-step."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import torch

from engine.engine import Engine
from engine.guided import Guided
from engine.policy import Policy
from jobs.bench import models as bm
from jobs.bench.options import BlockBenchConfig, bench_options
from jobs.bench.report import run_and_save
from jobs.bench.runs import generations, rows_runner
from jobs.bench.table import Column, format_table
from jobs.bench.workloads import cpu_flags
from jobs.common import setup_logging

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GuidedConfig(BlockBenchConfig):
    rows: int = 128
    prompt_len: int = 64
    gen: int = 16
    choices: int = 4


def choice_constraint(n: int, length: int) -> Guided:
    """`n` choices of `length` random word tokens each, spelled as xgrammar reads them (see the module doc). The
    words are w1 .. w9: with longer ids a prefix of one (w12 of w123) is a token too, which the grammar would allow
    and no token could then continue."""
    return Guided(choice=tuple("".join(f"w{i}" for i in ids) for ids in bm.prompt_ids(n, length, 10, seed=3)))


def run_guided(cfg: GuidedConfig) -> dict:
    model_dir = bm.build_checkpoint(cfg.preset, cfg.cache_dir)
    policy = Policy(gbs=cfg.gbs, num_gb=cfg.num_gb)
    eng = Engine.load(model_dir, dtype=cfg.dtype, policy=policy)
    prompts = bm.prompt_ids(cfg.rows, cfg.prompt_len, eng.spec.vocab_size)
    guided = choice_constraint(cfg.choices, cfg.gen - 1 if eng.eos_ids else cfg.gen)  # without EOS: ends there
    runners = {"unconstrained": rows_runner(eng, prompts, policy),
               f"choice of {cfg.choices}": rows_runner(eng, prompts, policy, guided)}
    timed = generations(runners, cfg.gen, cfg.repeats)
    free = timed["unconstrained"]["tokens_per_s"]
    answers = [c.text for c in runners[f"choice of {cfg.choices}"].completions]  # the decode joins words with spaces
    step_s = {k: r.phase_seconds["decode"] / max(1, r.schedule_counts["row_steps"]) for k, r in runners.items()}
    return {"config": asdict(cfg), "dtype": str(eng.dtype), "machine": bm.machine_info() | {"cpu_flags": cpu_flags()},
            "answers_are_choices": all(t.replace(" ", "") in guided.choice for t in answers),
            "lines": [{"line": k, "tokens_per_s": r["tokens_per_s"], "vs_unconstrained": r["tokens_per_s"] / free,
                       "decode_ms_per_row_step": 1e3 * step_s[k],
                       "runs_tokens_per_s": [x["tokens_per_s"] for x in r["runs"]]} for k, r in timed.items()]}


COLUMNS = tuple(Column(t) for t in ("workload", "line", "tokens/s (median)", "vs unconstrained",
                                     "decode ms / row-step"))


def table_text(report: dict) -> str:
    c = report["config"]
    work = f"{c['rows']} x {c['prompt_len']} gen {c['gen']}"
    rows = [(work, ln["line"], f"{ln['tokens_per_s']:.1f}", f"{ln['vs_unconstrained']:.3f}x",
             f"{ln['decode_ms_per_row_step']:.3f}") for ln in report["lines"]]
    return format_table(COLUMNS, rows, markdown=True, above=[
        f"CPU flags: {report['machine']['cpu_flags']}",
        f"{report['dtype']}, preset {c['preset']}, blocks of {c['gbs']} x {c['num_gb']} rows, one engine, lines "
        f"interleaved, median of {c['repeats']} rounds after a warm-up; every constrained answer a choice: "
        f"{'yes' if report['answers_are_choices'] else 'NO'}"])


@click.command("guided")
@click.option("--rows", type=click.IntRange(min=1), default=GuidedConfig.rows, show_default=True)
@click.option("--prompt-len", type=click.IntRange(min=1), default=GuidedConfig.prompt_len, show_default=True)
@click.option("--gen", type=click.IntRange(min=2), default=GuidedConfig.gen, show_default=True,
              help="Tokens generated per row on both lines (a choice is gen - 1 tokens, then EOS).")
@click.option("--choices", type=click.IntRange(min=1), default=GuidedConfig.choices, show_default=True)
@bench_options(GuidedConfig, "guided.json", block=True)
def guided_command(threads, output: Path, **kw):
    """A bulk workload with a choice constraint vs without, side by side (same tokens per row).

    \b
    Example:
      flexbatch bench guided --threads 2
    """
    setup_logging()
    if threads:
        torch.set_num_threads(threads)
    click.echo(table_text(run_and_save(run_guided, GuidedConfig(**kw), output)))
