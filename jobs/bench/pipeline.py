"""`flexbatch bench pipeline`: the job pipeline (local Ray, Parquet in and out, manifest commits) against the bare
engine on the same rows and the same policy, 1 engine x 2 threads against 2 engines x 1 thread, and the same rows
as an OpenAI Batch file (JSONL in and out) against Parquet.

Each round runs, in turn: the bare engine (`Engine.generate` over every row, in this process), the pipeline with
one engine, and the pipeline with two; the median over rounds is quoted. Two times are compared:
  - steady state: generation in the bare engine vs the pipeline's run from the first shard handed out to the
    last one committed (reading shards, tokenizing, Ray calls, writing parts, manifest lines);
  - end to end: model load + generation vs the whole job (starting Ray, the actors' setup, the run, _SUCCESS).
In float32 the completions of every pipeline run must equal the bare engine's, row by row (greedy); in bfloat16
the rows of a block depend on how rows are grouped (a shard is grouped on its own), and GEMM rounding depends on
the batch, so the share of identical rows is reported instead."""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import click
import pyarrow as pa
import pyarrow.parquet as pq

from engine.policy import Pins, Policy
from engine.request import SamplingParams
from jobs.bench import models as bm
from jobs.bench.report import run_and_save
from jobs.bench.side_by_side import side_by_side
from jobs.bench.table import Column, format_table
from jobs.common import PROJECT_ROOT, setup_logging
from planner.microbench import timed_call

log = logging.getLogger(__name__)
TARGET_OVERHEAD = 0.05
DEMO_PROMPTS = PROJECT_ROOT / "examples" / "prompts.parquet"


@dataclass(frozen=True)
class PipelineBenchConfig:
    model: str = "demo"
    dtype: str = "bfloat16"
    rows: int = 4096
    gen_len: int = 32
    shard_rows: int | None = None
    repeats: int = 2
    cache_dir: str = str(bm.DEFAULT_CACHE_DIR)


def write_rows(folder: Path, rows: int) -> Path:
    """`rows` prompts (the demo prompts, cycled, each made distinct by a numbered prefix) in one Parquet file."""
    base = pq.read_table(DEMO_PROMPTS, columns=["prompt"]).column("prompt").to_pylist()
    prompts = [f"{i}. {base[i % len(base)]}" for i in range(rows)]
    path = folder / "rows.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(rows)], "prompt": prompts}), path, row_group_size=256)
    return path


def write_batch_file(folder: Path, data: Path) -> Path:
    """The rows of `data` as an OpenAI Batch file of /v1/completions requests (custom_id = the row's id)."""
    import json

    rows = pq.read_table(data, columns=["id", "prompt"]).to_pylist()
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps({"custom_id": r["id"], "method": "POST", "url": "/v1/completions",
                                        "body": {"prompt": r["prompt"]}}) + "\n" for r in rows))
    return path


def plan_once(model_dir: Path, data: Path, cfg: PipelineBenchConfig) -> Policy:
    """The policy the planner picks for one engine on this machine; every run below uses it."""
    from pipeline.job import RunConfig, prepare_job
    from pipeline.plan.planning import choose_policy, job_workload

    config = RunConfig(input=str(data), output=data.parent / "plan-only", model=model_dir, dtype=cfg.dtype,
                       params=SamplingParams(max_new_tokens=cfg.gen_len))
    job = prepare_job(config)
    plan = choose_policy(config, job_workload(job), job.spec)
    log.info("policy for the benchmark: %s (predicted %.1f s)", plan.policy.to_json(), plan.prediction.total_s)
    return plan.policy


def bare_engine(model_dir: Path, data: Path, policy: Policy, cfg: PipelineBenchConfig, completions: dict) -> dict:
    """Model load and `generate` over every row, timed apart; the completions by id written to `completions`."""
    from engine.engine import Engine
    from pipeline.input.requests import build_requests, row_ids
    from pipeline.plan.host import warm_up

    table = pq.read_table(data)
    items = build_requests(table, row_ids(table, "rows"), "prompt", SamplingParams(max_new_tokens=cfg.gen_len))
    def load():
        eng = Engine.load(model_dir, dtype=cfg.dtype, policy=policy)
        warm_up(eng)  # as each pipeline worker does in its setup
        return eng

    eng, load_s = timed_call(load)
    try:
        out, steady_s = timed_call(lambda: eng.generate(items))
    finally:
        eng.weights.close()
    completions.update((c.id, c.text) for c in out)
    return {"steady_s": steady_s, "end_to_end_s": load_s + steady_s, "tokens": sum(c.completion_tokens for c in out)}


def pipeline_run(model_dir: Path, data: Path, tmp: Path, policy: Policy, cfg: PipelineBenchConfig, workers: int,
                 name: str, expected: dict[str, str]) -> dict:
    """The job over the rows in `data`, its output in a fresh folder under `tmp`: its times, and the share of its rows
    equal to the bare engine's completions of the round (`expected`; every row in float32)."""
    import ray

    from pipeline.execution.driver import run_job
    from pipeline.job import RunConfig

    config = RunConfig(input=str(data), output=Path(tempfile.mkdtemp(dir=tmp)) / "out", model=model_dir, dtype=cfg.dtype, pins=Pins.of(policy), plan=False,
                       params=SamplingParams(max_new_tokens=cfg.gen_len), workers=workers,
                       shard_rows=cfg.shard_rows)
    try:
        summary, wall = timed_call(lambda: run_job(config))
    finally:
        ray.shutdown()
    if not summary.ok or summary.skipped_shards:
        raise RuntimeError(f"the pipeline run was not a clean full run: {summary.failed_shards}")
    got = dict(pair for p in summary.parts for pair in _completions(Path(p)))
    if sorted(got) != sorted(expected):
        raise AssertionError(f"{name}: the output ids differ from the input's")
    same = sum(got[k] == expected[k] for k in expected) / len(expected)
    if cfg.dtype == "float32" and same < 1:
        raise AssertionError(f"{name}: {same:.1%} of the rows equal the bare engine's")
    return {"steady_s": summary.wall_seconds, "end_to_end_s": wall, "tokens": summary.run_completion_tokens,
            "shards": summary.shards, "threads": [w["threads"] for w in summary.workers], "same_rows": same}


def _completions(part: Path) -> list[tuple[str, str]]:
    """(id, completion) of a Parquet part's rows, or (custom_id, first choice's text) of a JSONL part's lines."""
    import json

    if part.suffix == ".jsonl":
        lines = [json.loads(t) for t in part.read_text().splitlines()]
        return [(o["custom_id"], o["response"]["body"]["choices"][0]["text"]) for o in lines]
    return [(r["id"], r["completion"]) for r in pq.read_table(part, columns=["id", "completion"]).to_pylist()]


def run_pipeline_bench(cfg: PipelineBenchConfig) -> dict:
    from jobs.bench.planner import model_dir_for

    model_dir = model_dir_for(cfg.model, cfg.cache_dir)
    with tempfile.TemporaryDirectory(prefix="flexbatch-bench-") as tmp:
        data = write_rows(Path(tmp), cfg.rows)
        batch = write_batch_file(Path(tmp), data)
        policy = plan_once(model_dir, data, cfg)
        expected: dict[str, str] = {}  # the bare engine's completions, each round
        lines = {"engine": partial(bare_engine, model_dir, data, policy, cfg, expected)}
        for name, source, workers in (("pipeline 1x2", data, 1), ("pipeline 2x1", data, 2), ("openai 1x2", batch, 1)):
            lines[name] = partial(pipeline_run, model_dir, source, Path(tmp), policy, cfg, workers, name, expected)
        return report(cfg, policy, side_by_side(lines, cfg.repeats))


def report(cfg: PipelineBenchConfig, policy: Policy, res: dict[str, dict]) -> dict:
    """The lines of `side_by_side`'s figures: the pipeline's times against the bare engine's, each a median."""
    eng, one, two, jsonl = res["engine"], res["pipeline 1x2"], res["pipeline 2x1"], res["openai 1x2"]
    lines = [
        _line("overhead-steady", "pipeline 1x2 vs bare engine, steady state (s)", one["steady_s"], eng["steady_s"],
              TARGET_OVERHEAD),
        _line("overhead-e2e", "pipeline 1x2 vs bare engine, end to end (s)", one["end_to_end_s"],
              eng["end_to_end_s"], None),
        _line("workers", "2 engines x 1 thread vs 1 engine x 2 threads, steady state (s)", two["steady_s"],
              one["steady_s"], None),
        _line("batch-format", "OpenAI Batch JSONL vs Parquet, pipeline 1x2, steady state (s)", jsonl["steady_s"],
              one["steady_s"], None),
    ]
    runs = {name: r["runs"] for name, r in res.items()}
    same = {name: min(r["same_rows"] for r in rs) for name, rs in runs.items() if name != "engine"}
    med = {name: {k: r[k] for k in ("steady_s", "end_to_end_s", "tokens")} for name, r in res.items()}
    return {"config": dataclasses.asdict(cfg), "policy": policy.to_dict(), "lines": lines, "runs": runs,
            "same_rows_as_engine": same, "medians": med, "machine": bm.machine_info()}


def _line(id_: str, what: str, ours: float, baseline: float, target: float | None) -> dict:
    overhead = ours / baseline - 1 if baseline > 0 else None
    return {"id": id_, "what": what, "ours": ours, "baseline": baseline, "overhead": overhead,
            "target": target, "met": None if target is None or overhead is None else overhead <= target}


COLUMNS = (Column("line", 17, "<"), Column("what", 66, "<"), Column("ours", 8), Column("base", 8),
           Column("change", 8), Column("target", 7))


def table_text(rep: dict) -> str:
    def target(line):
        return "" if line["target"] is None else f"<={line['target']:.0%}" + (" ok" if line["met"] else " MISS")

    return format_table(COLUMNS, [(line["id"], line["what"], f"{line['ours']:.2f}", f"{line['baseline']:.2f}",
                                   f"{line['overhead']:+.1%}", target(line)) for line in rep["lines"]])


_D = PipelineBenchConfig()


@click.command("pipeline")
@click.option("--model", default=_D.model, show_default=True,
              help="A preset of the engine benchmark (tiny, 300m), demo, or a checkpoint folder.")
@click.option("--rows", type=click.IntRange(min=2), default=_D.rows, show_default=True)
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default=_D.dtype, show_default=True,
              help="float32 also checks that every completion equals the bare engine's.")
@click.option("--gen-len", type=click.IntRange(min=1), default=_D.gen_len, show_default=True)
@click.option("--shard-rows", type=click.IntRange(min=1), default=None,
              help="Rows per shard.  [default: the pipeline's own choice]")
@click.option("--repeats", type=click.IntRange(min=1), default=_D.repeats, show_default=True)
@click.option("--cache-dir", default=_D.cache_dir, show_default=True)
@click.option("--output", type=click.Path(path_type=Path), default=Path("out/bench/pipeline.json"), show_default=True)
def pipeline_command(output: Path, **kw):
    """The pipeline on a local Ray vs the bare engine (same rows, same policy); 1x2 vs 2x1 engines x threads; the
    rows as an OpenAI Batch file vs Parquet."""
    setup_logging()
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")

    rep = run_and_save(run_pipeline_bench, PipelineBenchConfig(**kw), output)
    click.echo(table_text(rep))
    same = ", ".join(f"{k} {v:.1%}" for k, v in rep["same_rows_as_engine"].items())
    click.echo(f"rows identical to the bare engine's ({rep['config']['dtype']}): {same}")
    click.echo(f"{rep['wall_seconds']:.0f} s; json: {output}")
