"""`flexbatch bench engine --memory-limit`: flexbatch vs HF Accelerate over a real memory limit.

Each side runs as a whole process of its own inside its own cgroup v1 memory group (`memory.limit_in_bytes`),
which charges the page cache to the group: a model larger than the limit must come from the disk. flexbatch
keeps what fits of the weights in memory and reads the rest with O_DIRECT (engine/memory/disk_read.py); Accelerate
uses `device_map="auto"` with `max_memory` and an `offload_folder`. Reported per side and batch: generated
tokens/s of the generation, the whole process's wall time, the group's peak memory, and whether the kernel
killed it (OOM). Accelerate's figure is its best batch that survives the limit.

The limit is either one size for both sides, or `baseline+SHAREx`: each side's own baseline (the group's peak
while the process imports what it runs and reads the config, measured in a group without a limit) plus SHARE
of the model's weight bytes, so that less than the model fits whatever each side's imports weigh. flexbatch's
policy is the planner's, under the room its group leaves (and, in a second run, with 4-bit compression allowed);
Accelerate runs at each of its batches. With a llama.cpp build (`llama_cpp`), llama.cpp's `llama-batched-bench` runs
too, on a GGUF of the checkpoint of the same width as each of flexbatch's compressed formats (int4: Q4_0, int8:
Q8_0), converted once outside the groups, loaded inside its group in each of llama.cpp's load modes (mapped, its
default, and read into its buffers: jobs/bench/llama_cpp.py); its tokens/s count its prefill and decode seconds, as
flexbatch's and Accelerate's count their generation's, and its best mode is the line's baseline."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from jobs.bench import llama_cpp as lc
from jobs.bench.report import Line
from planner.microbench import timed_call

log = logging.getLogger(__name__)
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


class CgroupUnavailable(RuntimeError):
    pass


def check_cgroups(root: Path | None = None) -> None:
    """Refuse where memory groups cannot be made: the limit would not be real."""
    root = root or CGROUP_ROOT
    if not (root / "memory.limit_in_bytes").is_file() or not os.access(root, os.W_OK):
        raise CgroupUnavailable(
            f"--memory-limit needs a writable cgroup v1 memory controller at {root} (run as root on a machine "
            "with cgroup v1 memory groups), or leave --memory-limit out")


def _exit_on_term(signum, frame) -> None:
    """SIGTERM as SystemExit, so that `subprocess.run` kills the side's process and the group is removed (Python's
    default would leave both behind)."""
    raise SystemExit(128 + signum)


class MemoryGroup:
    """A cgroup v1 memory group with a limit, removed on exit; `run` starts a process inside it."""

    def __init__(self, name: str, limit_bytes: int, root: Path | None = None):
        check_cgroups(root)
        self.path = (root or CGROUP_ROOT) / f"flexbatch-bench-{os.getpid()}-{name}"
        self.limit = int(limit_bytes)

    def __enter__(self) -> MemoryGroup:
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
        self._on_term = None
        if threading.current_thread() is threading.main_thread():  # SIGTERM: the side killed, the group removed
            self._on_term = signal.signal(signal.SIGTERM, _exit_on_term)
        return self

    def __exit__(self, *exc) -> None:
        if self._on_term is not None:
            signal.signal(signal.SIGTERM, self._on_term)
        # a process still in the group is killed: a SIGTERM that lands while `run` starts the side (after it joined
        # the group, before `subprocess` holds it) leaves the side running, and the group could not be removed
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        for _ in range(50):  # the group can be removed once its last process has gone
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        log.warning("could not remove %s", self.path)

    def _stat(self, name: str) -> int:
        return int((self.path / name).read_text().split()[0])

    def run(self, args: list[str], timeout_s: float) -> dict:
        """Run `args` inside the group: its JSON result (last stdout line), wall seconds, peak bytes, OOM."""
        procs = self.path / "cgroup.procs"

        def call():
            try:
                p = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s,
                                   preexec_fn=lambda: procs.write_text(str(os.getpid())))
                return p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired as e:
                return None, e.stdout or "", e.stderr or ""

        (code, out, err), wall = timed_call(call)
        oom = any(line.startswith("oom_kill ") and int(line.split()[1]) > 0
                  for line in (self.path / "memory.oom_control").read_text().splitlines())
        lines = [x for x in str(out).splitlines() if x.startswith("{")]
        result = json.loads(lines[-1]) if code == 0 and lines else None
        return {"result": result, "returncode": code, "wall_s": wall, "oom_killed": oom or code == -9,
                "peak_bytes": self._stat("memory.max_usage_in_bytes"), "failcnt": self._stat("memory.failcnt"),
                "stderr_tail": str(err)[-600:] if result is None else ""}


@dataclass(frozen=True)
class Side:
    """One process's work: `side` is "flexbatch", "accelerate" or "llama.cpp"; rows prompts of prompt_len tokens,
    gen_len generated. Accelerate runs batches of `batch` rows; flexbatch runs the planner's policy (`batch` 0) for
    the `hardware` profile, 4-bit compression allowed with `compress`; llama.cpp runs the build in `llama_cpp` on
    the GGUF `gguf`, whose type is its `weight_format`."""

    side: str
    model_dir: str
    rows: int
    prompt_len: int
    gen_len: int
    batch: int
    cpu_bytes: int  # flexbatch: its CPU tier budget at most; Accelerate: max_memory["cpu"] at most
    offload_dir: str
    hardware: str | None = None
    compress: bool = False
    threads: int = 1
    weight_format: str = "int4"  # flexbatch's compressed format, with `compress`
    dtype: str = "bfloat16"  # both sides compute in it
    llama_cpp: str = ""  # llama.cpp: its build (scripts/setup_llama_cpp.sh)
    gguf: str = ""  # llama.cpp: the GGUF it runs
    load_mode: str = "mmap"  # llama.cpp: how it loads the GGUF (llama_cpp.LOAD_MODES)

    @property
    def name(self) -> str:
        if self.side == LLAMA_CPP:
            return llama_cpp_side(self.weight_format, self.load_mode)
        return side_name(self.side, self.weight_format if self.compress else "uncompressed")

    def files(self) -> list[Path]:
        """The files the side reads its weights from (their page cache is dropped before it runs)."""
        return [Path(self.gguf)] if self.side == LLAMA_CPP else sorted(Path(self.model_dir).glob("*.safetensors"))


LLAMA_CPP = "llama.cpp"
GGUF_TYPES = {v.strip(): k for k, v in lc.FORMATS.items() if v}  # flexbatch weight format -> GGUF type of its width


def llama_cpp_side(gguf_type: str, load_mode: str) -> str:
    """A llama.cpp side's name: "llama.cpp Q4_0 mmap", "llama.cpp Q4_0 none"."""
    return f"{lc.line_name(gguf_type)} {load_mode}"


def side_name(side: str, fmt: str) -> str:
    """A side's name in the report: flexbatch, flexbatch-4bit, flexbatch-int8, flexbatch-bf16; accelerate."""
    return side if fmt == "uncompressed" else f"{side}-{'4bit' if fmt == 'int4' else fmt}"


def side_args(side: Side, baseline: bool = False) -> list[str]:
    return [sys.executable, "-m", "jobs.bench.memory_side", *(["--baseline"] if baseline else []),
            json.dumps(asdict(side))]


def baseline_bytes(side: Side, timeout_s: float = 600.0) -> int:
    """The side's own baseline: its group's peak while it imports what it runs and reads the config (no limit)."""
    with MemoryGroup(f"{side.side}-baseline", 1 << 62) as group:
        out = group.run(side_args(side, baseline=True), timeout_s)
    if out["result"] is None:
        raise RuntimeError(f"measuring the {side.side} baseline failed: {out['stderr_tail']}")
    return out["peak_bytes"]


def drop_cached(files: list[Path]) -> None:
    """Drop the page cache of a side's weight files: pages an earlier process read stay cached, charged to
    another group (or to the parent once that group is gone), and a side reading them would not be held to its
    own limit (Accelerate maps offloaded weights straight from the checkpoint's safetensors file, llama.cpp maps
    its GGUF)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_side(side: Side, limit_bytes: int, timeout_s: float) -> dict:
    drop_cached(side.files())
    with MemoryGroup(f"{side.name}-{side.batch}".replace(" ", "-"), limit_bytes) as group:
        out = group.run(side_args(side), timeout_s)
    return {"side": side.name, "batch": side.batch, "limit_bytes": limit_bytes, **out}


@dataclass(frozen=True)
class MemoryLimitConfig:
    """`limit_bytes` for both sides, or (when None) each side's baseline + `model_share` of the weights."""

    limit_bytes: int | None = None
    model_share: float | None = None
    acc_batches: tuple[int, ...] = (4, 8, 16, 32)
    timeout_s: float = 3600.0
    workloads: tuple[tuple[str, int, int, int], ...] = ()  # (name, rows, prompt, generated); () the two below
    dtype: str = "bfloat16"
    formats: tuple[str, ...] = ("uncompressed", "int4")  # flexbatch's sides: planned uncompressed, or pinned format
    llama_cpp: str | None = None  # a llama.cpp build: its side for each compressed format (GGUF_TYPES)

    def __post_init__(self) -> None:
        if (self.limit_bytes is None) == (self.model_share is None):
            raise ValueError("give the memory limit as a size or as a share of the model, not both")
        if self.model_share is not None and not 0 < self.model_share < 1:
            raise ValueError(f"--memory-limit baseline+{self.model_share}x: the share of the model must be in (0, 1)")

    def limit_for(self, baseline: int, weight_bytes: int) -> int:
        return self.limit_bytes or int(baseline + self.model_share * weight_bytes)

    @property
    def gguf_types(self) -> tuple[str, ...]:
        """llama.cpp's sides: the GGUF type of each compressed format's width (none without a build)."""
        return tuple(GGUF_TYPES[f] for f in self.formats if f in GGUF_TYPES) if self.llama_cpp else ()

    def describe(self) -> str:
        return f"{self.limit_bytes >> 20} MiB" if self.limit_bytes else f"baseline + {self.model_share:g} x weights"


def memory_limit_runs(cfg: MemoryLimitConfig, model_dir: Path, rows: int, prompt_len: int, gen_len: int,
                      hardware: str) -> dict:
    """Every side, back to back, each in a fresh group; the best surviving run of each side. Each side's offloaded
    copies (flexbatch's converted layers, Accelerate's offload folder) are removed once that side has run: at a
    7B-class size they would not fit on the disk side by side."""
    import torch

    weights, threads = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")), torch.get_num_threads()
    runs, baselines = [], {}
    with tempfile.TemporaryDirectory(prefix="flexbatch-memlimit-") as tmp:
        ours = [(False, "int4") if fmt == "uncompressed" else (True, fmt) for fmt in cfg.formats]
        sides = [Side("flexbatch", str(model_dir), rows, prompt_len, gen_len, 0, weights, "", hardware, compress,
                      threads, fmt, cfg.dtype) for compress, fmt in ours]
        sides += [Side("accelerate", str(model_dir), rows, prompt_len, gen_len, b, weights, "", threads=threads,
                       dtype=cfg.dtype) for b in cfg.acc_batches]
        if cfg.gguf_types:  # converted here, once, outside the groups (flexbatch converts inside its own)
            ggufs = lc.gguf_models(lc.llama_cpp_tools(cfg.llama_cpp), model_dir, cfg.gguf_types)
            sides += [Side(LLAMA_CPP, str(model_dir), rows, prompt_len, gen_len, rows, weights, "", threads=threads,
                           weight_format=t, dtype=cfg.dtype, llama_cpp=cfg.llama_cpp, gguf=str(ggufs[t]),
                           load_mode=mode) for t in cfg.gguf_types for mode in lc.LOAD_MODES]
        sides = [replace(s, offload_dir=str(Path(tmp) / s.name)) for s in sides]  # one folder per side
        for k, side in enumerate(sides):
            if side.side not in baselines:
                baselines[side.side] = baseline_bytes(side) if cfg.limit_bytes is None else 0
            runs.append(run_side(side, cfg.limit_for(baselines[side.side], weights), cfg.timeout_s))
            log.info("memory limit %s batch %d: %s", side.name, side.batch,
                     {k: v for k, v in runs[-1].items() if k != "stderr_tail"})
            if k + 1 == len(sides) or sides[k + 1].offload_dir != side.offload_dir:
                shutil.rmtree(side.offload_dir, ignore_errors=True)
    best = {}
    for r in runs:
        ok = r["result"] is not None and not r["oom_killed"]
        if ok and (r["side"] not in best or r["result"]["tokens_per_s"] > best[r["side"]]["result"]["tokens_per_s"]):
            best[r["side"]] = r
    return {"limit": cfg.describe(), "baseline_bytes": baselines, "weight_bytes": weights, "rows": rows,
            "prompt_len": prompt_len, "gen_len": gen_len, "runs": runs, "best": best}


MEMORY_WORKLOADS = {"decode-heavy": (128, 16, 64, 5.0), "prefill-heavy": (128, 128, 32, None)}  # rows, P, G, target


def parse_workload(text: str) -> tuple[str, int, int, int]:
    """`ROWSxPROMPT+GEN` (e.g. 256x128+64) -> (its name, rows, prompt tokens, generated tokens)."""
    try:
        shape, gen = text.split("+")
        rows, prompt = shape.lower().split("x")
        out = (text, int(rows), int(prompt), int(gen))
    except ValueError:
        out = None
    if out is None or min(out[1:]) < 1:
        raise ValueError(f"{text!r}: write a memory-limit workload as ROWSxPROMPT+GEN, e.g. 256x128+64")
    return out


def workloads_of(cfg: MemoryLimitConfig) -> dict[str, tuple[int, int, int, float | None]]:
    return {n: (r, p, g, None) for n, r, p, g in cfg.workloads} if cfg.workloads else MEMORY_WORKLOADS


def weight_times(result: dict | None) -> str:
    """Where a flexbatch side's generation went: the seconds its compute thread waited for layers and the seconds
    its prefetch thread spent loading them (a side that waits most of its time is bound by the disk, not by
    compute), and its roofline (planner.predict.PhaseCost.bound_s: the busiest channel of every step, at the
    profiled disk and kernel rates) against the seconds it took; empty for Accelerate's sides and failed runs."""
    if not result or "weight_wait_s" not in result:
        return ""
    roofline = result.get("roofline_s")
    return (f"; weights: waited {result['weight_wait_s']:.1f} s, loaded {result['weight_load_s']:.1f} s, "
            f"of {result['gen_s']:.1f} s generating"
            + (f"; roofline {roofline:.1f} s ({roofline / result['gen_s']:.2f} of it), planner predicted "
               f"{result['predicted_s']:.1f} s" if roofline else ""))


def memory_limit_lines(cfg: MemoryLimitConfig, model_dir: Path) -> list[Line]:
    """The workloads under the limit (by default decode-heavy and prefill-heavy): flexbatch's planned run
    (uncompressed, and with each compressed format pinned) vs Accelerate's best surviving batch, and each compressed
    run vs llama.cpp's GGUF of its width (with a build), generated tokens/s, each a whole process in its own memory
    group. flexbatch plans with this machine's profile at this process's thread count, loaded (or measured) here,
    outside the groups; each report carries that profile's cold disk read rate beside the bytes each side read from
    the disk."""
    from planner.hardware import save_hardware
    from planner.profiler import load_or_profile

    lines, workloads = [], workloads_of(cfg)
    with tempfile.TemporaryDirectory(prefix="flexbatch-hw-") as tmp:
        hw = load_or_profile()
        hardware = str(save_hardware(hw, Path(tmp) / "hw.json"))
        reports = {name: memory_limit_runs(cfg, model_dir, rows, P, G, hardware) | {
                   "disk_read_bytes_per_s": hw.disk_read_bytes_per_s} for name, (rows, P, G, _) in workloads.items()}
    ours_names = [side_name("flexbatch", f) for f in cfg.formats]
    for name, (rows, P, G, target) in workloads.items():
        rep = reports[name]
        theirs = rep["best"].get("accelerate")
        for ours_name in ours_names:
            ours = rep["best"].get(ours_name)
            what = (f"{name} {rows}x{P} gen {G}, limit {cfg.describe()} (weights {rep['weight_bytes'] >> 20} MiB, "
                    f"baselines {({k: v >> 20 for k, v in rep['baseline_bytes'].items()})} MiB): {ours_name} "
                    f"planned vs Accelerate bs {theirs and theirs['batch']} (best surviving)"
                    f"{weight_times(ours and ours['result'])}")
            lines.append(Line(f"memlimit-{name}-{ours_name}", what, "tokens/s",
                              ours and ours["result"]["tokens_per_s"], theirs and theirs["result"]["tokens_per_s"],
                              target, rep))
        for gguf in cfg.gguf_types:
            ours_name, peer = side_name("flexbatch", lc.FORMATS[gguf].strip()), lc.line_name(gguf)
            ours = rep["best"].get(ours_name)
            modes = {m: rep["best"].get(llama_cpp_side(gguf, m)) for m in lc.LOAD_MODES}
            ran = [r for r in modes.values() if r]
            theirs = max(ran, key=lambda r: r["result"]["tokens_per_s"]) if ran else None
            what = (f"{name} {rows}x{P} gen {G}, limit {cfg.describe()}: {ours_name} planned vs {peer}'s best load "
                    f"mode (llama-batched-bench){''.join(llama_cpp_times(m, r) for m, r in modes.items())}")
            lines.append(Line(f"memlimit-{name}-{ours_name}-vs-{peer.replace(' ', '-')}", what, "tokens/s",
                              ours and ours["result"]["tokens_per_s"], theirs and theirs["result"]["tokens_per_s"],
                              1.0, rep))
    return lines


def llama_cpp_times(load_mode: str, run: dict | None) -> str:
    """A llama.cpp side's tokens/s, where its seconds went (its prefill and decode) and what it read from the disk,
    or that it did not finish."""
    if not run:
        return f"; {load_mode}: no result"
    res = run["result"]
    return (f"; {load_mode}: {res['tokens_per_s']:.2f} tok/s, prefill {res['phase_seconds']['prefill']:.1f} s, "
            f"decode {res['phase_seconds']['decode']:.1f} s, read {res['disk_read_bytes'] / 1e9:.1f} GB")
