"""`flexbatch bench gpu`: FlexInfer's per-phase compute choices against FlexGen-like GPU offloading, on one GPU
given a budget smaller than the model's weights, and the planner's choice against the best measured policy.

For each batch size every policy completes the same prompts (exactly prompt_len ids, teacher-forced to gen_len
tokens that avoid EOS) side by side: interleaved rounds, median quoted. Each policy's engine is loaded once and
reused for every batch size (one GPU batch of that many rows); the planner's choice is searched per batch size
for the same budget and runs on a loaded engine whose weights sit where it wants them, else on one loaded for it."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import click

from engine.errors import FlexbatchError
from engine.memory.footprint import STAGED_LAYERS
from engine.options import parse_bytes
from engine.policy import Policy
from jobs.bench import models as bm
from jobs.bench.gpu_models import GPU_PRESETS, build_gpu_checkpoint, default_gpu_budget, weight_bytes
from jobs.bench.gpu_policies import (
    BASELINE,
    KINDS,
    BenchPolicy,
    bench_policies,
    load_key,
)
from jobs.bench.gpu_policies import place as place_batch
from jobs.bench.gpu_report import headline, summary, table_text
from jobs.common import setup_logging
from planner.microbench import timed_call

log = logging.getLogger(__name__)
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


class GpuMissingError(FlexbatchError):
    """The GPU benchmark was asked for on a machine without CUDA."""


@dataclass(frozen=True)
class GpuBenchConfig:
    model: str | None = None
    preset: str = "opt-1.3b"
    prompt_len: int = 512
    gen_len: int = 32
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    gpu_mem: float | None = None  # bytes; None: gpu_models.default_gpu_budget
    dtype: str = "bfloat16"
    repeats: int = 3
    policies: tuple[str, ...] = KINDS
    simulate_gpu: bool = False
    hardware: str | None = None
    cache_dir: str = str(bm.DEFAULT_CACHE_DIR)


def require_cuda(simulate: bool) -> str:
    """The GPU's name, "simulated on the CPU", or GpuMissingError naming the fix."""
    import torch

    if simulate:
        return "a GPU simulated on the CPU"
    if not torch.cuda.is_available():
        raise GpuMissingError(f"no CUDA device (torch {torch.__version__}): bench gpu measures GPU policies; run it "
                              "on a machine with an NVIDIA GPU and a CUDA build of torch, or pass --simulate-gpu to "
                              "run the same code on the CPU (a test of the code path, not a measurement)")
    return torch.cuda.get_device_name(0)


def bench_hardware(cfg: GpuBenchConfig, gpu_bytes: float):
    """The planner's view of the machine: --hardware, else this machine's cached profile. Simulated, a profile
    without a GPU gets its CPU as the GPU, with a memory copy as the link."""
    from planner.hardware import load_hardware
    from planner.profiler import load_or_profile

    hw = load_hardware(cfg.hardware) if cfg.hardware else load_or_profile()
    if cfg.simulate_gpu and not hw.has_gpu:
        copy = hw.cpu.elementwise_bytes_per_s / 2  # a clone reads and writes each byte
        hw = replace(hw, name=f"{hw.name}, its CPU as a simulated GPU", gpu=replace(hw.cpu, memory_bytes=gpu_bytes),
                     h2d_bytes_per_s=copy, d2h_bytes_per_s=copy)
    return hw


def load_engine(model_dir: Path, cfg: GpuBenchConfig, policy, gpu_bytes: float, offload: Path):
    from engine.engine import Engine

    return Engine.load(model_dir, dtype=cfg.dtype, policy=policy, budgets={"gpu": gpu_bytes},
                       simulate_gpu=cfg.simulate_gpu, offload_dir=offload)


def free_gpu_bytes(eng, p: Policy, gpu_bytes: float, spec, cfg: GpuBenchConfig) -> float:
    """What the budget leaves for a block's KV cache and activations under `p`: less what the engine holds on the
    GPU and, when it streams layers there, two staged layers."""
    streams = p.uses_gpu() and p.weight_gpu < 1
    staged = STAGED_LAYERS * spec.layer_bytes(DTYPE_BYTES[cfg.dtype]) if streams else 0
    return gpu_bytes - eng.devices.tiers["gpu"].used - staged


def policy_runner(eng, policy, spec, cfg: GpuBenchConfig, batch: int, eos, record: dict):
    """fn(gen_len) -> tokens generated for `batch` prompts under `policy`, its phase seconds kept after each call; a
    failure is recorded, not raised, so one policy that does not fit or fails cannot sink the others."""
    from jobs.bench.planner import requests_for
    from planner.workload import Workload

    def run(gen_len: int) -> int:
        if record.get("error"):
            return 0
        reqs = requests_for(spec, Workload(cfg.prompt_len, gen_len, batch, dtype=cfg.dtype), eos)
        try:
            out = eng.generate(reqs, policy)
        except (FlexbatchError, RuntimeError) as e:  # torch's out-of-memory is a RuntimeError
            record["error"] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            log.warning("%s at batch %d failed: %s", record["name"], batch, record["error"])
            return 0
        bad = [c for c in out if c.error or c.completion_tokens != gen_len]
        if bad:
            record["error"] = f"{len(bad)} rows failed or stopped early: {bad[0].error or bad[0].finish_reason}"
            return 0
        run.phase_seconds = dict(eng.phase_seconds)
        return sum(c.completion_tokens for c in out)

    return run


def predicted(spec, hw, cfg: GpuBenchConfig, batch: int, policy) -> float | None:
    from planner.predict import predict
    from planner.workload import Workload

    try:
        return predict(spec, hw, Workload(cfg.prompt_len, cfg.gen_len, batch, dtype=cfg.dtype), policy).total_s
    except (FlexbatchError, ValueError) as e:
        log.warning("no prediction for %s: %s", policy.to_json(), e)
        return None


class GpuBench:
    """The model, budget and planner view of one run, and the engines loaded for it (one per weight placement)."""

    def __init__(self, cfg: GpuBenchConfig):
        from engine.spec import load_model_spec
        from jobs.bench.planner import _eos

        self.cfg, self.device = cfg, require_cuda(cfg.simulate_gpu)
        self.model_dir = Path(cfg.model) if cfg.model else build_gpu_checkpoint(cfg.preset, cfg.cache_dir)
        self.spec = load_model_spec(self.model_dir)
        if cfg.prompt_len + cfg.gen_len > self.spec.max_position_embeddings:
            raise FlexbatchError(f"--prompt-len {cfg.prompt_len} + --gen-len {cfg.gen_len} exceeds the model's context "
                                 f"of {self.spec.max_position_embeddings}; shorten them")
        self.weight_bytes = weight_bytes(self.spec, DTYPE_BYTES[cfg.dtype])
        self.gpu_bytes = cfg.gpu_mem or default_gpu_budget(self.spec, DTYPE_BYTES[cfg.dtype])
        self.hw = bench_hardware(cfg, self.gpu_bytes)
        self.eos, self.offload = _eos(self.model_dir, self.spec), Path(cfg.cache_dir) / "offload"
        self.policies = bench_policies(self.spec, self.gpu_bytes, DTYPE_BYTES[cfg.dtype], max(cfg.batch_sizes),
                                       cfg.prompt_len, cfg.policies)
        self.engines: dict[str, object] = {}
        self.load_errors: dict[str, str] = {}
        for bp in self.policies:
            self.engine_for(bp.base, bp.name)
        self.fixed_keys = set(self.engines)

    def engine_for(self, policy, name: str):
        """The loaded engine whose weights sit as `policy` wants them, loading one if none does (None if that
        fails: the error is kept under `name`)."""
        key = load_key(policy, self.spec.num_layers)
        if key not in self.engines:
            try:
                self.engines[key] = load_engine(self.model_dir, self.cfg, policy, self.gpu_bytes, self.offload)
            except (FlexbatchError, RuntimeError) as e:
                self.load_errors[name] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                log.warning("could not load an engine for %s: %s", name, self.load_errors[name])
                return None
        return self.engines[key]

    def planner_choice(self, batch: int) -> tuple[BenchPolicy, str] | str:
        """The planner's policy for `batch` prompts in the budget and its description, or why there is none."""
        from planner.explain import describe
        from planner.search import search
        from planner.workload import Workload

        work = Workload(self.cfg.prompt_len, self.cfg.gen_len, batch, dtype=self.cfg.dtype)
        try:
            plan = search(self.spec, self.hw, work, budgets={"gpu": self.gpu_bytes})
        except FlexbatchError as e:
            return " ".join(f"{type(e).__name__}: {e}".split())[:300]
        return BenchPolicy("planner", "planner", plan.policy), describe(plan.prediction)

    def batch_rows(self, batch: int, warmup: bool) -> list[dict]:
        """Every policy at one batch size, side by side."""
        from jobs.bench.runs import generations
        from jobs.bench.side_by_side import summarize

        cfg, runs, rows = self.cfg, {}, []
        choice = self.planner_choice(batch) if "planner" in cfg.policies else None
        for bp in self.policies + ([choice[0]] if isinstance(choice, tuple) else []):
            fresh = load_key(bp.base, self.spec.num_layers) not in self.engines
            eng = self.engine_for(bp.base, bp.name)
            row = {"name": bp.name, "kind": bp.kind, "error": self.load_errors.get(bp.name)}
            rows.append(row)
            if eng is None:
                continue
            policy = bp.base if bp.kind == "planner" else place_batch(
                bp.base, self.spec, free_gpu_bytes(eng, bp.base, self.gpu_bytes, self.spec, cfg), batch, cfg.prompt_len,
                cfg.gen_len, DTYPE_BYTES[cfg.dtype])
            row.update(policy=policy.to_dict(), predicted_s=predicted(self.spec, self.hw, cfg, batch, policy))
            if bp.kind == "planner":
                row["description"] = choice[1]
            runs[bp.name] = policy_runner(eng, policy, self.spec, cfg, batch, self.eos, row)
            if fresh and not warmup:
                runs[bp.name](2)  # an engine loaded for the planner's choice warms up as the others did
        if isinstance(choice, str):
            rows.append({"name": "planner", "kind": "planner", "error": choice})
        measured = generations(runs, cfg.gen_len, cfg.repeats, warm_up=warmup)
        self.drop_unfixed()
        for row in rows:
            if row["name"] in measured and not row["error"]:
                m = measured[row["name"]]
                phases = summarize([r["phase_seconds"] for r in m["runs"]])
                row.update(seconds=m["seconds"], tokens_per_s=m["tokens_per_s"], tokens=m["tokens"],
                           runs_s=[r["seconds"] for r in m["runs"]], prefill_s=phases["prefill"],
                           decode_s=phases["decode"])
        return rows

    def drop_unfixed(self) -> None:
        """Close the engines loaded only for a planner's choice (each holds a copy of the weights)."""
        for key in set(self.engines) - self.fixed_keys:
            self.engines.pop(key).weights.close()

    def close(self) -> None:
        for eng in self.engines.values():
            eng.weights.close()


def run_gpu_bench(cfg: GpuBenchConfig, json_path: Path | None = None) -> dict:
    """Every batch size in turn; the report (also written to json_path after each batch size, so a run cut short
    keeps what it measured)."""
    from planner.workload import Workload

    bench, wall = timed_call(lambda: GpuBench(cfg))
    report = {"config": asdict(cfg), "machine": {**bm.machine_info(), "gpu": bench.device},
              "hardware": bench.hw.name, "model": {"dir": str(bench.model_dir), "model_type": bench.spec.model_type,
                                                   "layers": bench.spec.num_layers, "weight_bytes": bench.weight_bytes},
              "gpu_budget_bytes": bench.gpu_bytes, "baseline_gpu_layers": round(bench.policies[0].base.weight_gpu
                                                                              * bench.spec.num_layers),
              "batches": [], "summary": None}
    try:
        for i, batch in enumerate(sorted(cfg.batch_sizes)):
            rows, seconds = timed_call(partial(bench.batch_rows, batch, warmup=i == 0))
            wall += seconds
            work = Workload(cfg.prompt_len, cfg.gen_len, batch, dtype=cfg.dtype)
            report["batches"].append({"batch": batch, "rows": rows, "headline": headline(rows, work)})
            report["summary"] = summary(report["batches"])
            report["wall_seconds"] = wall
            if json_path is not None:
                json_path.parent.mkdir(parents=True, exist_ok=True)
                json_path.write_text(json.dumps(report, indent=1, default=str))
    finally:
        bench.close()
    return report


# ---- command line ----------------------------------------------------------------------------------------

def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(b) for b in text.split(",")}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise click.BadParameter(f"{text!r}: write positive batch sizes, comma-separated, e.g. 1,8,64")
    return sizes


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise click.BadParameter(f"unknown policy kinds {unknown}; known: {', '.join(KINDS)}")
    return (BASELINE, *[k for k in kinds if k != BASELINE])


_D = GpuBenchConfig()


@click.command("gpu")
@click.option("--model", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="An existing checkpoint folder (OPT or Llama family, safetensors) instead of a --preset.")
@click.option("--preset", type=click.Choice(sorted(GPU_PRESETS)), default=_D.preset, show_default=True,
              help="Random-weight model to build once under --cache-dir (opt-1.3b is the shape FlexGen's "
                   "comparison runs; tiny-* are for tests).")
@click.option("--gpu-mem", default=None, metavar="SIZE",
              help="GPU budget (e.g. 640MiB, 2GiB) that every policy must fit.  [default: the embeddings and LM head "
                   "plus a quarter of the layers' weights in --dtype, so that a large GPU behaves like a small one]")
@click.option("--prompt-len", type=click.IntRange(min=1), default=_D.prompt_len, show_default=True)
@click.option("--gen-len", type=click.IntRange(min=2), default=_D.gen_len, show_default=True)
@click.option("--batch-sizes", default=",".join(map(str, _D.batch_sizes)), show_default=True,
              help="Prompts per run, comma-separated; each runs as one GPU batch (the planner may cut it).")
@click.option("--policies", default=",".join(KINDS), show_default=True,
              help="Policy kinds to compare; offload (the baseline) always runs.")
@click.option("--dtype", type=click.Choice(sorted(DTYPE_BYTES)), default=_D.dtype, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=_D.repeats, show_default=True,
              help="Interleaved rounds; the median is quoted.")
@click.option("--hardware", default=None, metavar="FILE",
              help="Hardware spec for the planner.  [default: this machine's profile, measured once and cached]")
@click.option("--simulate-gpu", is_flag=True,
              help="Test only: the GPU tier is a separate pool on the CPU, so every code path runs without CUDA; "
                   "the figures are not GPU figures.")
@click.option("--cache-dir", default=_D.cache_dir, show_default=True, help="Built checkpoints and offloaded weights.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Also write the raw figures here (rewritten after each batch size).")
def gpu_command(model, batch_sizes, policies, gpu_mem, json_path, **kw):
    """FlexInfer's per-phase compute choices vs FlexGen-like GPU offloading, under a GPU budget smaller than the
    weights.

    \b
    Policies (prefill/decode; split@K: layers below K on the CPU, the rest on the GPU):
      offload gpu/gpu   the baseline: both phases on the GPU, the weights that do not fit streamed from the CPU
      cpu/cpu           everything on the CPU
      gpu/cpu           prefill on the GPU (weights streamed), decode on the CPU
      gpu/split@K       prefill on the GPU, decode split at a quarter, half and three quarters of the layers,
                        and where the layers that fit the budget run on the GPU
      split@K/split@K   both phases split at half the layers, and where the fitting layers run on the GPU
      planner           the planner's choice for each batch size and this budget, with its predicted seconds

    Weights stay where each policy's engine loaded them, for every batch size: the baseline keeps on the GPU
    the whole layers that fit the budget after two staged layers and the largest batch's activations; a split
    keeps its GPU layers' weights resident on the GPU (as many as fit) and its CPU layers' in CPU memory;
    cpu/cpu and gpu/cpu keep every weight on the CPU. The KV cache and activations go on the GPU per batch when
    they fit what is left (else on the CPU, where decode attention then runs).

    For each batch size the table gives every policy's latency (seconds for the batch), tokens/s, prefill and
    decode seconds, the planner's prediction for it and its latency against the baseline; then the best
    policy and the planner's choice against the baseline (FlexInfer reports -75 % on average) and the planner's
    choice against the best other policy (target: within +10 %).

    \b
    Examples:
      flexbatch bench gpu                                    # opt-1.3b, budget 1/4 of its weights
      flexbatch bench gpu --preset llama-1b --gpu-mem 1GiB --batch-sizes 1,16,64 --json out/bench/gpu.json
      flexbatch bench gpu --simulate-gpu --preset tiny-opt --prompt-len 16 --gen-len 4 --batch-sizes 1,2
    """
    setup_logging()
    try:
        budget = parse_bytes(gpu_mem, "--gpu-mem")
        cfg = GpuBenchConfig(model=str(model) if model else None, batch_sizes=_batch_sizes(batch_sizes),
                             policies=_kinds(policies), gpu_mem=budget, **kw)
        report = run_gpu_bench(cfg, json_path)
    except FlexbatchError as e:
        click.echo(f"flexbatch: error: {' '.join(str(e).splitlines())}", err=True)
        raise SystemExit(2) from None
    click.echo(table_text(report))
    click.echo(f"{report['wall_seconds']:.0f} s" + (f"; json: {json_path}" if json_path else ""))
