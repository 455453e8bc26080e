"""`flexbatch bench engine`: the engine against the hardware and against `transformers`, side by side.

This machine is shared and noisy, so every figure is a ratio of two things measured in the same process,
interleaved repeat by repeat, with the median of the repeats quoted:
  1. model FLOP/s of the engine's best block vs a bf16 GEMM microbenchmark of the model's own layer shapes at
     the same row counts (the prefill rows gbs * P and the decode rows gbs);
  2. tokens/s of the engine's best block vs `transformers` `generate` at its best batch size;
  3. with all layer weights on disk and a CPU budget of weights / ratio: the engine vs HF Accelerate
     (`device_map="auto"`, the same `max_memory`, an `offload_folder`) at its best batch size;
  4. compressed (4-bit weights and KV cache) vs uncompressed: tokens/s and peak memory;
  5. with --backends: kernel backends' prefill and decode tokens/s and peak memory (`jobs/bench/backends.py`);
  6. W4, rows that finish early: useful tokens/s with refill vs transformers and vs the block schedule before,
     and rows sorted by max_new_tokens vs that block schedule (`jobs/bench/early_stop.py`);
  7. with --memory-limit: each side a whole process in its own memory cgroup below the model size, flexbatch vs
     HF Accelerate at its best surviving batch, decode-heavy and prefill-heavy, and with --llama-cpp vs llama.cpp's
     GGUF of the same width (`jobs/bench/memory_limit.py`);
  8. the block with its large temporaries mmapped, as under a binding memory limit, vs reused from the C heap
     (`jobs/bench/heap.py`)."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import click
import torch
import torch.nn.functional as F

from engine.engine import Engine
from engine.errors import FlexbatchError
from engine.options import parse_bytes
from engine.policy import WEIGHT_FORMATS, Policy
from engine.spec import load_model_spec
from jobs.bench import llama_cpp as lc
from jobs.bench import models as bm
from jobs.bench.backends import backend_lines, parse_backends
from jobs.bench.early_stop import EarlyStopConfig, early_stop_lines
from jobs.bench.heap import heap_line
from jobs.bench.memory_limit import (
    GGUF_TYPES,
    CgroupUnavailable,
    MemoryLimitConfig,
    check_cgroups,
    memory_limit_lines,
    parse_workload,
)
from jobs.bench.report import Line, run_and_save
from jobs.bench.runs import DTYPE, best, block_name, engine_runner, generations, hf_runner, memory_probe
from jobs.bench.table import Column, format_table
from jobs.common import setup_logging
from planner.microbench import median_seconds

log = logging.getLogger(__name__)
SKIPPABLE = ("throughput", "gemm", "transformers", "accelerate", "offload", "compress", "early-stop", "heap")


@dataclass(frozen=True)
class BenchConfig:
    preset: str = "300m"
    prompt_len: int = 128
    gen_len: int = 32
    repeats: int = 3
    blocks: tuple[tuple[int, int], ...] = ((8, 1), (32, 1), (16, 4), (64, 1))
    hf_batches: tuple[int, ...] = (1, 8, 32, 64)
    offload_blocks: tuple[tuple[int, int], ...] = ((32, 1), (64, 1))
    accelerate_batches: tuple[int, ...] = (1, 8, 32)
    offload_ratio: float = 4.0
    skip: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()  # kernel backends to compare (line 5); empty: no comparison
    cache_dir: str = str(bm.DEFAULT_CACHE_DIR)
    early_stop: EarlyStopConfig = EarlyStopConfig()  # W4, line 6
    memory_limit: MemoryLimitConfig | None = None  # line 7, with --memory-limit


# ---- the four lines --------------------------------------------------------------------------------------

def throughput_lines(cfg: BenchConfig, model_dir: Path, prompts) -> tuple[list[Line], tuple[int, int], dict]:
    """Lines 1 and 2: the engine's block sweep interleaved with transformers' batch sweep."""
    from transformers import AutoModelForCausalLM

    spec = load_model_spec(model_dir)
    eng = Engine.load(model_dir, dtype=DTYPE, policy=Policy())
    runners = {block_name(g, n): engine_runner(eng, prompts, g, n) for g, n in cfg.blocks}
    hf = None
    if "transformers" not in cfg.skip:
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, trust_remote_code=False).eval()
        runners |= {f"transformers bs {b}": hf_runner(hf, prompts, b) for b in cfg.hf_batches}
    res = generations(runners, cfg.gen_len, cfg.repeats)
    del eng, hf
    ours = {k: v for k, v in res.items() if k.startswith("ours")}
    top = best(ours)
    block = cfg.blocks[list(ours).index(top)]
    gemm = None if "gemm" in cfg.skip else gemm_reference(spec, block, cfg)
    flops = bm.model_flops(spec, cfg.prompt_len, cfg.gen_len, block[0] * block[1])
    ours_gflops = flops["total"] / ours[top]["seconds"] / 1e9
    line1 = Line("flops", f"best block {block[0]}x{block[1]} vs bf16 GEMMs of its shapes and rows", "GFLOP/s",
                 ours_gflops, gemm and gemm["gflops"], 0.60, {"model_flops": flops, "gemm": gemm})
    theirs = {k: v for k, v in res.items() if k.startswith("transformers")}
    hf_top = best(theirs) if theirs else None
    line2 = Line("transformers", f"{top} vs {hf_top or 'transformers (skipped)'}", "tokens/s",
                 ours[top]["tokens_per_s"], hf_top and theirs[hf_top]["tokens_per_s"], 3.0)
    return [line1, line2], block, res


def gemm_reference(spec, block: tuple[int, int], cfg: BenchConfig) -> dict:
    """Seconds the block's Linear work takes as bare bf16 GEMMs of the model's shapes at the block's row counts:
    num_gb * (L * (t_layer(gbs * P) + (G - 1) * t_layer(gbs)) + G * t_head(gbs))."""
    gbs, num_gb = block
    P, G, L = cfg.prompt_len, cfg.gen_len, spec.num_layers
    reps = max(3, cfg.repeats)
    t_prefill = sum(gemm_seconds(gbs * P, n, k, reps) for n, k in bm.layer_gemm_shapes(spec))
    t_decode = sum(gemm_seconds(gbs, n, k, reps) for n, k in bm.layer_gemm_shapes(spec))
    t_head = gemm_seconds(gbs, spec.vocab_size, spec.hidden_size, reps)
    seconds = num_gb * (L * (t_prefill + (G - 1) * t_decode) + G * t_head)
    flops = bm.model_flops(spec, P, G, gbs * num_gb)
    gemm_flops = flops["linear"] + flops["head"]
    return {"seconds": seconds, "flops": gemm_flops, "gflops": gemm_flops / seconds / 1e9,
            "prefill_rows": gbs * P, "decode_rows": gbs,
            "prefill_gflops": 2 * bm.linear_params(spec) / L * gbs * P / t_prefill / 1e9,
            "decode_gflops": 2 * bm.linear_params(spec) / L * gbs / t_decode / 1e9,
            "formula": gemm_reference.__doc__.split(":", 1)[1].strip()}


def gemm_seconds(rows: int, n: int, k: int, repeats: int) -> float:
    torch.manual_seed(0)
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    w = (torch.randn(n, k) * 0.02).to(torch.bfloat16)
    return median_seconds(lambda: F.linear(x, w), repeats)


def offload_line(cfg: BenchConfig, model_dir: Path, prompts) -> Line:
    """Line 3: every layer on disk, a CPU budget of weights / ratio, vs HF Accelerate under the same budget.
    Accelerate's max_memory bounds weights only, so the engine gets weights / ratio plus the KV cache and
    activations of its largest block, which it accounts on the same tier."""
    spec = load_model_spec(model_dir)
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    weight_budget = weights / cfg.offload_ratio
    P, T = cfg.prompt_len, cfg.prompt_len + cfg.gen_len
    rows = max(g * n for g, n in cfg.offload_blocks)
    kv_act = rows * (spec.kv_bytes_per_token(2) * T + P * spec.hidden_size * 2)
    budgets = {"cpu": weight_budget + kv_act}
    eng = Engine.load(model_dir, dtype=DTYPE, policy=Policy(weight_cpu=0.0), budgets=budgets,
                      offload_dir=Path(cfg.cache_dir) / "offload")
    runners = {block_name(g, n): engine_runner(eng, prompts, g, n) for g, n in cfg.offload_blocks}
    with tempfile.TemporaryDirectory(prefix="flexbatch-accelerate-") as folder:
        acc, device_map = None, None
        if "accelerate" not in cfg.skip:
            acc, device_map = accelerate_model(model_dir, int(weight_budget), folder)
            runners |= {f"accelerate bs {b}": hf_runner(acc, prompts, b) for b in cfg.accelerate_batches}
        res = generations(runners, cfg.gen_len, cfg.repeats)
        del acc
    ours = {k: v for k, v in res.items() if k.startswith("ours")}
    theirs = {k: v for k, v in res.items() if k.startswith("accelerate")}
    top, acc_top = best(ours), (best(theirs) if theirs else None)
    detail = {"weight_bytes": weights, "weight_budget_bytes": weight_budget, "engine_cpu_budget_bytes":
              budgets["cpu"], "engine_cpu_peak_bytes": eng.devices.tiers["cpu"].peak,
              "engine_layer_tiers": dict(Counter(eng.weights.placement)), "accelerate_device_map": device_map,
              "accelerate_call": "AutoModelForCausalLM.from_pretrained(dir, dtype=torch.bfloat16, device_map='auto', "
                                 "max_memory={'cpu': weight_budget_bytes}, offload_folder=tmp)", "runs": res,
              "page_cache": "both read disk layers through the OS page cache, which no budget bounds"}
    return Line("accelerate", f"weights {cfg.offload_ratio:g}x the CPU budget (on disk), {top} vs "
                f"{acc_top or 'accelerate (skipped)'}", "tokens/s", ours[top]["tokens_per_s"],
                acc_top and theirs[acc_top]["tokens_per_s"], 20.0, detail)


def accelerate_model(model_dir: Path, max_cpu_bytes: int, folder: str, dtype: str = DTYPE):
    """HF Accelerate's big-model inference on a CPU-only machine: what does not fit max_memory["cpu"] goes to
    "disk" (read from the checkpoint's own safetensors file when it can, else from `folder`)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), device_map="auto",
                                                 max_memory={"cpu": max_cpu_bytes}, offload_folder=folder,
                                                 trust_remote_code=False)
    device_map = {k: str(v) for k, v in getattr(model, "hf_device_map", {}).items()}
    log.info("accelerate placed %s", dict(Counter(device_map.values())))
    return model.eval(), device_map


def compress_lines(cfg: BenchConfig, model_dir: Path, prompts, block: tuple[int, int]) -> list[Line]:
    """Line 4: compress_weight + compress_cache vs uncompressed at the best block, all on the CPU. Memory is
    the engine's accounted CPU peak, and the process RSS each engine adds (`memory_probe`)."""
    engines, runners, rss = {}, {}, {}
    for name, compress in (("uncompressed", False), ("compressed", True)):
        policy = Policy(compress_weight=compress, compress_cache=compress)
        engines[name], rss[name] = memory_probe(model_dir, policy, prompts, block, cfg.gen_len)
        runners[name] = engine_runner(engines[name], prompts, *block)
    res = generations(runners, cfg.gen_len, cfg.repeats, warm_up=False)
    acct = {name: eng.devices.tiers["cpu"].peak for name, eng in engines.items()}
    detail = {"block": block, "engine_cpu_peak_bytes": acct, "rss_added_bytes": rss, "runs": res}
    where = f"block {block[0]}x{block[1]}"
    return [Line("compress_speed", f"4-bit weights+KV vs uncompressed, {where}", "tokens/s",
                 res["compressed"]["tokens_per_s"], res["uncompressed"]["tokens_per_s"], None, detail),
            Line("compress_memory", "peak CPU memory accounted by the engine, 4-bit vs uncompressed", "MiB",
                 acct["compressed"] / 2**20, acct["uncompressed"] / 2**20),
            Line("compress_rss", "peak process RSS added (load + one run), 4-bit vs uncompressed", "MiB",
                 rss["compressed"] / 2**20, rss["uncompressed"] / 2**20)]


def run_engine_bench(cfg: BenchConfig) -> dict:
    """All lines, plus the machine and the config, as a JSON-ready dict."""
    model_dir = bm.build_checkpoint(cfg.preset, cfg.cache_dir)
    spec = load_model_spec(model_dir)
    rows = max([g * n for g, n in (*cfg.blocks, *cfg.offload_blocks)] + [*cfg.hf_batches, *cfg.accelerate_batches])
    prompts = bm.prompt_ids(rows, cfg.prompt_len, spec.vocab_size)
    lines, block, sweep = ([], cfg.blocks[0], {}) if "throughput" in cfg.skip else throughput_lines(cfg, model_dir,
                                                                                                    prompts)
    if "offload" not in cfg.skip:
        lines.append(offload_line(cfg, model_dir, prompts))
    if "compress" not in cfg.skip:
        lines += compress_lines(cfg, model_dir, prompts, block)
    if cfg.backends:
        lines += backend_lines(cfg, model_dir, prompts, block)
    if "early-stop" not in cfg.skip:
        lines += early_stop_lines(cfg.early_stop, cfg.cache_dir)
    if cfg.memory_limit is not None:
        lines += memory_limit_lines(cfg.memory_limit, model_dir)
    if "heap" not in cfg.skip:  # last: it leaves glibc's mmap threshold set
        lines.append(heap_line(model_dir, prompts, block, cfg.gen_len, cfg.repeats))
    return {"config": dataclasses.asdict(cfg), "machine": bm.machine_info(),
            "model": {"dir": str(model_dir), "preset": dataclasses.asdict(bm.PRESETS[cfg.preset]),
                      "linear_params": bm.linear_params(spec), "flops_formula": bm.FLOPS_FORMULA},
            "lines": [line.to_dict() for line in lines], "sweep": sweep}


# ---- command line ----------------------------------------------------------------------------------------

def _blocks(text: str) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(g), int(n)) for g, n in (b.lower().split("x") for b in text.split(",")))
    except ValueError:
        raise click.BadParameter(f"{text!r}: write blocks as GBSxNUM_GB, comma-separated, e.g. 8x1,16x4") from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r}: write batch sizes comma-separated, e.g. 1,8,32") from None


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


COLUMNS = (Column("line", 16, "<"), Column("ours", 9), Column("baseline", 9), Column("ratio", 7),
           Column("target", 7), Column("met", 4), Column("unit, what", gap=2))


def table_text(report: dict) -> str:
    rows = [(d["id"], _fmt(d["ours"]), _fmt(d["baseline"]), _fmt(d["ratio"]), "-" if d["target"] is None else f">={d['target']:g}",
             {True: "yes", False: "NO", None: "-"}[d["met"]], f"{d['unit']}, {d['what']}") for d in report["lines"]]
    return format_table(COLUMNS, rows)


_D = BenchConfig()


def _memory_limit(text: str | None, batches: tuple[int, ...], workloads: tuple[str, ...] = (),
                  dtype: str = MemoryLimitConfig.dtype,
                  formats: tuple[str, ...] = MemoryLimitConfig.formats,
                  llama_cpp: Path | None = None) -> MemoryLimitConfig | None:
    """The --memory-limit config, refused up front where memory groups cannot be made or a llama.cpp build named
    is missing or has nothing to compare."""
    if text is None:
        if llama_cpp is not None:
            raise click.UsageError("--llama-cpp runs llama.cpp under --memory-limit: give a limit too, e.g. "
                                   "--memory-limit 6GiB (llama.cpp's lines without a limit: flexbatch bench workloads "
                                   "--llama-cpp DIR)")
        return None
    if llama_cpp is not None:
        lc.llama_cpp_tools(llama_cpp)
        if not any(f in GGUF_TYPES for f in formats):
            raise click.UsageError(f"--llama-cpp compares llama.cpp with flexbatch's compressed runs, and "
                                   f"--memory-limit-formats {','.join(formats)} has none: add --memory-limit-formats "
                                   f"int4 (against Q4_0) or int8 (against Q8_0)")
    try:
        parsed = tuple(parse_workload(w) for w in workloads)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--memory-workload") from None
    more = dict(acc_batches=batches, workloads=parsed, dtype=dtype, formats=formats,
                llama_cpp=llama_cpp and str(llama_cpp.absolute()))
    try:
        if text.startswith("baseline+") and text.endswith("x"):
            try:
                cfg = MemoryLimitConfig(model_share=float(text[len("baseline+"):-1]), **more)
            except ValueError:
                raise click.UsageError(f"--memory-limit={text!r}: expected baseline+SHAREx with a share in (0, 1), "
                                       "e.g. baseline+0.4x") from None
        else:
            cfg = MemoryLimitConfig(int(parse_bytes(text, "--memory-limit")), **more)
        check_cgroups()
    except (FlexbatchError, CgroupUnavailable) as e:
        raise click.UsageError(str(e)) from None
    return cfg


@click.command("engine")
@click.option("--preset", type=click.Choice(sorted(bm.PRESETS)), default=_D.preset, show_default=True,
              help="Random-weight Llama to build (once, under --cache-dir) and run.")
@click.option("--prompt-len", type=click.IntRange(min=1), default=_D.prompt_len, show_default=True)
@click.option("--gen-len", type=click.IntRange(min=2), default=_D.gen_len, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=_D.repeats, show_default=True,
              help="Interleaved rounds; the median is quoted.")
@click.option("--blocks", default="8x1,32x1,16x4,64x1", show_default=True, help="Engine blocks GBSxNUM_GB to sweep.")
@click.option("--hf-batches", default="1,8,32,64", show_default=True, help="transformers batch sizes to sweep.")
@click.option("--offload-blocks", default="32x1,64x1", show_default=True, help="Engine blocks, weights on disk.")
@click.option("--accelerate-batches", default="1,8,32", show_default=True, help="Accelerate batch sizes.")
@click.option("--offload-ratio", type=click.FloatRange(min=1), default=_D.offload_ratio, show_default=True,
              help="Weights / CPU budget in the disk-offload line.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads.  [default: torch's]")
@click.option("--skip", type=click.Choice(SKIPPABLE), multiple=True, help="Leave out a baseline or line.")
@click.option("--backends", metavar="native,ipex", help="Compare kernel backends (ipex: in its torch 2.8 venv).")
@click.option("--w4-prompts", type=click.IntRange(min=1), default=_D.early_stop.prompts, show_default=True,
              help="Rows of the W4 line (early-stop).")
@click.option("--w4-gbs", type=click.IntRange(min=1), default=_D.early_stop.gbs, show_default=True,
              help="GPU batch of flexbatch in the W4 line.")
@click.option("--memory-limit", metavar="SIZE|baseline+SHAREx", help="Also run each side of the disk line in its "
              "own cgroup v1 memory group (needs root), decode- and prefill-heavy: of this size (e.g. 700MiB), or "
              "of each side's measured baseline plus SHARE of the weights (e.g. baseline+0.4x).")
@click.option("--memory-limit-batches", default=",".join(map(str, MemoryLimitConfig.acc_batches)), show_default=True,
              help="Accelerate batch sizes under --memory-limit (\"\": no Accelerate side).")
@click.option("--memory-workload", multiple=True, metavar="ROWSxPROMPT+GEN",
              help="A workload under --memory-limit instead of decode-heavy 128x16+64 and prefill-heavy 128x128+32 "
                   "(repeatable), e.g. 256x128+64.")
@click.option("--memory-limit-dtype", type=click.Choice(["bfloat16", "float32"]), default=MemoryLimitConfig.dtype,
              show_default=True, help="What both sides compute in under --memory-limit (float32 where the CPU has "
                                      "no bf16 arithmetic: AVX2 only).")
@click.option("--memory-limit-formats", type=click.Choice(("uncompressed", *WEIGHT_FORMATS)), multiple=True,
              default=MemoryLimitConfig.formats, show_default=True,
              help="flexbatch's runs under --memory-limit (repeatable): planned without compression, or with "
                   "weights in a pinned format (bf16 with --memory-limit-dtype float32).")
@click.option("--llama-cpp", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Under --memory-limit, also run llama.cpp in a memory group of its own: llama-batched-bench on a "
                   "GGUF of the checkpoint of the width of each compressed --memory-limit-formats (int4: Q4_0, "
                   "int8: Q8_0; converted once, beside the checkpoint), mapped (its default) and read into its buffers "
                   "(-lm none), the faster against flexbatch; DIR is a "
                   f"build of {lc.SETUP_SCRIPT} DIR.  [default: no llama.cpp side]")
@click.option("--cache-dir", default=_D.cache_dir, show_default=True, help="Checkpoints and offloaded weights.")
@click.option("--output", type=click.Path(path_type=Path), default=Path("out/bench/engine.json"), show_default=True)
def engine_command(output: Path, threads, blocks, hf_batches, offload_blocks, accelerate_batches, skip, w4_prompts,
                   w4_gbs, memory_limit, **kw):
    """The engine vs a bf16 GEMM, transformers generate, and HF Accelerate disk offload; 4-bit vs bf16."""
    setup_logging()
    if threads:
        torch.set_num_threads(threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    acc = kw.pop("memory_limit_batches")  # "": no Accelerate side under the limit
    cfg = BenchConfig(blocks=_blocks(blocks), hf_batches=_ints(hf_batches), offload_blocks=_blocks(offload_blocks),
                      accelerate_batches=_ints(accelerate_batches), skip=tuple(skip),
                      backends=parse_backends(kw.pop("backends")),
                      memory_limit=_memory_limit(memory_limit, _ints(acc) if acc else (),
                                                 kw.pop("memory_workload"), kw.pop("memory_limit_dtype"),
                                                 tuple(kw.pop("memory_limit_formats")), kw.pop("llama_cpp")),
                      early_stop=dataclasses.replace(_D.early_stop, prompts=w4_prompts, gbs=w4_gbs,
                                                     repeats=kw["repeats"]), **kw)
    report = run_and_save(run_engine_bench, cfg, output)
    click.echo(table_text(report))
    click.echo(f"machine: {report['machine']['cpu_model']}, {report['machine']['torch_threads']} threads, "
               f"torch {report['machine']['torch']}; {report['wall_seconds']:.0f} s; json: {output}")
