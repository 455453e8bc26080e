"""Where the compressed kernels beat dequantize + dense GEMM on this machine, measured once per weight shape,
format and compute dtype, and cached as JSON (~/.cache/flexbatch/kernel_rates.json) under a key of the CPU
model, torch version and thread count, so that a run measures only shapes it has not seen.

For each row count of ROWS in turn, the compressed kernel's time is compared with the dense path's: one
dequantization (as a layer is dequantized once per step) plus the GEMM over the dequantized weight. The
largest row count at which the compressed kernel won is `max_rows` (calls of up to that many rows take it);
0 means never. The figures are only as good as the machine was quiet: delete the file to measure again."""

from __future__ import annotations

import json
import logging
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.dtypes import cpu_info
from engine.quant import DEFAULT_CONFIG, PACKED_DTYPE, dequantize, int4_linear, pack_int4, quantize
from engine.quant_int8 import dequantize_int8, int8_linear, quantize_int8

log = logging.getLogger(__name__)
ROWS = (1, 4, 16, 64, 256, 1024)
VERSION = 2  # of the kernels measured: entries of another version are measured again
DEFAULT_PATH = Path.home() / ".cache" / "flexbatch" / "kernel_rates.json"
_lock = threading.Lock()
_memo: dict[tuple[Path, str], int] = {}


def machine_key() -> str:
    cpu = cpu_info("model name") or platform.processor() or platform.machine()
    return f"{cpu}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def _paths(fmt: str, n: int, k: int, dtype: torch.dtype):
    """(compressed call, dense call) for a random [n, k] weight; dense includes the dequantization."""
    w = torch.randn(n, k) * 0.02
    if fmt == "int8":
        w8 = quantize_int8(w)
        return (lambda x: int8_linear(x, w8)), (lambda x: F.linear(x, dequantize_int8(w8, dtype)))
    qt = quantize(w.to(dtype), DEFAULT_CONFIG)
    packed = pack_int4(qt, PACKED_DTYPE)
    return (lambda x: int4_linear(x, packed)), (lambda x: F.linear(x, dequantize(qt, dtype=dtype)))


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


def measure_max_rows(fmt: str, n: int, k: int, dtype: torch.dtype, repeats: int = 5) -> tuple[int, list]:
    """The largest row count of ROWS at which the compressed kernel is faster (the scan stops after two row
    counts in a row where it is not), and the timings."""
    fast, dense = _paths(fmt, n, k, dtype)
    best, losses, timings = 0, 0, []
    with torch.inference_mode():
        for rows in ROWS:
            x = torch.randn(rows, k).to(dtype)
            t_fast, t_dense = fewest_seconds([lambda: fast(x), lambda: dense(x)], repeats)  # noqa: B023
            timings.append({"rows": rows, "fast_s": t_fast, "dense_s": t_dense})
            losses = 0 if t_fast < t_dense else losses + 1
            best = rows if t_fast < t_dense else best
            if losses == 2:
                break
    return best, timings


def max_rows(fmt: str, n: int, k: int, dtype: torch.dtype, path: Path | None = None) -> int:
    """`max_rows` for this shape, from the cache or measured now (and cached)."""
    path = path or DEFAULT_PATH
    key = f"{machine_key()}|v{VERSION}|{fmt}|{str(dtype).removeprefix('torch.')}|{n}x{k}"
    with _lock:
        if (path, key) in _memo:
            return _memo[(path, key)]
        table = _read(path)
        if key in table:
            _memo[(path, key)] = int(table[key]["max_rows"])
            return _memo[(path, key)]
        best, timings = measure_max_rows(fmt, n, k, dtype)
        log.info("%s kernel on [%d, %d] %s: faster than dequantize + GEMM up to %d rows", fmt, n, k, dtype, best)
        table = _read(path) | {key: {"max_rows": best, "timings": timings}}
        _write(path, table)
        _memo[(path, key)] = best
    return best


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, table: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(table, f, indent=1)
        os.replace(f.name, path)
    except OSError as e:  # a read-only home still runs, measuring again next time
        log.warning("could not cache kernel rates in %s: %s", path, e)
