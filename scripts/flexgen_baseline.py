"""FlexGen 0.1.8 against flexbatch on the same OPT shape, GPU budget, block and placement, offline.

    python3 scripts/flexgen_baseline.py [--preset opt-1.3b] [--gpu-mem SIZE] [--gpu-batch-size 32] \\
        [--num-gpu-batches 1] [--prompt-len 512] [--gen-len 32] [--json PATH]

FlexGen's `flexgen.flex_opt` runs with dummy weights (`--path _DUMMY_`, all ones) and a `--percent` placement
derived from the GPU budget: the same whole layers' worth of weights on the GPU as the offloading baseline of
`flexbatch bench gpu` keeps (what the budget holds after two staged layers, the block's activations and the
embeddings and head, which flexbatch keeps on the GPU here), the activations on the GPU when they fit, the KV cache on the GPU only when it fits after them, else on the CPU with
attention computed there (`--cpu-cache-compute`). Its main loads the "facebook/opt-30b" tokenizer from the hub,
which an offline machine cannot reach, so `AutoTokenizer.from_pretrained` is replaced by a local word-level
tokenizer (every word of FlexGen's test prompt is unknown, so its prompts are prompt_len ids, none of them padding,
as ours are). FlexGen runs in a child process (`--system flexgen`) under its own timeout; then flexbatch runs the
same policy on a random-weight checkpoint of the same shape (`--system ours`; FlexGen computes in float16,
flexbatch in bfloat16). Each prints its figures; the parent prints both and their ratio on a last line that
starts with "summary:".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.memory.footprint import global_bytes  # noqa: E402
from engine.options import parse_bytes  # noqa: E402
from engine.policy import Policy  # noqa: E402
from jobs.bench.gpu_models import GPU_PRESETS, build_gpu_checkpoint, default_gpu_budget  # noqa: E402
from jobs.bench.gpu_policies import act_bytes, kv_bytes, offload_gpu_layers  # noqa: E402

FIGURES = ("prefill latency", "decode latency", "total latency", "prefill throughput", "decode throughput",
           "total throughput")


def spec_for(preset: str):
    """The engine's ModelSpec of an OPT preset, from its config alone (no weights needed)."""
    from engine.spec import spec_from_config

    return spec_from_config(GPU_PRESETS[preset].hf_config().to_dict() | {"model_type": "opt"})


def placement(args) -> dict:
    """FlexGen's six percents and the matching flexbatch Policy for the budget and block (see the module doc)."""
    spec = spec_for(args.preset)
    rows = args.gpu_batch_size * args.num_gpu_batches
    budget = parse_bytes(args.gpu_mem, "--gpu-mem") if args.gpu_mem else default_gpu_budget(spec)
    layers = offload_gpu_layers(spec, budget, 2, rows, args.prompt_len)
    wg = 100 * layers // spec.num_layers
    free = budget - layers * spec.params_per_layer * 2 - 2 * spec.params_per_layer * 2 - global_bytes(spec, 2)
    hg = 100 if act_bytes(spec, rows, args.prompt_len) <= free else 0
    cg = 100 if hg and act_bytes(spec, rows, args.prompt_len) + kv_bytes(
        spec, rows, args.prompt_len + args.gen_len, 2) <= free else 0
    percent = [wg, 100 - wg, cg, 100 - cg, hg, 100 - hg]
    policy = Policy.from_percent(tuple(float(p) for p in percent), gbs=args.gpu_batch_size,
                                 num_gb=args.num_gpu_batches, prefill_device="gpu", decode_device="gpu",
                                 cpu_attention=cg == 0)
    return {"budget_bytes": budget, "gpu_layers": layers, "percent": percent, "policy": policy.to_dict()}


def run_flexgen(args, place: dict) -> dict:
    """FlexGen's flex_opt in this process, its hub tokenizer replaced by a local one; its log file parsed."""
    import transformers

    from jobs.bench import models as bm

    folder = Path(tempfile.mkdtemp(prefix="flexgen-baseline-"))
    tok = bm.make_word_tokenizer(folder / "tokenizer", 16)
    tok.padding_side = "left"
    transformers.AutoTokenizer.from_pretrained = staticmethod(lambda *a, **k: tok)
    from flexgen import flex_opt

    log_file = folder / "flexgen.log"
    argv = ["--model", f"facebook/{args.preset}", "--path", "_DUMMY_", "--offload-dir", str(folder / "offload"),
            "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len),
            "--gpu-batch-size", str(args.gpu_batch_size), "--num-gpu-batches", str(args.num_gpu_batches),
            "--percent", *map(str, place["percent"]), "--log-file", str(log_file), "--verbose", "1"]
    if place["percent"][2] == 0:
        argv.append("--cpu-cache-compute")
    parser = argparse.ArgumentParser()
    flex_opt.add_parser_arguments(parser)
    t0 = time.perf_counter()
    flex_opt.run_flexgen(parser.parse_args(argv))
    text = log_file.read_text()
    figures = {name: float(re.search(rf"{name}: ([0-9.eE+-]+)", text).group(1)) for name in FIGURES}
    return {"system": "flexgen 0.1.8", "argv": argv, "log": text, "wall_s": time.perf_counter() - t0, **figures}


def run_ours(args, place: dict) -> dict:
    """flexbatch on a random-weight checkpoint of the same shape under the same policy and budget: a warm-up
    (2 tokens), then `repeats` timed runs, the median quoted as FlexGen's figures are named."""
    import statistics

    from engine.engine import Engine
    from engine.request import Request, SamplingParams
    from engine.spec import load_model_spec
    from jobs.bench.planner import _eos, requests_for
    from planner.workload import Workload

    model_dir = build_gpu_checkpoint(args.preset, args.cache_dir)
    spec, policy = load_model_spec(model_dir), Policy.from_dict(place["policy"])
    eng = Engine.load(model_dir, dtype="bfloat16", policy=policy, budgets={"gpu": place["budget_bytes"]},
                      simulate_gpu=args.simulate_gpu, offload_dir=Path(args.cache_dir) / "offload")
    rows = args.gpu_batch_size * args.num_gpu_batches
    reqs = requests_for(spec, Workload(args.prompt_len, args.gen_len, rows), _eos(model_dir, spec))
    try:
        eng.generate([Request(r.id, "", SamplingParams(max_new_tokens=2), r.forced_ids, r.prompt_ids) for r in reqs])
        runs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = eng.generate(reqs)
            runs.append({"total": time.perf_counter() - t0, **eng.phase_seconds})
            assert all(c.completion_tokens == args.gen_len and not c.error for c in out), "rows stopped early"
    finally:
        eng.weights.close()
    med = {k: statistics.median(r[k] for r in runs) for k in ("total", "prefill", "decode")}
    return {"system": "flexbatch", "runs": runs, "prefill latency": med["prefill"], "decode latency": med["decode"],
            "total latency": med["total"], "prefill throughput": rows * args.prompt_len / med["prefill"],
            "decode throughput": rows * (args.gen_len - 1) / med["decode"],
            "total throughput": rows * args.gen_len / med["total"]}


def child(args, system: str, out: Path) -> dict:
    """Run one system in a child process (its own CUDA context and threads) under args.timeout."""
    cmd = [sys.executable, __file__, "--system", system, "--json", str(out), *forwarded(args)]
    try:
        proc = subprocess.run(cmd, timeout=args.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"system": system, "error": f"timed out after {args.timeout} s"}
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0 or not out.is_file():
        lines = proc.stderr.strip().splitlines() or ["no output"]
        raised = [line for line in lines if re.match(r"\w*(Error|Exception)\b", line)]  # the exception, not a frame
        return {"system": system, "error": f"exit {proc.returncode}: {(raised or lines)[-1].strip()}"}
    return json.loads(out.read_text())


def forwarded(args) -> list[str]:
    out = ["--preset", args.preset, "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len),
           "--gpu-batch-size", str(args.gpu_batch_size), "--num-gpu-batches", str(args.num_gpu_batches),
           "--repeats", str(args.repeats), "--cache-dir", args.cache_dir]
    out += ["--gpu-mem", args.gpu_mem] if args.gpu_mem else []
    return out + (["--simulate-gpu"] if args.simulate_gpu else [])


def run_one(args, place: dict) -> int:
    """One system in this process. It ends with os._exit: FlexGen's copy threads are not daemons, and after a
    failure nothing stops them, so a normal exit could wait for them forever."""
    code = 1
    try:
        result = (run_flexgen if args.system == "flexgen" else run_ours)(args, place)
        result["placement"] = place
        print(json.dumps({k: v for k, v in result.items() if k != "log"}, default=str))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1, default=str))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def summary_line(place: dict, results: dict) -> str:
    def fig(r):
        return "error: " + r["error"] if "error" in r else f"{r['total throughput']:.1f} tokens/s ({r['total latency']:.2f} s)"

    fg, ours = results.get("flexgen", {}), results.get("ours", {})
    ratio = ""
    if "total throughput" in fg and "total throughput" in ours:
        ratio = f"; ours / FlexGen = {ours['total throughput'] / fg['total throughput']:.2f}x"
    return (f"summary: --percent {' '.join(map(str, place['percent']))}: FlexGen 0.1.8 {fig(fg)}, flexbatch same "
            f"policy {fig(ours)}{ratio}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=[k for k, v in GPU_PRESETS.items() if v.family == "opt"], default="opt-1.3b")
    p.add_argument("--gpu-mem", default=None, help="GPU budget (e.g. 640MiB); default: as flexbatch bench gpu's, the embeddings and head plus a quarter of the bf16 layers")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen-len", type=int, default=32)
    p.add_argument("--gpu-batch-size", type=int, default=32)
    p.add_argument("--num-gpu-batches", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="timed runs of flexbatch (FlexGen times one)")
    p.add_argument("--system", choices=("both", "flexgen", "ours"), default="both")
    p.add_argument("--timeout", type=int, default=200, help="seconds for each system's child process")
    p.add_argument("--simulate-gpu", action="store_true", help="test only: flexbatch's GPU tier on the CPU")
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "flexbatch" / "bench"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    place = placement(args)
    if args.system != "both":
        return run_one(args, place)
    folder = Path(tempfile.mkdtemp(prefix="flexgen-compare-"))
    results = {name: child(args, name, folder / f"{name}.json") for name in ("flexgen", "ours")}
    report = {"placement": place, "config": vars(args) | {"json": str(args.json)}, "results": results}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
    for name, r in results.items():
        print(f"{name}: " + ("error: " + r["error"] if "error" in r else
                             ", ".join(f"{k} {r[k]:.3f}" for k in FIGURES)))
    print(summary_line(place, results))
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
