"""`flexbatch bench engine --backends native,ipex`: the kernel backends side by side on the same model and
workload, in one run: speed interleaved repeat by repeat in this process, median quoted (`jobs/bench/engine.py` says
why), memory in a fresh process per backend.

For plain and for 4-bit weights, each backend runs the best block of the engine sweep. The engine times its
prefill step and its decode steps (`Engine.phase_seconds`), so that
    prefill tokens/s = rows * prompt_len / prefill s,      decode tokens/s = rows * (gen_len - 1) / decode s.
Peak memory: a subprocess imports torch and transformers and reads its RSS, then sets up the backend (importing
IPEX adds ~300 MiB), loads the engine and runs the block once; the figure is its peak RSS (VmHWM) less that
baseline: what choosing the backend costs. A separate process per backend, because engines loaded one after
another in one process reuse each other's freed memory, and one backend's imports would count for the other.
IPEX needs torch 2.8: run this in its own environment (scripts/setup_ipex_venv.sh), where both backends exist."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import click
import torch

from engine.engine import Engine
from engine.policy import Policy
from jobs.bench import models as bm
from jobs.bench.report import Line
from jobs.bench.runs import DTYPE, engine_runner, generations
from jobs.bench.side_by_side import summarize

log = logging.getLogger(__name__)
BASELINE = "native"
COMPARABLE = ("native", "aten", "ipex")
FORMATS = {"": ("plain", False), "_w4": ("4-bit weights", True)}  # line id suffix: (what, compress_weight)


def parse_backends(text: str | None) -> tuple[str, ...]:
    """`native,ipex` -> ("native", "ipex"); native is the baseline and must be named, with at least one other."""
    if not text:
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in COMPARABLE]
    if bad or BASELINE not in names or len(names) < 2:
        raise click.BadParameter(f"{text!r}: name {BASELINE} and at least one other of {', '.join(COMPARABLE)}, "
                                 "comma-separated, e.g. native,ipex")
    return names


def phase_rates(runs: list[dict], rows: int, prompt_len: int, gen_len: int) -> list[dict]:
    """Each timed run's prefill and decode tokens/s, from the engine's own phase seconds."""
    return [{"prefill_tokens_per_s": rows * prompt_len / s["prefill"],
             "decode_tokens_per_s": rows * (gen_len - 1) / s["decode"] if s["decode"] else None}
            for s in (r["phase_seconds"] for r in runs)]


def probe_rss(job: dict) -> dict[str, int]:
    """Bytes of RSS the backend's imports and an engine (load + one run of the block) add in a fresh process,
    and the imports alone: see the module docstring."""
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    done = subprocess.run([sys.executable, "-m", "jobs.bench.backends", json.dumps(job)], capture_output=True,
                          text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe {job} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _probe_main(job: dict) -> None:
    import transformers  # noqa: F401  (the libraries count in the baseline, not in the engine's share)

    from engine.kernels.backend import load_kernels

    torch.set_num_threads(job["threads"])
    baseline = bm.rss_bytes()
    load_kernels(job["backend"])
    imports = bm.rss_bytes() - baseline
    eng = Engine.load(job["model_dir"], dtype=DTYPE, policy=Policy(compress_weight=job["compress_weight"]),
                      backend=job["backend"])
    prompts = bm.prompt_ids(job["rows"], job["prompt_len"], eng.spec.vocab_size)
    engine_runner(eng, prompts, *job["block"])(job["gen_len"])
    print(json.dumps({"added_bytes": bm.peak_rss_bytes() - baseline, "import_bytes": imports}))


def backend_lines(cfg, model_dir, prompts, block: tuple[int, int]) -> list:
    """Per weight format, each backend against native: prefill, decode and whole-run tokens/s, peak RSS added."""
    lines = []
    for suffix, (fmt, compress) in FORMATS.items():
        job = {"model_dir": str(model_dir), "compress_weight": compress, "block": block, "rows": len(prompts),
               "prompt_len": cfg.prompt_len, "gen_len": cfg.gen_len, "threads": torch.get_num_threads()}
        rss = {name: probe_rss({**job, "backend": name}) for name in cfg.backends}
        engines = {name: Engine.load(model_dir, dtype=DTYPE, policy=Policy(compress_weight=compress), backend=name)
                   for name in cfg.backends}
        res = generations({name: engine_runner(eng, prompts, *block) for name, eng in engines.items()}, cfg.gen_len,
                          cfg.repeats)
        phases = {name: phase_rates(r["runs"], block[0] * block[1], cfg.prompt_len, cfg.gen_len)
                  for name, r in res.items()}
        med = {name: summarize(phases[name]) for name in cfg.backends}
        detail = {"block": block, "runs": res, "phases": phases, "rss_added_bytes": rss}
        for name in (n for n in cfg.backends if n != BASELINE):
            where = f"{fmt}, block {block[0]}x{block[1]}, {name} vs {BASELINE}"
            lines += [Line(f"{name}{suffix}_prefill", f"prefill, {where}", "tokens/s",
                           med[name]["prefill_tokens_per_s"], med[BASELINE]["prefill_tokens_per_s"], None, detail),
                      Line(f"{name}{suffix}_decode", f"decode, {where}", "tokens/s", med[name]["decode_tokens_per_s"],
                           med[BASELINE]["decode_tokens_per_s"]),
                      Line(f"{name}{suffix}_total", f"whole run (generated tokens), {where}", "tokens/s",
                           res[name]["tokens_per_s"], res[BASELINE]["tokens_per_s"]),
                      Line(f"{name}{suffix}_rss", f"peak RSS added (imports + load + one run, own process), {where}",
                           "MiB", rss[name]["added_bytes"] / 2**20, rss[BASELINE]["added_bytes"] / 2**20)]
    return lines


if __name__ == "__main__":
    _probe_main(json.loads(sys.argv[1]))
