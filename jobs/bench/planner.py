"""`flexbatch bench planner`: the cost model's predicted time against the engine's measured time, over a grid of
workload x policy points on real checkpoints, and the planner's own choice against the best measured point.

Predictions use this machine's profile (`flexbatch profile`), never the measurements: a large error is fixed in
the profiler or the cost model, and the measured figures are reported as measured. For each workload the policies
(the grid's and the planner's) run in turn for `repeats` rounds and the median is quoted, so that the machine's
drift hits them alike; every row runs to gen_len tokens (teacher-forced ids that avoid EOS), as the cost model
assumes."""

from __future__ import annotations

import logging
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import click

from engine.engine import Engine
from engine.policy import Policy
from engine.request import Request, SamplingParams
from engine.spec import ModelSpec, load_model_spec
from jobs.bench import models as bm
from jobs.bench.report import run_and_save
from jobs.bench.side_by_side import side_by_side
from jobs.bench.table import Column, format_table, pct
from jobs.common import demo_model_dir, setup_logging
from planner.explain import describe
from planner.hardware import HardwareSpec, load_hardware
from planner.microbench import timed_call
from planner.predict import predict
from planner.profiler import load_or_profile
from planner.search import search
from planner.workload import Workload

log = logging.getLogger(__name__)
DTYPE = "bfloat16"
GRID = {  # name -> Policy fields; placement and compression vary, all on this machine's CPU
    "cpu 4x1": dict(gbs=4, num_gb=1),
    "cpu 16x1": dict(gbs=16, num_gb=1),
    "cpu 8x2": dict(gbs=8, num_gb=2),
    "weights on disk 16x1": dict(gbs=16, num_gb=1, weight_cpu=0.0),
    "half KV on disk 16x1": dict(gbs=16, num_gb=1, cache_cpu=0.5, act_cpu=0.5),
    "4-bit weights 16x1": dict(gbs=16, num_gb=1, compress_weight=True),
    "4-bit KV 16x1": dict(gbs=16, num_gb=1, compress_cache=True),
}
DEFAULT_WORKLOADS = ((64, 16, 16), (128, 32, 32))


@dataclass(frozen=True)
class PlannerBenchConfig:
    models: tuple[str, ...] = ("300m", "demo")
    workloads: tuple[tuple[int, int, int], ...] = DEFAULT_WORKLOADS  # (prompt_len, gen_len, num_prompts)
    policies: tuple[str, ...] = tuple(GRID)
    repeats: int = 3
    cache_dir: str = str(bm.DEFAULT_CACHE_DIR)
    hardware: str | None = None


def model_dir_for(name: str, cache_dir: str) -> Path:
    """A preset of jobs.bench.models (built once), `demo` for examples/demo-model, or a checkpoint folder."""
    if name in bm.PRESETS:
        return bm.build_checkpoint(name, cache_dir)
    if name == "demo":
        return demo_model_dir()
    return Path(name)


def requests_for(spec: ModelSpec, work: Workload, eos: tuple[int, ...]) -> list[Request]:
    """num_prompts prompts of exactly prompt_len ids, each forced to gen_len tokens that are never EOS."""
    avoid = set(eos) | {0}
    ok = [t for t in range(1, spec.vocab_size) if t not in avoid]
    prompts = bm.prompt_ids(work.num_prompts, work.prompt_len, spec.vocab_size)
    prompts = [[t if t not in avoid else ok[0] for t in row] for row in prompts]
    forced = tuple(ok[i % len(ok)] for i in range(work.gen_len))
    params = SamplingParams(max_new_tokens=work.gen_len)
    return [Request(f"r{i}", "", params, forced_ids=forced, prompt_ids=tuple(p)) for i, p in enumerate(prompts)]


def policy_line(model_dir: Path, policy: Policy, reqs: list[Request], offload: Path):
    """A policy as a line of `side_by_side`: the seconds of engine.generate over the requests. Each run loads the
    policy's engine, times one generate and closes it (an engine's prefetch thread keeps slowing other engines'
    compute while it lives); the first run warms each shape up first (2 tokens)."""
    warm = [Request(r.id, "", SamplingParams(max_new_tokens=2), r.forced_ids, r.prompt_ids)
            for r in reqs[: policy.block_size]]  # emptied once run

    def run() -> dict:
        eng = Engine.load(model_dir, dtype=DTYPE, policy=policy, offload_dir=offload)
        try:
            if warm:
                eng.generate(warm)
                warm.clear()
            out, seconds = timed_call(lambda: eng.generate(reqs))
        finally:
            eng.weights.close()
        bad = [c for c in out if c.error or c.completion_tokens != reqs[0].params.max_new_tokens]
        assert not bad, f"{len(bad)} rows failed or stopped early: {bad[0]}"
        return {"seconds": seconds}

    return run


def row(spec, hw, work, name, policy, figures: dict) -> dict:
    pred, measured = predict(spec, hw, work, policy), figures["seconds"]
    err = (pred.total_s - measured) / measured
    log.info("%s %s: predicted %.3f s, measured %.3f s (%+.1f%%)", work, name, pred.total_s, measured, 100 * err)
    return {"workload": asdict(work), "policy_name": name, "policy": policy.to_dict(), "predicted_s": pred.total_s,
            "measured_s": measured, "runs_s": [r["seconds"] for r in figures["runs"]], "error": err,
            "predicted_prefill_s": pred.prefill_s, "predicted_decode_token_s": pred.decode_token_s}


def _eos(model_dir: Path, spec: ModelSpec) -> tuple[int, ...]:
    from engine.engine import _eos_ids

    return _eos_ids(model_dir, spec)


def runs_alike(a: Policy, b: Policy, work: Workload) -> bool:
    """Whether two policies run the workload identically (a GPU batch larger than the workload is cut to it),
    so that their measured difference is the machine's noise."""
    def key(p: Policy) -> str:
        gbs = min(p.gbs, work.num_prompts)
        return replace(p, gbs=gbs, num_gb=min(p.num_gb, -(-work.num_prompts // gbs))).to_json()

    return key(a) == key(b)


def model_rows(cfg: PlannerBenchConfig, name: str, hw: HardwareSpec) -> tuple[list[dict], list[dict]]:
    """Grid points and the planner's choice for each workload of one model, measured side by side."""
    model_dir = model_dir_for(name, cfg.cache_dir)
    spec, offload = load_model_spec(model_dir), Path(cfg.cache_dir) / "offload"
    grid, chosen = [], []
    for p_len, g_len, n in cfg.workloads:
        work = Workload(min(p_len, spec.max_position_embeddings - g_len), g_len, n, dtype=DTYPE)
        plan = search(spec, hw, work, allow_compression=True)
        mine = "planner: " + describe(plan.prediction)
        policies = {pname: Policy(**GRID[pname]) for pname in cfg.policies} | {mine: plan.policy}
        reqs = requests_for(spec, work, _eos(model_dir, spec))
        runs = side_by_side({pname: policy_line(model_dir, p, reqs, offload) for pname, p in policies.items()},
                            cfg.repeats)
        rows = [dict(row(spec, hw, work, pname, p, runs[pname]), model=name) for pname, p in policies.items()]
        best = min(rows[:-1], key=lambda r: r["measured_s"])
        same = [r["policy_name"] for r in rows[:-1] if runs_alike(Policy(**r["policy"]), plan.policy, work)]
        rows[-1].update(best_grid=best["policy_name"], best_grid_s=best["measured_s"], same_as_grid=same,
                        vs_best=rows[-1]["measured_s"] / best["measured_s"] - 1)
        grid, chosen = grid + rows[:-1], chosen + rows[-1:]
    return grid, chosen


def run_planner_bench(cfg: PlannerBenchConfig) -> dict:
    hw = load_hardware(cfg.hardware) if cfg.hardware else load_or_profile()
    grid, chosen = [], []
    for name in cfg.models:
        g, c = model_rows(cfg, name, hw)
        grid, chosen = grid + g, chosen + c
    errors = [abs(r["error"]) for r in grid + chosen]
    summary = {"points": len(grid) + len(chosen), "median_abs_error": statistics.median(errors),
               "max_abs_error": max(errors), "target_median_abs_error": 0.15,
               "worst_chosen_vs_best": max(r["vs_best"] for r in chosen), "target_chosen_vs_best": 0.10}
    return {"config": asdict(cfg), "machine": bm.machine_info(), "hardware": hw.to_dict(), "grid": grid,
            "chosen": chosen, "summary": summary}


COLUMNS = (Column("model", 6, "<"), Column("P", 4), Column("G", 3), Column("N", 3), Column("policy", 34, "<", gap=2),
           Column("pred s", 8), Column("meas s", 8), Column("err", 7))


def table_text(report: dict) -> str:
    rows = [(r["model"], r["workload"]["prompt_len"], r["workload"]["gen_len"], r["workload"]["num_prompts"],
             r["policy_name"][:34], f"{r['predicted_s']:.3f}", f"{r['measured_s']:.3f}", pct(r["error"]))
            for r in report["grid"] + report["chosen"]]
    s = report["summary"]
    out = [f"{s['points']} points: median |error| {100 * s['median_abs_error']:.1f}% (target <= 15%), "
           f"max {100 * s['max_abs_error']:.1f}%"]
    for r in report["chosen"]:
        w = r["workload"]
        out.append(f"planner on {r['model']} P{w['prompt_len']} G{w['gen_len']} N{w['num_prompts']}: "
                   f"{r['measured_s']:.3f} s vs best grid point '{r['best_grid']}' {r['best_grid_s']:.3f} s "
                   f"({pct(r['vs_best'])}, target <= +10%)"
                   + (f"; runs as the grid's '{r['same_as_grid'][0]}' (the gap is noise)" if r["same_as_grid"] else ""))
    return format_table(COLUMNS, rows, below=out)


def _workloads(text: str) -> tuple[tuple[int, int, int], ...]:
    try:
        return tuple(tuple(int(x) for x in w.lower().split("x")) for w in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r}: write workloads as PxGxN, e.g. 64x16x16,128x32x32") from None


_D = PlannerBenchConfig()


@click.command("planner")
@click.option("--models", default=",".join(_D.models), show_default=True,
              help="Comma-separated: presets (tiny, 300m), demo, or checkpoint folders.")
@click.option("--workloads", default=",".join("x".join(map(str, w)) for w in _D.workloads), show_default=True,
              help="PROMPTxGENxPROMPTS, comma-separated.")
@click.option("--policies", default=",".join(GRID), show_default=True, help="Grid policies by name.")
@click.option("--repeats", type=click.IntRange(min=1), default=_D.repeats, show_default=True)
@click.option("--hardware", default=None, help="Hardware spec file.  [default: this machine's cached profile]")
@click.option("--cache-dir", default=_D.cache_dir, show_default=True)
@click.option("--output", type=click.Path(path_type=Path), default=Path("out/bench/planner.json"), show_default=True)
def planner_command(models, workloads, policies, output, **kw):
    """Predicted vs measured time over a workload x policy grid; the planner's choice vs the best point."""
    setup_logging()
    names = tuple(p.strip() for p in policies.split(","))
    unknown = [n for n in names if n not in GRID]
    if unknown:
        raise click.BadParameter(f"unknown grid policies {unknown}; known: {', '.join(GRID)}")
    cfg = PlannerBenchConfig(models=tuple(models.split(",")), workloads=_workloads(workloads), policies=names, **kw)

    report = run_and_save(run_planner_bench, cfg, output)
    click.echo(table_text(report))
    click.echo(f"{report['wall_seconds']:.0f} s; json: {output}")
