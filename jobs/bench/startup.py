"""`flexbatch bench startup`: how long a small job waits before its first shard, as a user sees it.

Each round runs `flexbatch run --no-ray` in a fresh Python process (the operating system's caches warm, as on a
machine that ran a job before, and the hardware profile already measured) and marks, from inside that process,
when the planner, the model load and the warm-up generation end and when the first shard starts. The figure
the target is about is the time from spawning the process to the first shard, less the model load; it is
quoted as the median of the rounds, beside the load average (the machine is shared) and the CPU flags. The
child's CPU seconds at the first shard are quoted too: they move less than wall time on a busy machine."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import click

from jobs.bench import models as bm
from jobs.bench.report import run_and_save
from jobs.bench.side_by_side import side_by_side
from jobs.bench.table import Column, format_table, num
from jobs.common import PROJECT_ROOT, setup_logging

log = logging.getLogger(__name__)
MARK = "FLEXBATCH_STARTUP "
BUDGET_S = 3.0  # process start to first shard, less the model load (the target of this benchmark)
# the child: marks (wall clock, CPU seconds) at the phases of the one in-process worker, then the job itself
PROBE = r"""
import json, resource, sys, time
def mark(name, **kw):
    ru = resource.getrusage(resource.RUSAGE_SELF)
    record = {"mark": name, "t": time.time(), "cpu_s": ru.ru_utime + ru.ru_stime, **kw}
    print("FLEXBATCH_STARTUP " + json.dumps(record), file=sys.stderr, flush=True)
mark("interpreter")
import pipeline.execution.worker as w
import pipeline.plan.host as h
def timed(fn, name):
    def call(*args, **kwargs):
        t0 = time.time()
        out = fn(*args, **kwargs)
        mark(name, seconds=time.time() - t0)
        return out
    return call
h.choose_policy, h.load_engine, h.warm_up = timed(h.choose_policy, "planned"), timed(h.load_engine, "loaded"), timed(h.warm_up, "warmed")
run_shard = w.ShardWorker.run_shard
def first_shard(self, shard, _seen=[]):
    if not _seen:
        _seen.append(mark("shard"))
    return run_shard(self, shard)
w.ShardWorker.run_shard = first_shard
from jobs.cli import main
main(["run", *sys.argv[1:]], prog_name="flexbatch")
"""


@dataclass(frozen=True)
class StartupConfig:
    model: str = "demo"  # demo, a bench preset, or a checkpoint folder
    input: str = str(PROJECT_ROOT / "examples" / "prompts.parquet")
    max_new_tokens: int = 8
    repeats: int = 3
    cache_dir: str = str(bm.DEFAULT_CACHE_DIR)


def one_round(cfg: StartupConfig, model_dir: Path) -> dict:
    """Spawn one `flexbatch run --no-ray` and return its phases in seconds since the spawn."""
    with tempfile.TemporaryDirectory(prefix="flexbatch-startup-") as tmp:
        args = ["--model", str(model_dir), "--input", cfg.input, "--output", str(Path(tmp) / "out"), "--no-ray",
                "--max-new-tokens", str(cfg.max_new_tokens)]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        spawned = time.time()
        done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env,
                              cwd=PROJECT_ROOT)
        ended = time.time()
    if done.returncode != 0:
        raise click.ClickException(f"flexbatch run exited {done.returncode}: {done.stderr.strip()[-400:]}")
    marks = {m["mark"]: m for m in (json.loads(line[len(MARK):]) for line in done.stderr.splitlines()
                                     if line.startswith(MARK))}
    shard = marks["shard"]
    return {"first_shard_s": shard["t"] - spawned, "load_s": marks["loaded"]["seconds"],
            "plan_s": marks["planned"]["seconds"], "warm_up_s": marks["warmed"]["seconds"],
            "interpreter_s": marks["interpreter"]["t"] - spawned, "cpu_at_first_shard_s": shard["cpu_s"],
            "startup_less_load_s": shard["t"] - spawned - marks["loaded"]["seconds"], "whole_process_s": ended - spawned}


def run_startup(cfg: StartupConfig) -> dict:
    from jobs.bench.planner import model_dir_for
    from jobs.bench.workloads import cpu_flags

    model_dir = model_dir_for(cfg.model, cfg.cache_dir)
    run = partial(one_round, cfg, model_dir)

    def warm_up() -> tuple[float, ...]:  # the operating system's caches warm, the hardware profile measured if missing
        run()
        return os.getloadavg()

    res = side_by_side({"flexbatch run": run}, cfg.repeats, {"flexbatch run": warm_up})["flexbatch run"]
    rounds = res.pop("runs")
    median = {k: res[k] for k in rounds[0]}
    return {"config": asdict(cfg), "model_dir": str(model_dir), "cpu_flags": cpu_flags(),
            "load_average": {"before": res["warm_up"], "after": os.getloadavg()}, "rounds": rounds, "median": median,
            "budget_s": BUDGET_S, "met": median["startup_less_load_s"] <= BUDGET_S}


PHASES = (("first_shard_s", "process start to first shard"), ("load_s", "model load"),
          ("startup_less_load_s", f"start-up less the load (target <= {BUDGET_S:.0f} s)"),
          ("plan_s", "planning (imports torch, searches; no input read)"), ("warm_up_s", "warm-up generation"),
          ("interpreter_s", "Python interpreter start"), ("cpu_at_first_shard_s", "CPU seconds at first shard"),
          ("whole_process_s", "whole process"))


def table_text(report: dict) -> str:
    rows = [(what, num(report["median"][k], ".2f"), " ".join(num(r[k], ".2f") for r in report["rounds"]))
            for k, what in PHASES]
    la = report["load_average"]
    return format_table((Column("phase", 56, "<"), Column("median s", 8), Column("rounds s", 0, "<", 2)), rows, above=[
        f"flexbatch run --no-ray, {report['config']['model']} ({report['model_dir']}), {report['config']['input']}, "
        f"{report['config']['max_new_tokens']} new tokens; load average {la['before'][0]:.2f} before, "
        f"{la['after'][0]:.2f} after", f"CPU flags: {report['cpu_flags']}"],
        below=[f"start-up less the load: {report['median']['startup_less_load_s']:.2f} s, target <= "
               f"{BUDGET_S:.1f} s: {'met' if report['met'] else 'missed'}"])


@click.command("startup")
@click.option("--model", default=StartupConfig.model, show_default=True,
              help="demo, a bench preset (110m, 300m, ...), or a checkpoint folder.")
@click.option("--input", "input_", default=StartupConfig.input, show_default=True, help="The job's input.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=StartupConfig.max_new_tokens,
              show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=StartupConfig.repeats, show_default=True)
@click.option("--output", type=click.Path(path_type=Path), default=Path("out/bench/startup.json"),
              show_default=True)
def startup_command(input_: str, output: Path, **kw):
    """Seconds from process start to the first shard of a small `flexbatch run --no-ray` job."""
    setup_logging()
    report = run_and_save(run_startup, StartupConfig(input=input_, **kw), output)
    click.echo(table_text(report))
    click.echo(f"json: {output}")
