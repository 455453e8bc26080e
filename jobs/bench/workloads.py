"""`flexbatch bench workloads`: the engine as users compare engines, on the three workloads of the issue that
set the compression targets (every row generates exactly G tokens; tokens/s counts generated tokens):

    W1  32 prompts x 512 tokens, generate 32      (long prompts: prefill-heavy)
    W2  64 prompts x 64 tokens, generate 256      (long generations: decode-heavy)
    W3  128 prompts x 64 tokens, generate 16      (many short rows)

and the three on which vLLM's CPU build was first measured against flexbatch (preset 100m, bfloat16 where the CPU
has native bf16): short 96 x 64 generate 16, gen 32 x 64 generate 64, bulk 512 x 128 generate 32; the same three
compare today's families with llama.cpp on the presets qwen3-100m and gemma3-100m, and mixtures of experts on
mixtral-800m and qwen3moe-700m (jobs/bench/models.py).

Lines: flexbatch uncompressed in the run's dtype (with --backend aten also without oneDNN's reordered dense weights:
the line "... aten"), with int4 and with int8 weights, in a float32 run also with bfloat16 weights at rest (the line
"flexbatch float32 bf16": a bf16 checkpoint's weights kept as they are, activations and KV cache float32), and
CTranslate2 (the `bench`
extra) int8 and in the run's dtype, converted with its Transformers converter. Each line loads in a process of its
own (jobs/bench/line_process.py: two engines in one process slow each other), and the lines' generations are timed
inside those processes, interleaved round by round, one at a time (the machine is shared: the median of the rounds
is quoted, ratios are to CTranslate2 int8). Per line: tokens/s, tokens per CPU second of the line's process (with
one thread per line, what the line costs whatever else shares the cores), model FLOP/s as a fraction of a GEMM
microbenchmark of the run's dtype (the model's widest layer shape at 1024 rows), and the memory it adds (peak RSS
over its load and one run, less the RSS before it). For flexbatch's lines also each phase (the engine times them):
prefill's model FLOP/s as a fraction of that peak, decode's as a fraction of the rate of one layer's GEMMs (q, k, v,
o, gate, up, down) at the decode batch size, the block's rows, through as many distinct weights as the model has.

With --whole-process FORMAT the same prompts are also timed as users compare engines, whole processes from start
to exit: `flexbatch run --no-ray` with FORMAT weights against a CTranslate2 int8 script doing load + generate
(jobs/bench/whole_process.py); --no-in-process leaves the in-process lines out. --vllm-venv DIR adds a vLLM job
(jobs/bench/vllm_script.py, run by DIR/bin/python) to the whole processes: its seconds start to exit, and the
seconds inside it spent in `llm.generate` and before it (start-up: imports, load, compile warm-up).

--llama-cpp DIR adds llama.cpp's lines (jobs/bench/llama_cpp.py: `llama-batched-bench` on GGUFs of the checkpoint,
bf16, Q8_0 and Q4_0) to the in-process table, interleaved with the others round by round: tokens/s from its own
prefill and decode seconds (load excluded), its phases as flexbatch's, its process's peak RSS as the memory, and
the ratio of the flexbatch line of the same weight width (uncompressed, int8, int4) to it."""

from __future__ import annotations

import importlib.util
import json
import logging
import statistics
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import click
import torch
import torch.nn.functional as F

from engine.dtypes import cpu_info
from engine.engine import Engine
from engine.policy import Policy
from engine.spec import load_model_spec
from jobs.bench import llama_cpp as lc
from jobs.bench import models as bm
from jobs.bench import whole_process as wp
from jobs.bench.line_process import LineProcess
from jobs.bench.options import vllm_option, vllm_python
from jobs.bench.report import run_and_save
from jobs.bench.runs import engine_runner
from jobs.bench.side_by_side import side_by_side
from jobs.bench.table import Column, format_table
from jobs.common import setup_logging
from planner.microbench import median_seconds

log = logging.getLogger(__name__)
WORKLOADS = {"W1": (32, 512, 32), "W2": (64, 64, 256), "W3": (128, 64, 16),  # rows, prompt tokens, generated
             "short": (96, 64, 16), "gen": (32, 64, 64), "bulk": (512, 128, 32)}
ENGINE_FORMATS = {"": None, " int4": "int4", " int8": "int8"}  # line suffix -> compressed weight format
BF16_AT_REST = " bf16"  # the suffix of the float32 line whose weights stay bfloat16 (engine/compression/bf16.py)


@dataclass(frozen=True)
class WorkloadConfig:
    workloads: tuple[str, ...] = ("W1", "W2", "W3")  # the default; short, gen and bulk by name
    preset: str = "110m"
    dtype: str = "float32"
    repeats: int = 2
    ctranslate2: bool = True
    in_process: bool = True
    whole_process: tuple[str, ...] = ()  # flexbatch run's weight formats (whole_process.FORMATS)
    threads: int | None = None  # of every line; None: torch's
    vllm_venv: str | None = None  # a vLLM line among the whole processes (options.vllm_option)
    llama_cpp: str | None = None  # a llama.cpp build (scripts/setup_llama_cpp.sh): its lines in process
    backends: tuple[str, ...] = ("native",)  # kernels of the uncompressed lines (engine/kernels/backend.py)
    cache_dir: str = str(bm.DEFAULT_CACHE_DIR)


def cpu_flags() -> str:
    return cpu_info("flags") or ""


def engine_line(model_dir: Path, prompts, dtype: str, fmt: str | None, backend: str = "native"):
    """A flexbatch line: the engine with `fmt` weights (None: uncompressed) and `backend`'s kernels on one block of
    every prompt (`runs.engine_runner`, which keeps each call's prefill and decode seconds)."""
    policy = Policy(gbs=len(prompts), num_gb=1, compress_weight=fmt is not None, weight_format=fmt or "int4")
    return engine_runner(Engine.load(model_dir, dtype=dtype, policy=policy, backend=backend), prompts, len(prompts), 1)


def ct2_model(model_dir: Path, quantization: str) -> Path:
    """The checkpoint converted by CTranslate2's Transformers converter (cached beside it). The random-weight
    checkpoints have no BOS/EOS, which the converted config needs: the unknown word stands in (the rows are
    made to generate exactly G tokens, so it never ends one)."""
    import ctranslate2

    out = model_dir.parent / f"{model_dir.name}-ct2-{quantization}"
    if not (out / "model.bin").is_file():
        ctranslate2.converters.TransformersConverter(str(model_dir)).convert(str(out), quantization=quantization,
                                                                             force=True)
    cfg = json.loads((out / "config.json").read_text())
    if cfg.get("bos_token") is None or cfg.get("eos_token") is None:
        cfg["bos_token"], cfg["eos_token"] = cfg.get("bos_token") or bm.UNK, cfg.get("eos_token") or bm.UNK
        (out / "config.json").write_text(json.dumps(cfg))
    return out


def ct2_runner(model_dir: Path, prompts, compute_type: str):
    import ctranslate2

    gen = ctranslate2.Generator(str(ct2_model(model_dir, compute_type)), device="cpu", compute_type=compute_type,
                                intra_threads=torch.get_num_threads())
    tokens = [[f"w{i}" for i in ids] for ids in prompts]

    def run(gen_len: int) -> int:
        res = gen.generate_batch(tokens, max_length=gen_len, min_length=gen_len, sampling_topk=1,
                                 include_prompt_in_result=False, max_batch_size=len(tokens))
        counts = [len(r.sequences_ids[0]) for r in res]
        assert all(c == gen_len for c in counts), f"CTranslate2 generated {set(counts)} tokens, not {gen_len}"
        return sum(counts)

    return run


def gemm_peak_gflops(spec, dtype: torch.dtype, rows: int = 1024) -> float:
    """bf16/fp32 GEMM FLOP/s of the model's widest layer shape (gate/up) at `rows` rows."""
    n, k = max(bm.layer_gemm_shapes(spec), key=lambda s: s[0] * s[1])
    x, w = torch.randn(rows, k).to(dtype), torch.randn(n, k).to(dtype)
    return 2 * rows * n * k / median_seconds(lambda: F.linear(x, w), 5) / 1e9


def layer_gemm_gflops(spec, dtype: torch.dtype, rows: int) -> float:
    """GEMM FLOP/s of the layers' Linear shapes (q, k, v, o, gate, up, down; in a mixture the router and each
    expert over its even share of the rows: models.layer_gemms) at `rows` rows, through as many distinct weights as
    the model's layers hold, one layer after another: the rate a decode step of `rows` rows could reach in its
    projections, its weights coming from memory rather than a cache that one shape's would fit in (median of 3
    passes after one)."""
    gemms = bm.layer_gemms(spec, rows)
    xs = {(m, k): torch.randn(m, k).to(dtype) for m, _, k, _ in gemms}
    work = [(xs[m, k], torch.randn(n, k).to(dtype)) for _ in range(spec.num_layers) for m, n, k, count in gemms
            for _ in range(count)]

    def one_pass():
        for x, w in work:
            F.linear(x, w)

    flops = 2 * spec.num_layers * sum(m * n * k * count for m, n, k, count in gemms)
    return flops / median_seconds(one_pass, 3) / 1e9


def phase_fractions(spec, prompts, G: int, runs: list[dict], peak: float, decode_rate: float) -> dict:
    """A flexbatch line's prefill model FLOP/s as a fraction of the GEMM peak and its decode model FLOP/s as a
    fraction of the layer GEMM rate at the decode batch size (medians over its runs); {} for other lines."""
    phases = [r["phase_seconds"] for r in runs if r.get("phase_seconds")]
    if not phases:
        return {}
    rows, P = len(prompts), len(prompts[0])
    prefill = bm.model_flops(spec, P, 1, rows)["total"]
    decode = bm.model_flops(spec, P, G, rows)["total"] - prefill
    return {"prefill_fraction": statistics.median(prefill / s["prefill"] / 1e9 / peak for s in phases),
            "decode_fraction": statistics.median(decode / s["decode"] / 1e9 / decode_rate for s in phases)
            if G > 1 else None}


def run_workload(cfg: WorkloadConfig, name: str, model_dir: Path, peak: float | None) -> dict:
    rows, P, G = WORKLOADS[name]
    prompts = bm.prompt_ids(rows, P, load_model_spec(model_dir).vocab_size)
    out = {"workload": name, "rows": rows, "prompt_tokens": P, "generated": G, "lines": []}
    if cfg.in_process:
        out["decode_gemm_gflops"] = layer_gemm_gflops(load_model_spec(model_dir), getattr(torch, cfg.dtype), rows)
        out["lines"] = in_process_lines(cfg, model_dir, prompts, G, peak, out["decode_gemm_gflops"])
    if cfg.whole_process or cfg.vllm_venv:
        ct2_dir = ct2_model(model_dir, "int8") if cfg.ctranslate2 else None
        out["whole_process"] = wp.run_whole_processes(model_dir, ct2_dir, prompts, G, cfg.dtype, cfg.whole_process,
                                                      cfg.threads or torch.get_num_threads(), cfg.repeats,
                                                      vllm_python(cfg.vllm_venv))
    return out


def line_specs(cfg: WorkloadConfig, model_dir: Path, prompts) -> dict[str, tuple]:
    """Each line's name and how its process makes it: (function, *arguments)."""
    formats = ENGINE_FORMATS | ({BF16_AT_REST: "bf16"} if cfg.dtype == "float32" else {})
    specs = {f"flexbatch {cfg.dtype}{suffix}": (engine_line, model_dir, prompts, cfg.dtype, fmt)
             for suffix, fmt in formats.items()}
    for backend in cfg.backends:
        if backend != "native":
            specs[f"flexbatch {cfg.dtype} {backend}"] = (engine_line, model_dir, prompts, cfg.dtype, None, backend)
    if cfg.ctranslate2:
        for ct in ("int8", ct2_dense_type(cfg.dtype)):
            specs[f"ctranslate2 {ct}"] = (ct2_runner, model_dir, prompts, ct)
    return specs


def ct2_dense_type(dtype: str) -> str:
    """CTranslate2's compute type for the run's dtype: bfloat16 only where it computes bfloat16 on this CPU (it
    refuses it elsewhere, e.g. on AMD CPUs with AVX512-BF16), else float32."""
    import ctranslate2

    return dtype if dtype in ctranslate2.get_supported_compute_types("cpu") else "float32"


def in_process_lines(cfg: WorkloadConfig, model_dir: Path, prompts, G: int, peak: float,
                     decode_rate: float) -> list[dict]:
    """The lines, each in a process of its own (jobs/bench/line_process.py), loaded one after another, then timed
    interleaved round by round."""
    rows, P, spec = len(prompts), len(prompts[0]), load_model_spec(model_dir)
    threads = cfg.threads or torch.get_num_threads()
    procs: dict[str, LineProcess | lc.LlamaCppLine] = {}
    try:
        for name, (make, *args) in line_specs(cfg, model_dir, prompts).items():
            log.info("loading %s in its own process", name)
            procs[name] = LineProcess(name, make, *args, threads=threads)
        if cfg.llama_cpp:
            procs |= lc.llama_cpp_lines(lc.llama_cpp_tools(cfg.llama_cpp), model_dir, rows, P, threads)
        res = side_by_side({name: partial(proc.run, G) for name, proc in procs.items()}, cfg.repeats)
    finally:
        for proc in procs.values():
            proc.close()
    flops = bm.model_flops(spec, P, G, rows)["total"]
    base = res.get("ctranslate2 int8", {}).get("tokens_per_s")
    return [{"line": k, "tokens_per_s": r["tokens_per_s"], "vs_ct2_int8": base and r["tokens_per_s"] / base,
             "tokens_per_cpu_s": r["tokens_per_cpu_s"],
             "gemm_fraction": flops / r["seconds"] / 1e9 / peak, "added_rss_bytes": procs[k].added_rss_bytes,
             "runs_tokens_per_s": [x["tokens_per_s"] for x in r["runs"]],
             "same_bits_ratio": same_bits_ratio(cfg, res, k)}
            | phase_fractions(spec, prompts, G, r["runs"], peak, decode_rate) for k, r in res.items()]


def same_bits_ratio(cfg: WorkloadConfig, res: dict[str, dict], line: str) -> float | None:
    """For a llama.cpp line, the tokens/s of the flexbatch line of its weights' width over its own."""
    fmt = next((f for f in lc.FORMATS if lc.line_name(f) == line), None)
    flex = res.get(lc.same_bits_line(fmt, cfg.dtype)) if fmt else None
    return flex and flex["tokens_per_s"] / res[line]["tokens_per_s"]


def run_workloads(cfg: WorkloadConfig) -> dict:
    if cfg.ctranslate2 and importlib.util.find_spec("ctranslate2") is None:
        raise click.UsageError("CTranslate2 is not installed: pip install 'flexbatch[bench]', or --no-ctranslate2")
    model_dir = bm.build_checkpoint(cfg.preset, cfg.cache_dir)
    dtype = getattr(torch, cfg.dtype)
    peak = gemm_peak_gflops(load_model_spec(model_dir), dtype) if cfg.in_process else None  # of those lines only
    results = [run_workload(cfg, w, model_dir, peak) for w in cfg.workloads]
    return {"config": asdict(cfg), "machine": bm.machine_info() | {"cpu_flags": cpu_flags()},
            "gemm_peak_gflops": peak, "workloads": results}


COLUMNS = tuple(Column(t) for t in ("workload", "line", "tokens/s (median)", "tokens per CPU-s", "vs CTranslate2 int8",
                                     "fraction of GEMM peak", "prefill / GEMM peak", "decode / GEMM at its rows",
                                     "memory added", "flexbatch same weight width / this"))


def ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def fraction(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def workload_label(w: dict) -> str:
    return f"{w['workload']} {w['rows']}x{w['prompt_tokens']} gen {w['generated']}"


def table_text(report: dict) -> str:
    """The CPU flags, then the in-process table and the whole-process table, each where the run has its lines."""
    out = [f"CPU flags: {report['machine']['cpu_flags']}"]
    rows = [(workload_label(w), ln["line"], f"{ln['tokens_per_s']:.1f}",
             f"{ln['tokens_per_cpu_s']:.1f}" if ln.get("tokens_per_cpu_s") else "-",
             f"{ln['vs_ct2_int8']:.2f}x" if ln["vs_ct2_int8"] else "-", fraction(ln["gemm_fraction"]),
             fraction(ln.get("prefill_fraction")), fraction(ln.get("decode_fraction")),
             f"{ln['added_rss_bytes'] / 2**20:.0f} MiB", ratio(ln.get("same_bits_ratio")))
            for w in report["workloads"] for ln in w["lines"]]
    if rows:
        out.append(format_table(COLUMNS, rows, markdown=True, above=[
            f"Generation, each line in a loaded process of its own: {report['config']['dtype']} GEMM peak (widest "
            f"layer, 1024 rows): {report['gemm_peak_gflops']:.1f} GFLOP/s; layer GEMMs at the decode rows: "
            + ", ".join(f"{w['workload']} {w['rows']} rows {w['decode_gemm_gflops']:.1f}" for w in report["workloads"]
                        if "decode_gemm_gflops" in w) + " GFLOP/s"]))
    whole = [w for w in report["workloads"] if "whole_process" in w]
    if whole:
        first = whole[0]["whole_process"]
        out.append(format_table(wp.COLUMNS, [r for w in whole for r in wp.table_rows(workload_label(w),
                                                                                      w["whole_process"])],
                                markdown=True, above=[
            f"Whole processes, {first['threads']} threads each, median of {first['rounds']} rounds after a warm-up "
            f"round:"]))
    return "\n".join(out)


@click.command("workloads")
@click.option("--workload", "workloads", type=click.Choice(sorted(WORKLOADS)), multiple=True,
              help="Workloads to run (repeatable): W1-W3, or short, gen and bulk (vLLM's first comparison, "
                   "with --preset 100m).  [default: W1, W2, W3]")
@click.option("--preset", type=click.Choice(sorted(bm.PRESETS)), default=WorkloadConfig.preset, show_default=True,
              help="Model shape (a random-weight checkpoint of its family, built once and cached).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default=WorkloadConfig.dtype,
              show_default=True, help="Compute dtype of the uncompressed lines.")
@click.option("--repeats", type=click.IntRange(min=1), default=WorkloadConfig.repeats, show_default=True)
@click.option("--ctranslate2/--no-ctranslate2", default=True, show_default=True,
              help="CTranslate2 lines: int8 and the dtype in process, the int8 script among the whole processes "
                   "(needs the bench extra).")
@click.option("--in-process/--no-in-process", default=True, show_default=True,
              help="The lines timed inside loaded processes (generation only, each engine loaded beforehand in a "
                   "process of its own).")
@click.option("--whole-process", type=click.Choice(sorted(wp.FORMATS)), multiple=True,
              help="Also time whole processes, start to exit, as users compare: `flexbatch run --no-ray` with these "
                   "weights (repeatable; int8 is the fastest format) vs a CTranslate2 int8 script doing load + "
                   "generate (jobs/bench/ct2_script.py, with --ctranslate2), on the same prompts written to a "
                   "Parquet file; separate processes, interleaved round by round after a warm-up round; every row "
                   "checked to generate exactly G tokens.  [default: none]")
@vllm_option("a vLLM job among the whole processes (generation seconds inside it, and start to exit)")
@click.option("--llama-cpp", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Add llama.cpp's lines to the in-process table: GGUFs of the checkpoint (bf16, Q8_0, Q4_0, made "
                   "on first use) timed by its llama-batched-bench, separate prompts; DIR is a build of "
                   f"{lc.SETUP_SCRIPT} DIR.  [default: no llama.cpp lines]")
@click.option("--backend", "backends", type=click.Choice(["native", "aten"]), multiple=True,
              help="Kernels of the uncompressed flexbatch line (repeatable): aten adds a line without oneDNN's "
                   "reordered dense weights, to measure what the reordering gives.  [default: native]")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads of every line: torch's here, OMP_NUM_THREADS of the whole processes and the CTranslate2 "
                   "generators' intra_threads.  [default: torch's]")
@click.option("--cache-dir", default=WorkloadConfig.cache_dir, show_default=True, help="Checkpoints.")
@click.option("--output", type=click.Path(path_type=Path), default=Path("out/bench/workloads.json"),
              show_default=True)
def workloads_command(workloads, whole_process, threads, vllm_venv, llama_cpp, backends, output: Path, **kw):
    """W1/W2/W3: flexbatch (uncompressed, int4, int8 weights) vs CTranslate2, side by side; with --whole-process
    also as whole processes (`flexbatch run` vs a CTranslate2 script).

    \b
    Examples:
      flexbatch bench workloads --workload W3 --threads 2
      flexbatch bench workloads --workload W2 --dtype bfloat16 --backend aten --no-ctranslate2
      flexbatch bench workloads --workload W3 --threads 2 --no-in-process --whole-process int8 --whole-process uncompressed
      flexbatch bench workloads --workload W3 --threads 2 --no-in-process --whole-process uncompressed --vllm-venv .venv-vllm
      flexbatch bench workloads --preset 100m --workload gen --threads 2 --no-ctranslate2 --llama-cpp .llama-cpp
    """
    setup_logging()
    if not kw["in_process"] and not whole_process and not vllm_venv:
        raise click.UsageError("--no-in-process leaves no line: add --whole-process int8 (or another format)")
    vllm_python(vllm_venv)  # a missing venv or build is an error before any line runs
    lc.llama_cpp_tools(llama_cpp)
    if llama_cpp and not kw["in_process"]:
        raise click.UsageError("--llama-cpp adds lines to the in-process table: leave --no-in-process out")
    if threads:
        torch.set_num_threads(threads)
    cfg = WorkloadConfig(workloads=tuple(workloads) or WorkloadConfig.workloads, whole_process=tuple(whole_process),
                         threads=threads, vllm_venv=vllm_venv and str(vllm_venv),
                         llama_cpp=llama_cpp and str(llama_cpp),
                         backends=tuple(dict.fromkeys(("native", *backends))), **kw)
    report = run_and_save(run_workloads, cfg, output)
    click.echo(table_text(report))
    click.echo(f"machine: {report['machine']['cpu_model']}, {report['machine']['torch_threads']} threads; json: "
               f"{output}")
