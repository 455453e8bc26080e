"""`flexbatch bench stops`: what checking stop strings costs per generated token, decoding the whole completion
at every step (as the engine did) against the incremental check (`engine/loop/stops.py`), side by side.

Each row feeds the tokens of a real text (the checkpoint's tokenizer, one token at a time) to a stop check whose
strings never occur, so every step is checked and no row ends early: the worst case, and the common one (most
steps of a row with stop strings find none). Both checks run on the same rows in turn, round by round, and the
median of the rounds is quoted, in microseconds per token and as a ratio."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import click

from engine.loop.stops import StopScanner
from engine.tokenizer import load_tokenizer
from jobs.bench.report import run_and_save
from jobs.bench.side_by_side import side_by_side
from jobs.bench.table import Column, format_table, num
from jobs.common import demo_model_dir, setup_logging
from planner.microbench import timed_call

STOPS = ("\n\nQ:", "</answer>", "###")  # never in the text below
TEXT = ("The quick brown fox jumps over the lazy dog; a naïve café serves crème brûlée. "
        "Q: What is 12 plus 30? A: 42. Product A: red kettle 2L. Product B: kettle red 2 l. Same? Yes\n")


@dataclass(frozen=True)
class StopsBenchConfig:
    model: str = ""  # a checkpoint folder; "" for the demo model
    lengths: tuple[int, ...] = (64, 256, 1024)
    rows: int = 8
    repeats: int = 3


def check_seconds(tokenizer, tokens: list[int], rows: int, incremental: bool) -> dict:
    """Seconds to check `rows` rows of `tokens`, token by token."""
    def check():
        for _ in range(rows):
            scanner, so_far = StopScanner(STOPS, tokenizer, incremental=incremental), []
            for t in tokens:
                so_far.append(t)
                assert scanner.check(so_far) is None

    return {"seconds": timed_call(check)[1]}


def run_stops(cfg: StopsBenchConfig) -> dict:
    from jobs.bench.workloads import cpu_flags

    model = Path(cfg.model) if cfg.model else demo_model_dir()
    tok = load_tokenizer(model)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    ids = ids * (1 + max(cfg.lengths) // len(ids))
    lines = []
    for n in cfg.lengths:
        res = side_by_side({way: partial(check_seconds, tok, ids[:n], cfg.rows, way == "incremental")
                            for way in ("full", "incremental")}, cfg.repeats)
        full, incremental, per_token = res["full"]["seconds"], res["incremental"]["seconds"], 1e6 / (cfg.rows * n)
        lines.append({"tokens": n, "full_us_per_token": full * per_token,
                      "incremental_us_per_token": incremental * per_token, "speedup": full / incremental})
    return {"config": asdict(cfg), "model": str(model), "cpu_flags": cpu_flags(), "lines": lines}


def table_text(report: dict) -> str:
    rows = [(str(ln["tokens"]), num(ln["full_us_per_token"], ".1f"), num(ln["incremental_us_per_token"], ".1f"),
             f"{ln['speedup']:.1f}x") for ln in report["lines"]]
    cols = (Column("tokens per row", 14), Column("full decode us/token", 21), Column("incremental us/token", 21),
            Column("speed-up", 9))
    return format_table(cols, rows, above=[f"stop strings {STOPS!r} (never found), {report['config']['rows']} rows, "
                                           f"tokenizer of {report['model']}; median of {report['config']['repeats']}",
                                           f"CPU flags: {report['cpu_flags']}"])


@click.command("stops")
@click.option("--model", default="", help="Checkpoint folder whose tokenizer is used.  [default: the demo model]")
@click.option("--length", "lengths", type=click.IntRange(min=1), multiple=True,
              help="Tokens per row (repeatable).  [default: 64, 256, 1024]")
@click.option("--rows", type=click.IntRange(min=1), default=StopsBenchConfig.rows, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=StopsBenchConfig.repeats, show_default=True)
@click.option("--output", type=click.Path(path_type=Path), default=Path("out/bench/stops.json"), show_default=True)
def stops_command(lengths, output: Path, **kw):
    """Stop-string checks per token: full decode every step vs incremental."""
    setup_logging()
    report = run_and_save(run_stops, StopsBenchConfig(lengths=tuple(lengths) or StopsBenchConfig.lengths, **kw),
                          output)
    click.echo(table_text(report))
    click.echo(f"json: {output}")
