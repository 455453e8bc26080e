"""Whole processes, as users compare engines (`flexbatch bench workloads --whole-process FORMAT`): a workload's
prompts (the in-process lines' prompts) go into a Parquet file, and each line is a command run as its own process,
timed from its start to its exit: `flexbatch run --no-ray` with the given weight format and the run's dtype, and
a CTranslate2 int8 script (jobs/bench/ct2_script.py: load the converted model, tokenize, generate, decode), run
twice: as users run it, and with glibc told (by its environment variables) to keep and reuse freed heap blocks, the
policy flexbatch's engine sets for itself; ratios are to the faster of the two. The
lines run interleaved, round by round, after one untimed round that warms the operating system's caches and the
hardware profile and kernel rates flexbatch measures on first use (as on a machine that ran a job before); the
median of the timed rounds is quoted. Both sides get the same threads: OMP_NUM_THREADS for every process, and
the CTranslate2 generator's intra_threads. With a vLLM venv (--vllm-venv) a vLLM job (jobs/bench/vllm_script.py,
the same prompts as token ids, the run's dtype) runs too, as vLLM's CPU docs advise: its OpenMP threads bound to
cores 0..threads-1 with none reserved, tcmalloc and its libiomp5 preloaded. Every row of every run must generate
exactly G tokens (the bench checkpoints have no EOS; the outputs are read back and checked), so tokens/s counts the
same work on each side."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import pyarrow as pa
import pyarrow.parquet as pq

from engine.memory.heap import KEEP_FREED
from jobs.bench import models as bm
from jobs.bench.side_by_side import side_by_side
from jobs.bench.table import Column, num

FORMATS = {"int8": ("--compress-weight", "int8"), "int4": ("--compress-weight", "int4"), "uncompressed": ()}
SCRIPT = Path(__file__).with_name("ct2_script.py")
VLLM_SCRIPT = Path(__file__).with_name("vllm_script.py")
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")  # Debian's libtcmalloc-minimal4
CT2_LINE = "ctranslate2 int8 script"
CT2_HEAP_LINE = "ctranslate2 int8 script, heap reusing freed blocks"
# glibc's environment equivalents of the engine's reuse_freed_blocks (engine/memory/heap.py): every block from the heap,
# freed memory kept there. Without them a fresh CTranslate2 process faults its buffers in afresh at every step
# (W2 in one process: 43 million page faults, 231 tokens/s, against 618 with them).
REUSE_HEAP_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(KEEP_FREED)}
CT2_LINES = {CT2_LINE: {}, CT2_HEAP_LINE: REUSE_HEAP_ENV}  # name -> environment added


def write_prompts(path: Path, prompts: list[list[int]]) -> Path:
    """The prompts as a job's input: an id and the prompt text (which tokenizes back to exactly its ids)."""
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(prompts))],
                             "prompt": [bm.prompt_text(ids) for ids in prompts]}), path)
    return path


def write_prompt_ids(path: Path, prompts: list[list[int]]) -> Path:
    """The prompts as token ids (the vLLM script's input: both engines see the same ids)."""
    pq.write_table(pa.table({"prompt_ids": prompts}), path)
    return path


def vllm_line_name(dtype: str) -> str:
    return f"vllm {dtype} script"


def flexbatch_exe() -> list[str]:
    """The `flexbatch` console script beside this interpreter, else `python -m jobs.cli` (the same CLI)."""
    exe = Path(sys.executable).with_name("flexbatch")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "jobs.cli"]


def flexbatch_command(model_dir: Path, input_: Path, output: Path, gen_len: int, dtype: str, fmt: str) -> list[str]:
    return [*flexbatch_exe(), "run", "--no-ray", "--model", str(model_dir), "--input", str(input_), "--output",
            str(output), "--max-new-tokens", str(gen_len), "--dtype", dtype, *FORMATS[fmt]]


def ct2_command(ct2_dir: Path, tokenizer: Path, input_: Path, gen_len: int, threads: int) -> list[str]:
    return [sys.executable, str(SCRIPT), "--model", str(ct2_dir), "--tokenizer", str(tokenizer), "--input",
            str(input_), "--max-new-tokens", str(gen_len), "--threads", str(threads), "--compute-type", "int8"]


def vllm_command(python: Path, model_dir: Path, input_: Path, gen_len: int, dtype: str, score: bool = False,
                 logprobs_out: Path | None = None, warm_up_rows: int = 0) -> list[str]:
    """The vLLM script run by the vLLM venv's python: generate gen_len tokens per row, or (score) score the prompts."""
    argv = [str(python), str(VLLM_SCRIPT), "--model", str(model_dir), "--input", str(input_), "--dtype", dtype]
    argv += ["--score"] if score else ["--max-new-tokens", str(gen_len)]
    if logprobs_out is not None:
        argv += ["--logprobs-out", str(logprobs_out)]
    return argv + (["--warm-up-rows", str(warm_up_rows)] if warm_up_rows else [])


def vllm_env(python: Path, threads: int) -> dict[str, str]:
    """vLLM CPU at its documented best: its OpenMP threads bound to cores 0..threads-1, none reserved for its
    other work (by default it keeps one back), tcmalloc (where installed) and its bundled libiomp5 preloaded."""
    venv = Path(python).parent.parent
    preload = [str(TCMALLOC)] if TCMALLOC.is_file() else []
    preload += [str(venv / "lib" / "libiomp5.so")] if (venv / "lib" / "libiomp5.so").is_file() else []  # intel-openmp
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0" if threads == 1 else f"0-{threads - 1}",
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    if preload:
        env["LD_PRELOAD"] = ":".join(preload + [p for p in [os.environ.get("LD_PRELOAD")] if p])
    return env


def check_script_output(stdout: str, rows: int, prompt_len: int, gen_len: int, script: str = "the vLLM script") -> dict:
    """A script's JSON line (the last line of its output that is one), once each of `rows` rows kept its whole
    prompt and generated exactly gen_len."""
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        raise click.ClickException(f"{script} printed no JSON line: {stdout.strip()[-300:]!r}")
    res = json.loads(lines[-1])
    counts, prompts = res["completion_tokens"], res["prompt_tokens"]
    if res["rows"] != rows or set(counts) != {gen_len} or set(prompts) != {prompt_len}:
        raise click.ClickException(f"{script} generated {sorted(set(counts))} tokens from {sorted(set(prompts))}-token "
                                   f"prompts for {res['rows']} rows, not {gen_len} from {prompt_len} for {rows}")
    return res


# Starts the command and measures it from a small process of its own: a child's peak RSS (wait4's ru_maxrss) also
# counts the memory of the process it was forked from, which here would be the benchmark's, torch and all.
LAUNCHER = r"""
import json, os, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
seconds = time.perf_counter() - started
with open(sys.argv[1], "w") as f:
    json.dump({"seconds": seconds, "exit": os.waitstatus_to_exitcode(status),
               "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024}, f)
"""


def run_process(argv: list[str], threads: int, workdir: Path, env: dict[str, str] | None = None) -> dict:
    """Run one command to its exit (with `env` added to the environment): wall seconds from its start to its exit,
    its CPU seconds and peak RSS (its rusage), and its stdout. A failed command is an error that shows its last
    output."""
    out_path, err_path, measured = workdir / "stdout.txt", workdir / "stderr.txt", workdir / "measured.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), **(env or {})}
    with open(out_path, "w") as out, open(err_path, "w") as err:
        subprocess.run([sys.executable, "-c", LAUNCHER, str(measured), *argv], stdout=out, stderr=err, env=env,
                       check=False)
    done = json.loads(measured.read_text()) if measured.is_file() else {"exit": None}
    if done["exit"] != 0:
        raise click.ClickException(f"`{shlex.join(argv)}` exited {done['exit']}: {err_path.read_text().strip()[-600:]}")
    return {k: done[k] for k in ("seconds", "cpu_seconds", "peak_rss_bytes")} | {"stdout": out_path.read_text()}


def check_flexbatch_output(output: Path, ids: list[str], prompt_len: int, gen_len: int) -> int:
    """The generated tokens of a `flexbatch run` output folder, once every input row is there exactly once,
    without error, with its whole prompt and exactly gen_len generated tokens (anything else would compare
    other work than the baseline's)."""
    parts = sorted(p for p in output.glob("*.parquet") if not p.name.startswith("_"))
    table = pa.concat_tables([pq.read_table(p, columns=["id", "prompt_tokens", "completion_tokens", "error"])
                              for p in parts]).to_pylist() if parts else []
    got = [r["id"] for r in table]
    if sorted(got) != sorted(ids):
        raise click.ClickException(f"flexbatch run wrote {len(got)} rows ({len(set(got))} distinct ids) for "
                                   f"{len(ids)} input rows in {output}")
    for r in table:
        if r["error"] or r["prompt_tokens"] != prompt_len or r["completion_tokens"] != gen_len:
            raise click.ClickException(
                f"flexbatch run row {r['id']}: {r['completion_tokens']} tokens generated from a {r['prompt_tokens']}"
                f"-token prompt (error: {r['error']}), not {gen_len} from {prompt_len}: a comparison needs exactly "
                f"G tokens from every row (a checkpoint without EOS)")
    return len(table) * gen_len


def flexbatch_summary(output: Path, threads: int) -> dict:
    """What the run says of itself in _SUCCESS: its seconds spent generating, the planned block and setup seconds;
    its one worker must have run on `threads` threads (both sides pinned alike)."""
    done = json.loads((output / "_SUCCESS").read_text())
    (worker,) = done["workers"]
    if worker["threads"] != threads:
        raise click.ClickException(f"flexbatch run used {worker['threads']} threads, not {threads}: the two sides "
                                   f"would not be pinned alike")
    return {"generate_seconds": done["generate_seconds"], "setup_seconds": worker["setup_seconds"],
            "block": f"{worker['policy']['gbs']}x{worker['policy']['num_gb']}"}


def flexbatch_line(model_dir: Path, input_: Path, ids: list[str], prompt_len: int, gen_len: int, dtype: str,
                   fmt: str, threads: int):
    def run(workdir: Path) -> dict:
        argv = flexbatch_command(model_dir, input_, workdir / "out", gen_len, dtype, fmt)
        done = run_process(argv, threads, workdir) | flexbatch_summary(workdir / "out", threads)
        return done | {"tokens": check_flexbatch_output(workdir / "out", ids, prompt_len, gen_len), "command": argv}

    return run


def ct2_line(ct2_dir: Path, tokenizer: Path, input_: Path, rows: int, prompt_len: int, gen_len: int, threads: int,
             env: dict[str, str]):
    def run(workdir: Path) -> dict:
        argv = ct2_command(ct2_dir, tokenizer, input_, gen_len, threads)
        done = run_process(argv, threads, workdir, env)
        res = check_script_output(done["stdout"], rows, prompt_len, gen_len, "the CTranslate2 script")
        return done | {"tokens": rows * gen_len, "command": argv, "generate_seconds": res["generate_seconds"]}

    return run


def vllm_line(python: Path, model_dir: Path, input_: Path, rows: int, prompt_len: int, gen_len: int, dtype: str,
              threads: int):
    def run(workdir: Path) -> dict:
        argv = vllm_command(python, model_dir, input_, gen_len, dtype)
        done = run_process(argv, threads, workdir, vllm_env(python, threads))
        res = check_script_output(done["stdout"], rows, prompt_len, gen_len)
        return done | {"tokens": rows * gen_len, "command": argv, "generate_seconds": res["generate_seconds"],
                       "generate_cpu_seconds": res["generate_cpu_seconds"], "startup_seconds": res["startup_seconds"]}

    return run


def in_folder(run, tmp: Path):
    """A whole-process line: each run(workdir) in a fresh folder under `tmp`, removed after it, with its tokens/s."""
    def call() -> dict:
        workdir = Path(tempfile.mkdtemp(dir=tmp))
        done = run(workdir)
        shutil.rmtree(workdir)
        return done | {"tokens_per_s": done["tokens"] / done["seconds"]}

    return call


def run_whole_processes(model_dir: Path, ct2_dir: Path | None, prompts: list[list[int]], gen_len: int, dtype: str,
                        formats: tuple[str, ...], threads: int, repeats: int, vllm: Path | None = None) -> dict:
    """Time `flexbatch run` with each weight format, (with ct2_dir) the CTranslate2 int8 script and (with `vllm`,
    the vLLM venv's python) the vLLM script as whole processes: one untimed round, then `repeats` rounds, the
    lines interleaved in each."""
    rows, prompt_len, ids = len(prompts), len(prompts[0]), [f"r{i}" for i in range(len(prompts))]
    with tempfile.TemporaryDirectory(prefix="flexbatch-whole-process-") as tmp:
        input_ = write_prompts(Path(tmp) / "prompts.parquet", prompts)
        runners = {f"flexbatch run {dtype} {fmt}": flexbatch_line(model_dir, input_, ids, prompt_len, gen_len, dtype,
                                                                  fmt, threads) for fmt in formats}
        for name, env in CT2_LINES.items() if ct2_dir is not None else ():
            runners[name] = ct2_line(ct2_dir, model_dir / "tokenizer.json", input_, rows, prompt_len, gen_len,
                                     threads, env)
        if vllm is not None:
            ids_input = write_prompt_ids(Path(tmp) / "prompt_ids.parquet", prompts)
            runners[vllm_line_name(dtype)] = vllm_line(vllm, model_dir, ids_input, rows, prompt_len, gen_len, dtype,
                                                       threads)
        lines = {name: in_folder(run, Path(tmp)) for name, run in runners.items()}
        res = side_by_side(lines, repeats, warm_up=lines)
    return {"threads": threads, "rounds": repeats, "lines": whole_process_lines(res)}


def whole_process_lines(res: dict[str, dict]) -> list[dict]:
    """Per line, its figures over the timed rounds (`side_by_side`'s; the warm-up round kept apart) and the ratio of
    its tokens/s to the faster CTranslate2 script's (the same tokens: the inverse ratio of their wall times)."""
    base = max((res[name]["tokens_per_s"] for name in CT2_LINES if name in res), default=None)
    figures = ("tokens", "tokens_per_s", "seconds", "generate_seconds", "cpu_seconds", "peak_rss_bytes")
    return [{"line": name, **{k: r[k] for k in figures}, "vs_ct2_int8": base and r["tokens_per_s"] / base,
             "block": r["runs"][-1].get("block"), "startup_seconds": r.get("startup_seconds"),
             "generate_cpu_seconds": r.get("generate_cpu_seconds"), "runs_seconds": [x["seconds"] for x in r["runs"]],
             "warm_up_seconds": r["warm_up"]["seconds"], "command": shlex.join(r["runs"][-1]["command"])}
            for name, r in res.items()]


COLUMNS = tuple(Column(t) for t in ("workload", "line", "process start to exit, s (median)", "tokens/s",
                                     "vs the faster CTranslate2 int8 script", "of which generating, s", "CPU s",
                                     "peak RSS", "start-up to a loaded engine, s"))


def table_rows(workload: str, whole: dict) -> list[tuple[str, ...]]:
    return [(workload, ln["line"], f"{ln['seconds']:.2f}", f"{ln['tokens_per_s']:.1f}",
             f"{ln['vs_ct2_int8']:.2f}x" if ln["vs_ct2_int8"] else "-", num(ln["generate_seconds"], ".2f") + (
                 f" ({ln['generate_cpu_seconds']:.1f} CPU-s)" if ln.get("generate_cpu_seconds") else ""),
             num(ln["cpu_seconds"], ".1f"),
             f"{ln['peak_rss_bytes'] / 2**20:.0f} MiB", num(ln.get("startup_seconds"), ".1f")) for ln in whole["lines"]]
