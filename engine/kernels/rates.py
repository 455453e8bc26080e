"""The measured rates of the compressed kernels against dequantize + dense GEMM (and of a dense weight reordered for
oneDNN against the plain one: format "onednn"), per weight shape, format and compute dtype, cached as JSON
(~/.cache/flexbatch/kernel_rates.json) under a key of the machine (CPU model, a hash of its flags, torch version,
thread count, the kernel build), so that a profile measures only shapes it has not seen. `flexbatch profile`
measures a few shapes at every row count through `shape_timings` and prices the planner's GEMMs from them.

These figures price the planner's paths and are the evidence the fixed choices are set from
(engine/kernels/gemm_choice.py); they never decide which kernel a run takes, as a timing taken under the load of
the moment would make two nodes (or a run and its resume) compute one row by different paths.

For each row count of ROWS in turn, the compressed kernel's time is compared with the dense path's: one
dequantization (as a layer is dequantized once per step) plus the GEMM over the dequantized weight. The
largest row count at which the compressed kernel won is `max_rows`; 0 means never. A cached entry is measured
again when it is stale (older than MAX_AGE_S, or of another VERSION), implausible (a path that took less than
half as long at more rows: a disturbed call), or was measured while the machine was busy (1-minute load average
above the CPU count) and it is not now."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.atomic_files import sweep, write_atomic
from engine.cache_root import CACHE_ROOT
from engine.compression.int4 import DEFAULT_CONFIG, dequantize, quantize
from engine.compression.int8 import dequantize_int8, quantize_int8
from engine.dtypes import cpu_info
from engine.kept_files import INT, NUMBER, TEXT, Table, read_kept
from engine.kernels import compiled, int4_tiles, int8_rows, int8_tiles, onednn_dense

log = logging.getLogger(__name__)
ROWS = (1, 4, 16, 64, 256, 1024)
MIN_PACK_PARAMS = 1 << 20  # out * in of the smallest dense weight reordered (engine/kernels/gemm_choice.py)
MIN_PACK_GAIN = 1.1  # geometric-mean speed-up over ROWS at which the planner prices a dense weight reordered
VERSION = 5  # of the kernels measured and the entries' form: entries of another version are measured again
MAX_AGE_S = 30 * 86400
DEFAULT_PATH = CACHE_ROOT / "kernel_rates.json"
# the file: {key: entry}, each entry's figures as `cached` stamps them and the measurements return them
RATES_SHAPE = Table({"max_rows": INT, "kernel": TEXT, "timings": [Table(NUMBER)], "measured_at": NUMBER,
                     "load_average": NUMBER, "cpus": NUMBER})
_lock = threading.Lock()
_memo: dict[tuple[Path, str], int] = {}


def machine_key() -> str:
    """The CPU, torch, its threads now, and the compiled kernels' instruction set and build: what a measurement
    holds for (a rebuilt kernel library is measured anew)."""
    mod = compiled.ops()
    own = f"kernels {mod.isa()} build {compiled.build_key()}" if mod is not None else "no kernels"
    return f"{_cpu()}|torch {torch.__version__}|threads {torch.get_num_threads()}|{own}"


@functools.cache
def _cpu() -> str:
    """The CPU's model and a hash of its flags, read once per process (keys are made at every decode step)."""
    cpu = cpu_info("model name") or platform.processor() or platform.machine()
    return f"{cpu}|flags {hashlib.sha256((cpu_info('flags') or '').encode()).hexdigest()[:12]}"


def _paths(fmt: str, n: int, k: int, dtype: torch.dtype):
    """(compressed call, dense call) for a random [n, k] weight; dense includes the dequantization. Format
    "onednn" is the dense weight reordered for oneDNN against the plain one (engine/kernels/onednn_dense.py)."""
    w = torch.randn(n, k) * 0.02
    if fmt == "onednn":
        plain = w.to(dtype)
        packed = onednn_dense.pack(plain)  # RuntimeError where this CPU cannot reorder this dtype
        return (lambda x: onednn_dense.linear(x, packed)), (lambda x: F.linear(x, plain))
    if fmt == "int8":  # the form of a layer kept in memory: the kernel's tiles where it is built
        w8 = quantize_int8(w)
        tiles = int8_tiles.pack(w8) if int8_rows.available() else None
        fast8 = (lambda x: int8_tiles.linear(x, tiles)) if tiles else (lambda x: int8_rows.fast_linear(x, w8))
        return fast8, (lambda x: F.linear(x, dequantize_int8(w8, dtype)))
    qt = quantize(w.to(dtype), DEFAULT_CONFIG)
    fast = int4_tiles.pack_fast(qt)
    return (lambda x: int4_tiles.fast_linear(x, fast)), (lambda x: F.linear(x, dequantize(qt, dtype=dtype)))


def fewest_seconds(fns, repeats: int) -> list[float]:
    """The fewest seconds of each of `fns` over `repeats` rounds, timed interleaved (a busy machine slows calls;
    the fewest is the least disturbed, and interleaving spreads the disturbance over both paths)."""
    for fn in fns:
        fn()  # warm-up
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def measure_max_rows(fmt: str, n: int, k: int, dtype: torch.dtype, repeats: int = 5,
                     every_row_count: bool = False) -> tuple[int, list]:
    """The largest row count of ROWS at which the compressed kernel is faster, and the timings. The scan stops
    after two row counts in a row where it is not, unless `every_row_count` (the profile prices every one)."""
    fast, dense = _paths(fmt, n, k, dtype)
    best, losses, timings = 0, 0, []
    with torch.inference_mode():
        for rows in ROWS:
            x = torch.randn(rows, k).to(dtype)
            t_fast, t_dense = fewest_seconds([lambda: fast(x), lambda: dense(x)], repeats)  # noqa: B023
            timings.append({"rows": rows, "fast_s": t_fast, "dense_s": t_dense})
            losses = 0 if t_fast < t_dense else losses + 1
            best = rows if t_fast < t_dense else best
            if losses == 2 and not every_row_count:
                break
    return best, timings


def shape_timings(fmt: str, n: int, k: int, dtype: torch.dtype, every_row_count: bool = False,
                  path: Path | None = None, refresh: bool = False) -> dict:
    """This shape's entry ({"max_rows", "timings", ...}), from the cache when it is usable (and not `refresh`),
    else measured now (and cached)."""

    def measure() -> dict:
        best, timings = measure_max_rows(fmt, n, k, dtype, every_row_count=every_row_count)
        log.info("%s kernel on [%d, %d] %s: faster than dequantize + GEMM up to %d rows", fmt, n, k, dtype, best)
        return {"max_rows": best, "timings": timings}

    complete = _complete if every_row_count else (lambda entry: True)
    return cached(entry_key(fmt, dtype, f"{n}x{k}"), measure, path, refresh, complete)


def entry_key(*parts) -> str:
    """The cache key of a measurement on this machine: the machine, VERSION, then what was measured."""
    return "|".join([machine_key(), f"v{VERSION}", *(str(p).removeprefix("torch.") for p in parts)])


def cached(key: str, measure, path: Path | None = None, refresh: bool = False, complete=lambda entry: True) -> dict:
    """The entry under `key`: from this process's memo or the file when usable (not stale, `complete`, not
    `refresh`), else `measure()` now, stamped with when and how busy the machine was, and written back."""
    path = path or DEFAULT_PATH
    with _lock:
        memo = _memo.get((path, key))
        if memo is not None and not refresh and complete(memo):
            return memo
        entry = _read(path).get(key)
        why = "measured again by request" if refresh else stale(entry) or (None if complete(entry) else "incomplete")
        if why:
            log.info("measuring %s (%s)", key.rsplit(f"|v{VERSION}|", 1)[-1], why)
            entry = measure() | {"measured_at": time.time(), "load_average": os.getloadavg()[0],
                                 "cpus": os.cpu_count() or 1}
            _write(path, _read(path) | {key: entry})
        _memo[(path, key)] = entry
    return entry


def stale(entry: dict | None, every_row_count: bool = False, now: float | None = None) -> str | None:
    """Why a cached entry must be measured again, or None when it can be used."""
    if not isinstance(entry, dict) or not isinstance(entry.get("timings"), list):
        return "not measured yet"
    now = time.time() if now is None else now
    if now - float(entry.get("measured_at", 0)) > MAX_AGE_S:
        return "the cached figure is older than 30 days"
    if not plausible(entry["timings"]):
        return "the cached figure is implausible"
    if busier_then(float(entry.get("load_average", 0)), float(entry.get("cpus", 1))):
        return "the cached figure was measured on a busier machine"
    if every_row_count and not _complete(entry):
        return "the cached figure stops short of the largest row count"
    return None


def busier_then(load_average: float, cpus: float) -> bool:
    """Whether a figure measured at this 1-minute load average on `cpus` CPUs came from a busy machine that is not
    busy now: loaded beyond its CPU count then, within it now. The kernel rates here are measured again (a few
    calls of one shape); the hardware profile (planner/profiler.py) is only noted, as measuring it again takes
    minutes. On a machine busy throughout figures are kept rather than measured again at every load that happens
    to be lower."""
    return load_average > cpus and os.getloadavg()[0] <= cpus


def plausible(timings: list[dict]) -> bool:
    """Each path (each `*_s` field) takes at least half as long at more rows or slots (more work is never much
    faster: a call that was, was disturbed where it took longer with less)."""
    for name in {k for t in timings for k in t if k.endswith("_s")}:
        times = [t[name] for t in timings]
        if any(b < 0.5 * a for a, b in zip(times, times[1:])) or min(times, default=1) <= 0:
            return False
    return True


def _complete(entry: dict) -> bool:
    return len(entry.get("timings", ())) == len(ROWS)


def _read(path: Path) -> dict:
    """The cached entries, {} where the file is missing, unreadable or not of RATES_SHAPE (then set aside: every
    entry is measured again). What killed writers left beside it is removed at the first read of a process."""
    sweep(path.parent, once=True)
    return read_kept(path, RATES_SHAPE, "the kernel rates") or {}


def _write(path: Path, table: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(table, indent=1).encode())
    except OSError as e:  # a read-only home still runs, measuring again next time
        log.warning("could not cache kernel rates in %s: %s", path, e)
