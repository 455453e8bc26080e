"""`flexbatch bench engine --memory-limit`: flexbatch vs HF Accelerate over a real memory limit.

Each side runs as a whole process of its own inside its own cgroup v1 memory group (`memory.limit_in_bytes`),
which charges the page cache to the group: a model larger than the limit must come from the disk. flexbatch
keeps what fits of the weights in memory and reads the rest with O_DIRECT (engine/disk_read.py); Accelerate
uses `device_map="auto"` with `max_memory` and an `offload_folder`. Reported per side and batch: generated
tokens/s of the generation, the whole process's wall time, the group's peak memory, and whether the kernel
killed it (OOM). Accelerate's figure is its best batch that survives the limit."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from jobs.bench.report import Line
from planner.microbench import timed_call

log = logging.getLogger(__name__)
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
BASELINE_BYTES = 400 << 20  # a Python process with torch and transformers imported, before any weights


class CgroupUnavailable(RuntimeError):
    pass


def check_cgroups(root: Path | None = None) -> None:
    """Refuse where memory groups cannot be made: the limit would not be real."""
    root = root or CGROUP_ROOT
    if not (root / "memory.limit_in_bytes").is_file() or not os.access(root, os.W_OK):
        raise CgroupUnavailable(
            f"--memory-limit needs a writable cgroup v1 memory controller at {root} (run as root on a machine "
            "with cgroup v1 memory groups), or leave --memory-limit out")


class MemoryGroup:
    """A cgroup v1 memory group with a limit, removed on exit; `run` starts a process inside it."""

    def __init__(self, name: str, limit_bytes: int, root: Path | None = None):
        check_cgroups(root)
        self.path = (root or CGROUP_ROOT) / f"flexbatch-bench-{os.getpid()}-{name}"
        self.limit = int(limit_bytes)

    def __enter__(self) -> MemoryGroup:
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
        return self

    def __exit__(self, *exc) -> None:
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
    """One process's work: `side` is "flexbatch" or "accelerate"; rows prompts of prompt_len tokens, gen_len
    generated, in batches of `batch` rows (flexbatch: one block of gbs=batch)."""

    side: str
    model_dir: str
    rows: int
    prompt_len: int
    gen_len: int
    batch: int
    cpu_bytes: int  # flexbatch: its CPU tier budget; Accelerate: max_memory["cpu"]
    offload_dir: str


def side_args(side: Side) -> list[str]:
    return [sys.executable, "-m", "jobs.bench.memory_side", json.dumps(asdict(side))]


def run_side(side: Side, limit_bytes: int, timeout_s: float) -> dict:
    with MemoryGroup(f"{side.side}-{side.batch}", limit_bytes) as group:
        out = group.run(side_args(side), timeout_s)
    return {"side": side.side, "batch": side.batch, **out}


def memory_limit_runs(model_dir: Path, limit_bytes: int, rows: int, prompt_len: int, gen_len: int,
                      flex_batches: tuple[int, ...], acc_batches: tuple[int, ...], timeout_s: float) -> dict:
    """Every side and batch, back to back, each in a fresh group; the best surviving run of each side."""
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    room = max(0, limit_bytes - BASELINE_BYTES // 2)  # each side then measures its own room in its group
    runs = []
    with tempfile.TemporaryDirectory(prefix="flexbatch-memlimit-") as tmp:
        for name, batches in (("flexbatch", flex_batches), ("accelerate", acc_batches)):
            for b in batches:
                side = Side(name, str(model_dir), rows, prompt_len, gen_len, b, room, str(Path(tmp) / name))
                runs.append(run_side(side, limit_bytes, timeout_s))
                log.info("memory limit %s batch %d: %s", name, b, {k: v for k, v in runs[-1].items()
                                                                  if k != "stderr_tail"})
    best = {}
    for r in runs:
        ok = r["result"] is not None and not r["oom_killed"]
        if ok and (r["side"] not in best or r["result"]["tokens_per_s"] > best[r["side"]]["result"]["tokens_per_s"]):
            best[r["side"]] = r
    return {"limit_bytes": limit_bytes, "weight_bytes": weights, "rows": rows, "prompt_len": prompt_len,
            "gen_len": gen_len, "runs": runs, "best": best}


MEMORY_WORKLOADS = {"decode-heavy": (128, 16, 64, 5.0), "prefill-heavy": (128, 128, 32, None)}  # rows, P, G, target


@dataclass(frozen=True)
class MemoryLimitConfig:
    limit_bytes: int
    flex_batches: tuple[int, ...] = (32, 128)
    acc_batches: tuple[int, ...] = (8, 32)
    timeout_s: float = 3600.0


def memory_limit_lines(cfg: MemoryLimitConfig, model_dir: Path) -> list[Line]:
    """The decode-heavy and prefill-heavy workloads under the limit: flexbatch's best batch vs Accelerate's best
    surviving batch, generated tokens/s, each side a whole process in its own memory group."""
    lines = []
    for name, (rows, P, G, target) in MEMORY_WORKLOADS.items():
        rep = memory_limit_runs(model_dir, cfg.limit_bytes, rows, P, G, cfg.flex_batches, cfg.acc_batches,
                                cfg.timeout_s)
        ours, theirs = rep["best"].get("flexbatch"), rep["best"].get("accelerate")
        what = (f"{name} {rows}x{P} gen {G}, limit {cfg.limit_bytes >> 20} MiB, weights "
                f"{rep['weight_bytes'] >> 20} MiB: flexbatch bs {ours and ours['batch']} vs Accelerate bs "
                f"{theirs and theirs['batch']} (best surviving)")
        lines.append(Line(f"memlimit-{name}", what, "tokens/s", ours and ours["result"]["tokens_per_s"],
                          theirs and theirs["result"]["tokens_per_s"], target, rep))
    return lines
