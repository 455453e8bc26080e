"""`flexbatch bench ops`: where one engine run's CPU time goes, op by op, before anything is tuned. For each
compute dtype and weight format asked for it loads the random-weight benchmark model with the CPU-only policy (one
block of every row), warms it up (a prefill and one decode step), runs the workload once
unprofiled (the reference wall time) and once under `torch.profiler`, and groups the self CPU time of the ops on
the compute thread by phase (the engine's profiler ranges "prefill" and "decode", engine/trace.py; "rest" is the
call around the steps) and by category:

    gemm          the GEMM kernels (aten::mm / addmm / _int_mm, oneDNN's _linear_pointwise, aten's and the
                  project's int4 and int8 kernels)
    linear other  the rest of a Linear call: activation quantization and rescaling (int8), weight dequantization
                  on first need, casts, the wrappers' own time
    attention     everything under the KV cache's attend: K/V stores, SDPA, the chunked decode kernel or the
                  project's own attention kernels
    elementwise   norms, rotary positions, SiLU, residual adds (the project's fused kernels or PyTorch's), casts
                  outside the calls above
    reorder       oneDNN reorders that run as ops of their own (mkldnn::_reorder_linear_weight, to_mkldnn)
    sampling      choosing the next tokens
    other         views, allocations, the embedding lookup
    overhead      the wall time of the phase less its ops' self time: Python, dispatch between ops, and the
                  profiler's own cost per op (the gap between the profiled and the unprofiled wall time)

Linear calls, attention and sampling are told apart by the ranges the engine marks them with (engine/trace.py),
not by op names: the decode attention's matmuls are aten::bmm and its softmax is elementwise ops; the compiled
kernels' calls count as ops of their own. GEMM FLOPs come from the recorded shapes (2 M N K per call); their rate is quoted
next to the same microbenchmark as `bench workloads` / `bench score` (the model's widest layer shape) at the row
count that carries most of the phase's GEMM FLOPs, in the dtype of that work (int8 x int8 where _int_mm does most
of it). Ops of other threads (the weight prefetcher) are summed apart. Reorders inside one oneDNN call (a brgemm
matmul packing a plain weight as it goes) are no separate op: the oneDNN verbose pass (a prefill and one decode
step) names each primitive's weight layout, plain (packed inside every call) or blocked (reordered once)."""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import re
import sys
import tempfile
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import torch

from engine import trace
from engine.engine import Engine
from engine.errors import FlexbatchError
from engine.kernels import onednn_dense
from engine.kernels.int4_tiles import GEMM_RANGE
from engine.models import PHASES
from engine.policy import WEIGHT_FORMATS, Policy
from engine.spec import load_model_spec
from jobs.bench import models as bm
from jobs.bench.memory_limit import parse_workload
from jobs.bench.runs import engine_runner
from jobs.bench.table import Column, format_table
from jobs.bench.workloads import cpu_flags, gemm_peak_gflops
from jobs.common import fail, setup_logging
from planner.microbench import best_seconds, gflops, timed_call

log = logging.getLogger(__name__)

# 64 rows of the "bulk" shape (512x128+32 takes minutes per line on a few cores; the shares hardly move with rows)
WORKLOAD = "64x128+32"
UNCOMPRESSED = "uncompressed"
CATEGORIES = ("gemm", "linear other", "attention", "elementwise", "reorder", "sampling", "other", "overhead")
REST = "rest"  # the call outside the schedule's steps: requests in, completions out
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_int_mm",
                      "mkldnn::_linear_pointwise", "aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int4pack_mm",
                      "aten::_weight_int8pack_mm"})
REORDER_OPS = frozenset({"aten::to_mkldnn", "aten::to_dense", "aten::_to_dense"})
OTHER_OPS = frozenset(f"aten::{n}" for n in (
    "view", "reshape", "_reshape_alias", "_unsafe_view", "view_as", "as_strided", "transpose", "t", "mT", "permute",
    "slice", "select", "split", "split_with_sizes", "chunk", "narrow", "unbind", "unsqueeze", "squeeze", "expand",
    "expand_as", "flatten", "unflatten", "detach", "alias", "lift_fresh", "resolve_conj", "resolve_neg", "empty",
    "empty_like", "empty_strided", "new_empty", "resize_", "item", "_local_scalar_dense", "result_type",
    "is_nonzero", "contiguous", "embedding", "index_select"))


@dataclass(frozen=True)
class OpProfileConfig:
    workload: str = WORKLOAD  # ROWSxPROMPT+GEN
    preset: str = "100m"
    dtypes: tuple[str, ...] = ("auto",)
    formats: tuple[str, ...] = (UNCOMPRESSED,)  # UNCOMPRESSED or a WEIGHT_FORMATS entry
    threads: int | None = None  # torch's threads, set by the command; None: torch's
    onednn_verbose: bool = True
    cache_dir: str = str(bm.DEFAULT_CACHE_DIR)

    @property
    def shape(self) -> tuple[int, int, int]:
        return workload_shape(self.workload)


def workload_shape(text: str) -> tuple[int, int, int]:
    """(rows, prompt tokens, generated tokens) of a workload written ROWSxPROMPT+GEN; ValueError naming it where it
    does not parse."""
    try:
        return parse_workload(text)[1:]
    except ValueError:
        raise ValueError(f"{text!r}: write a workload as ROWSxPROMPT+GEN, e.g. {WORKLOAD}") from None


def checkpoint(preset: str, cache_dir: str) -> Path:
    if preset not in bm.PRESETS:
        raise click.UsageError(f"--preset {preset!r}: use one of {', '.join(sorted(bm.PRESETS))}")
    return bm.build_checkpoint(preset, cache_dir)


def category(name: str, labels: set[str]) -> str:
    """An op's category from its name and the labelled ranges it runs in (the module docstring's table)."""
    if "reorder" in name or name in REORDER_OPS:
        return "reorder"
    if trace.ATTENTION in labels:
        return "attention"
    if name in GEMM_OPS or name.startswith(GEMM_RANGE):
        return "gemm"
    if trace.LINEAR in labels:
        return "linear other"
    if trace.SAMPLING in labels:
        return "sampling"
    return "other" if name in OTHER_OPS else "elementwise"


def gemm_mnk(name: str, shapes: list) -> tuple[int, int, int] | None:
    """(M, N, K) of a GEMM kernel call from its recorded input shapes (a batched product: M counts every batch's
    rows); None where the shapes are not the ones expected."""
    try:
        if name.startswith(GEMM_RANGE):  # the own kernels' range: "flexbatch::gemm MxNxK"
            m, n, k = name.rsplit(" ", 1)[1].split("x")
        elif name in ("aten::mm", "aten::_int_mm"):
            (m, k), (_, n) = shapes[0], shapes[1]
        elif name == "aten::addmm":
            (m, k), (_, n) = shapes[1], shapes[2]
        elif name in ("aten::bmm", "aten::baddbmm"):
            (b, m, k), (_, _, n) = shapes[-2:] if name == "aten::baddbmm" else shapes[:2]
            m *= b
        elif name == "mkldnn::_linear_pointwise":  # x [*, K], the reordered weight [N, K]
            m, k, n = math.prod(shapes[0][:-1]), shapes[0][-1], shapes[1][0]
        elif name.startswith("aten::_weight_int4pack_mm"):  # x [M, K], ..., scales and zeros [K / group, N, 2]
            (m, k), n = shapes[0], shapes[3][1]
        elif name == "aten::_weight_int8pack_mm":  # x [M, K], weight [N, K]
            (m, k), (n, _) = shapes[0], shapes[1]
        else:
            return None
    except (IndexError, TypeError, ValueError):
        return None
    return int(m), int(n), int(k)


def empty_phase() -> dict:
    return {"wall_s": 0.0, "seconds": dict.fromkeys(CATEGORIES, 0.0), "gemm_flops": 0.0, "gemm_calls": 0,
            "gemm_uncounted": 0, "flops_by_rows": Counter(), "int8_flops": 0.0, "ops": defaultdict(lambda: [0, 0.0])}


TOP_OPS = 8  # ops per phase kept by name in the report, the most self time first


def top_ops(ops: dict) -> list[dict]:
    """A phase's ops by (name, category): the TOP_OPS with the most self time, with their calls."""
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][1])[:TOP_OPS]
    return [{"op": name, "category": cat, "calls": n, "seconds": s} for (name, cat), (n, s) in ranked]


def tally(events, wall_s: float) -> dict:
    """Per phase (PHASES, then REST) of the compute thread, the profiled events' self seconds by category, the
    phase's wall seconds, its GEMM FLOPs and the ops that took the most time; the other threads' op seconds by category apart. The compute thread
    is the one the phase labels run on; REST's wall time is `wall_s` less the phases'."""
    phases = {p: empty_phase() for p in (*PHASES, REST)}
    steps = [e for e in events if e.is_user_annotation and e.name in PHASES]
    main = Counter(e.thread for e in steps).most_common(1)[0][0] if steps else None
    others: dict[str, float] = defaultdict(float)
    for e in steps:
        if e.thread == main:
            phases[e.name]["wall_s"] += (e.time_range.end - e.time_range.start) / 1e6
    for e in events:
        if e.is_user_annotation and not e.name.startswith(trace.KERNEL):  # the compiled kernels' calls count as ops
            continue
        labels, phase, up = set(), REST, e.cpu_parent
        while up is not None:
            if up.is_user_annotation:
                labels.add(up.name)
                phase = up.name if phase == REST and up.name in PHASES else phase
            up = up.cpu_parent
        cat, seconds = category(e.name, labels), e.self_cpu_time_total / 1e6
        if e.thread != main:
            others[cat] += seconds
            continue
        ph = phases[phase]
        ph["seconds"][cat] += seconds
        ph["ops"][e.name, cat][0] += 1
        ph["ops"][e.name, cat][1] += seconds
        if cat == "gemm":
            mnk = gemm_mnk(e.name, e.input_shapes)
            ph["gemm_calls"] += 1
            if mnk is None:
                ph["gemm_uncounted"] += 1
                continue
            flops = 2.0 * math.prod(mnk)
            ph["gemm_flops"] += flops
            ph["flops_by_rows"][mnk[0]] += flops
            ph["int8_flops"] += flops if e.name == "aten::_int_mm" or e.name.startswith(GEMM_RANGE + "-int8") else 0.0
    phases[REST]["wall_s"] = max(0.0, wall_s - sum(phases[p]["wall_s"] for p in PHASES))
    for ph in phases.values():
        ph["seconds"]["overhead"] = ph["wall_s"] - sum(v for k, v in ph["seconds"].items() if k != "overhead")
        ph["top_ops"] = top_ops(ph.pop("ops"))
    return {"phases": phases, "other_threads": dict(others)}


def widest_layer(spec) -> tuple[int, int]:
    """(out, in) of the model's widest layer Linear: the shape every GEMM peak here is measured on."""
    return max(bm.layer_gemm_shapes(spec), key=lambda s: s[0] * s[1])


def int8_peak_gops(spec, rows: int) -> float:
    """int8 x int8 -> int32 GEMM (torch._int_mm, on the transposed codes as the int8 kernel calls it) GOP/s of the
    widest layer shape at `rows` rows: the fastest of 10 calls."""
    n, k = widest_layer(spec)
    x, w = torch.randint(-127, 128, (rows, k), dtype=torch.int8), torch.randint(-127, 128, (n, k), dtype=torch.int8)
    return gflops(rows, n, k, best_seconds(lambda: torch._int_mm(x, w.T), 10))


def reordered_peak_gflops(spec, dtype: torch.dtype, rows: int) -> float:
    """GFLOP/s of the widest layer shape at `rows` rows through a weight reordered for oneDNN, the form the engine
    keeps dense weights in where it measured it faster (engine/kernels/onednn_dense.py): the fastest of 10 calls."""
    n, k = widest_layer(spec)
    x, w = torch.randn(rows, k).to(dtype), onednn_dense.pack(torch.randn(n, k).to(dtype))
    return gflops(rows, n, k, best_seconds(lambda: onednn_dense.linear(x, w), 10))


def gemm_peak(spec, kind: str, dtype: torch.dtype, rows: int) -> tuple[float, str]:
    """The peak a phase's GEMM rate is quoted against, and the form that reached it: int8's _int_mm, or for a
    dense dtype the faster of the plain weight (the microbenchmark of `bench workloads` and `bench score`) and
    the reordered one."""
    if kind == "int8":
        return int8_peak_gops(spec, rows), "int8"
    forms = {"plain": gemm_peak_gflops(spec, dtype, rows)}
    if torch.backends.mkldnn.is_available():
        forms["reordered"] = reordered_peak_gflops(spec, dtype, rows)
    best = max(forms, key=forms.get)
    return forms[best], f"{kind} {best}"


def gemm_rates(phase: dict, spec, dtype: torch.dtype, peaks: dict) -> dict:
    """The phase's GEMM rate and the peak it is quoted against (`gemm_peak`) at the row count carrying most of its
    GEMM FLOPs, int8 where _int_mm did most of them, else the compute dtype (`peaks` caches them for the line's
    phases; each line measures its own right after its run, the machine being shared)."""
    seconds = phase["seconds"]["gemm"]
    if not phase["gemm_flops"] or not seconds:
        return {"gemm_gflops": None, "peak_gflops": None, "peak_rows": None, "peak_kind": None}
    rows = phase["flops_by_rows"].most_common(1)[0][0]
    kind = "int8" if phase["int8_flops"] > phase["gemm_flops"] / 2 else str(dtype).removeprefix("torch.")
    if (kind, rows) not in peaks:
        log.info("GEMM peak: %s at %d rows", kind, rows)
        peaks[kind, rows] = gemm_peak(spec, kind, dtype, rows)
    peak, form = peaks[kind, rows]
    return {"gemm_gflops": phase["gemm_flops"] / seconds / 1e9, "peak_gflops": peak, "peak_rows": rows,
            "peak_kind": form}


@contextmanager
def stdout_to(path: Path):
    """The process's file descriptor 1 (where oneDNN's C code prints) redirected into `path`."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(path, "wb") as f:
        os.dup2(f.fileno(), 1)
        try:
            yield
        finally:
            ctypes.CDLL(None).fflush(None)
            os.dup2(saved, 1)
            os.close(saved)


WEIGHTS = re.compile(r"wei[:_](\w+)::blocked:(\w+)")


def onednn_primitives(text: str) -> list[dict]:
    """oneDNN verbose output -> each (primitive, implementation, weight dtype and layout, weight K x N) executed:
    calls and milliseconds, the most time first. A lower-case layout (ab, ba) is a plain weight, which a brgemm packs
    inside every call; an upper-case one (AB16b64a) was reordered beforehand."""
    out: dict[tuple, list] = {}
    for line in text.splitlines():
        fields = line.split(",")
        if not fields[0].endswith("_verbose") or "exec" not in fields[:4]:
            continue
        at = fields.index("exec")
        try:
            ms = float(fields[-1])
        except ValueError:
            continue
        w = WEIGHTS.search(line)
        key = (fields[at + 2], fields[at + 3], f"{w.group(1)} {w.group(2)}" if w else "-", weight_dims(fields[-2]))
        out.setdefault(key, [0, 0.0])
        out[key][0] += 1
        out[key][1] += ms
    return [{"primitive": p, "implementation": i, "weights": w, "shape": d, "calls": n, "ms": ms}
            for (p, i, w, d), (n, ms) in sorted(out.items(), key=lambda kv: -kv[1][1])]


def weight_dims(problem: str) -> str:
    """The weight's K x N from a verbose line's problem: a matmul's or gemm's "MxK:KxN", an inner product's
    "mb..icKocN"; "" for other primitives."""
    ip = re.search(r"ic(\d+)oc(\d+)", problem)
    if ip:
        return f"{ip.group(1)}x{ip.group(2)}"
    return problem.split(":")[1] if problem.count(":") == 1 else ""


def verbose_pass(run) -> list[dict]:
    """A prefill and one decode step (`run(2)`) with oneDNN's verbose output on, summed by primitive."""
    if not torch.backends.mkldnn.is_available():
        return []
    with tempfile.TemporaryDirectory(prefix="flexbatch-onednn-") as tmp:
        path = Path(tmp) / "verbose.txt"
        with stdout_to(path), torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            run(2)
        return onednn_primitives(path.read_text(errors="replace"))


def profile_line(model_dir: Path, cfg: OpProfileConfig, dtype: str, fmt: str) -> dict:
    """One (dtype, weight format): load, warm up (a prefill and one decode step), run the workload unprofiled (the
    reference wall time), then profiled, and tally the profile."""
    rows, P, G = cfg.shape
    spec = load_model_spec(model_dir)
    policy = Policy(gbs=rows, num_gb=1, compress_weight=fmt != UNCOMPRESSED,
                    weight_format=fmt if fmt != UNCOMPRESSED else Policy.weight_format)
    eng = Engine.load(model_dir, dtype=dtype, policy=policy)
    run = engine_runner(eng, bm.prompt_ids(rows, P, spec.vocab_size), rows, 1)
    log.info("%s %s: warm-up, then an unprofiled run", dtype, fmt)
    run(2)  # first calls: the kernels' rate measurements, allocations, oneDNN primitives
    _, unprofiled = timed_call(lambda: run(G))
    unprofiled_phases = dict(eng.phase_seconds)
    log.info("%s %s: profiled run", dtype, fmt)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        tokens, wall = timed_call(lambda: run(G))
    counted, peaks = tally(prof.events(), wall), {}
    for name, ph in counted["phases"].items():
        ph["unprofiled_s"] = unprofiled_phases.get(name, unprofiled - sum(unprofiled_phases.values()))
        ph |= gemm_rates(ph, spec, eng.dtype, peaks)
        ph["flops_by_rows"] = dict(ph["flops_by_rows"])
    onednn = verbose_pass(run) if cfg.onednn_verbose else None
    return {"dtype": dtype, "compute_dtype": str(eng.dtype).removeprefix("torch."), "weights": fmt,
            "tokens": tokens, "profiled_s": wall, "unprofiled_s": unprofiled, **counted, "onednn": onednn}


def run_ops(cfg: OpProfileConfig) -> dict:
    rows, P, G = cfg.shape
    model_dir = checkpoint(cfg.preset, cfg.cache_dir)
    spec, load_before = load_model_spec(model_dir), os.getloadavg()
    lines = [profile_line(model_dir, cfg, d, f) for d in cfg.dtypes for f in cfg.formats]
    flops = bm.model_flops(spec, P, G, rows)
    return {"config": asdict(cfg), "machine": bm.machine_info() | {"cpu_flags": cpu_flags()},
            "load_average": {"before": load_before, "after": os.getloadavg()},
            "model_gemm_flops": flops["linear"] + flops["head"], "lines": lines}


COLUMNS = (Column("dtype"), Column("weights"), Column("phase"), Column("seconds (unprofiled)"),
           *(Column(c) for c in CATEGORIES), Column("GEMM GFLOP/s"), Column("peak GFLOP/s (kind, rows)"),
           Column("of peak"))


def share(seconds: float, wall: float) -> str:
    return f"{seconds:.3f} ({100 * seconds / wall:.0f}%)" if wall > 0 else f"{seconds:.3f}"


def phase_row(line: dict, name: str) -> tuple:
    ph = line["phases"][name]
    dtype = line["dtype"] if line["dtype"] == line["compute_dtype"] else f"{line['dtype']} ({line['compute_dtype']})"
    rate = ph["gemm_gflops"]
    return (dtype, line["weights"], name, f"{ph['wall_s']:.2f} ({ph['unprofiled_s']:.2f})",
            *(share(ph["seconds"][c], ph["wall_s"]) for c in CATEGORIES),
            "-" if rate is None else f"{rate:.1f}",
            "-" if rate is None else f"{ph['peak_gflops']:.1f} ({ph['peak_kind']}, {ph['peak_rows']})",
            "-" if rate is None else f"{rate / ph['peak_gflops']:.2f}")


def line_notes(line: dict) -> list[str]:
    """Under the table, per line: the run's wall times, the other threads' ops, the oneDNN primitives."""
    head = f"{line['dtype']} {line['weights']}"
    notes = [f"{head}: profiled run {line['profiled_s']:.2f} s, unprofiled {line['unprofiled_s']:.2f} s; "
             f"GEMM FLOPs counted {sum(p['gemm_flops'] for p in line['phases'].values()):.3e}"]
    if line["other_threads"]:
        notes.append(f"{head}: other threads' ops (weight prefetch): " + ", ".join(
            f"{k} {v:.3f} s" for k, v in sorted(line["other_threads"].items(), key=lambda kv: -kv[1])))
    for name in PHASES:
        notes.append(f"{head} {name}: top ops " + ", ".join(
            f"{o['op']} ({o['category']}) {o['seconds']:.3f} s / {o['calls']} calls" for o in line["phases"][name]["top_ops"][:5]))
    uncounted = sum(p["gemm_uncounted"] for p in line["phases"].values())
    if uncounted:
        notes.append(f"{head}: {uncounted} GEMM calls of unexpected shapes left out of the FLOPs")
    if line["onednn"] is not None:
        notes.append(f"{head}: oneDNN primitives in a prefill + 1 decode step: " + ("; ".join(
            f"{p['primitive']} {p['implementation'] or '-'} weights {p['weights']} {p['shape']}: {p['calls']} calls "
            f"{p['ms']:.0f} ms"
            for p in line["onednn"][:6]) or "none"))
    return notes


def table_text(report: dict) -> str:
    c, (before, after) = report["config"], (report["load_average"][k] for k in ("before", "after"))
    rows = [phase_row(ln, name) for ln in report["lines"] for name in (*PHASES, REST)]
    return format_table(COLUMNS, rows, markdown=True, above=[
        f"CPU flags: {report['machine']['cpu_flags']}",
        f"{c['preset']} random-weight model, workload {c['workload']} (rows x prompt + generated), CPU-only policy, "
        f"{report['machine']['torch_threads']} threads, load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.2f}' for x in before)} before, {' '.join(f'{x:.2f}' for x in after)} after; "
        f"model GEMM FLOPs (layers' Linears + LM head) {report['model_gemm_flops']:.3e}",
        "Self CPU seconds of the compute thread's ops in the profiled run, by phase and category (share of the "
        "phase's wall time); overhead = wall - ops:"], below=[n for ln in report["lines"] for n in line_notes(ln)])


def workload_arg(ctx, param, value: str) -> str:
    try:
        workload_shape(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None
    return value


@click.command("ops")
@click.option("--workload", default=WORKLOAD, show_default=True, callback=workload_arg, metavar="ROWSxPROMPT+GEN",
              help="Rows x prompt tokens + generated tokens, one block of every row (the bulk workload is "
                   "512x128+32: minutes per line on a few cores).")
@click.option("--preset", type=click.Choice(sorted(bm.PRESETS)), default=OpProfileConfig.preset, show_default=True,
              help="Model shape (a random-weight Llama built once and cached); 100m: hidden 1024, 8 layers, GQA.")
@click.option("--dtype", "dtypes", type=click.Choice(["auto", "float32", "bfloat16"]), multiple=True,
              help="Compute dtypes (repeatable; auto: bfloat16 where the CPU has AVX512-BF16 or AMX).  "
                   "[default: auto]")
@click.option("--compress-weight", "formats", type=click.Choice((UNCOMPRESSED, *WEIGHT_FORMATS)), multiple=True,
              help="Weight formats (repeatable).  [default: uncompressed]")
@click.option("--onednn-verbose/--no-onednn-verbose", default=True, show_default=True,
              help="Also run a prefill and one decode step with oneDNN's verbose output on and sum its primitives "
                   "(reorders, and the weight layout each GEMM got).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads.  [default: torch's]")
@click.option("--cache-dir", default=OpProfileConfig.cache_dir, show_default=True, help="Checkpoints.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Also write the numbers as JSON here.  [default: none]")
def ops_command(dtypes, formats, threads, json_path: Path | None, **kw):
    """Profile one engine run op by op: seconds and share of GEMM, attention, elementwise, reorders, sampling and
    overhead per phase, and the GEMM rate against the measured peak.

    \b
    Examples:
      flexbatch bench ops --threads 2
      flexbatch bench ops --threads 2 --dtype auto --dtype float32 --compress-weight uncompressed --compress-weight int8
    """
    setup_logging()
    if threads:
        torch.set_num_threads(threads)
    cfg = OpProfileConfig(dtypes=tuple(dtypes) or OpProfileConfig.dtypes, formats=tuple(formats) or
                          OpProfileConfig.formats, threads=threads, **kw)
    try:
        report, seconds = timed_call(lambda: run_ops(cfg))
    except FlexbatchError as e:
        fail(e)
    report["wall_seconds"] = seconds
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1, default=str))
    click.echo(table_text(report))
    if json_path is not None:
        click.echo(f"json: {json_path}")
