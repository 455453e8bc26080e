"""Measure this machine into a `HardwareSpec` (`flexbatch profile`), cached as JSON.

Each figure reuses the engine's own code paths where it has one (`planner.microbench`: the chunked decode attention
over bf16 and 4-bit caches, the 4-bit dequantization; `planner.overhead_probe`: the block executor), and records
how it was measured in `sources`. The machine may be shared, so each figure is the best of a few timed calls
after a warm-up (what the hardware can do; interference is what the benchmark then measures), and a profile whose
rate tables are implausible (`implausible`) is measured again, within a bound (`profile_this_machine`). The whole
profile takes minutes on 2 cores, and far longer on a busy machine: on a 2-core AMX Xeon that other processes kept
at a load average of 5 to 11 it had not finished after 25 minutes. The streamed GEMM tables dominate: each timed
call cycles through 4x the last-level cache (up to 2 GB where a virtual machine reports a 480 MiB cache)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import platform
import shutil
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save, save_file

from engine.atomic_files import sweep, temp_path
from engine.cache_root import CACHE_ROOT
from engine.compression.int4 import dequantize, quantize
from engine.dtypes import cpu_info, resolve_dtype
from engine.kept_files import read_kept
from engine.kernels import compiled
from engine.kernels.attention import attend, prefill_mask
from engine.kernels.rates import ROWS as KERNEL_ROWS
from engine.kernels.rates import busier_then, shape_timings
from engine.memory.disk_read import DirectReader
from planner.errors import HardwareSpecError
from planner.hardware import HARDWARE_SHAPE, DeviceSpec, HardwareSpec, save_hardware
from planner.microbench import attention_report, best_seconds, dequant_timings, median_seconds
from planner.overhead_probe import call_seconds, elementwise_bytes_per_s
from planner.plausibility import implausible

log = logging.getLogger(__name__)
DEFAULT_CACHE = CACHE_ROOT / "hardware.json"
MATMUL_ROWS = KERNEL_ROWS  # one row grid for the GEMM and compressed-kernel tables
KERNEL_FORMATS = ("int4", "int8")
MATMUL_WIDTHS = (128, 512, 2048)
MATMUL_SHAPE = (2048, 2048)  # dequantization probe
PREFILL_LENS = (32, 128, 512)
DISK_PROBE_BYTES = 128 << 20
SETTLE_S = 600.0  # the most a profile spends measuring again an implausible first measurement (`profile_this_machine`)
PROFILE_VERSION = 16  # a cached profile of another version is measured again


def matmul_table(device: torch.device, dtype: torch.dtype, cold_bytes: float = 0.0,
                 repeats: int = 3) -> tuple[tuple[float, ...], ...]:
    """GFLOP/s of x [rows, w] @ W^T [w, 3w] at each of MATMUL_ROWS, for each width w of MATMUL_WIDTHS (3w is
    about the mean output width of a Llama layer's GEMMs). With cold_bytes, each timed call cycles through
    copies of W totalling that much, so the weights stream from memory as a large model's do."""
    out = []
    for width in MATMUL_WIDTHS:
        one = 3 * width * width * torch.empty((), dtype=dtype).element_size()
        copies = max(1, min(4096, int(cold_bytes // one)))
        ws = [torch.randn(3 * width, width, device=device).to(dtype) for _ in range(copies)]
        rates = []
        for rows in MATMUL_ROWS:
            x = torch.randn(rows, width, device=device).to(dtype)
            seconds = _timed(lambda x=x, ws=ws: [F.linear(x, w) for w in ws], device, repeats)
            rates.append(2 * rows * 3 * width * width * copies / seconds / 1e9)
        out.append(tuple(rates))
        del ws
    return tuple(out)


def shape_curves(fmt: str, dtype: torch.dtype, figure, refresh: bool = False) -> tuple[tuple[float, ...], ...]:
    """`figure(timing, width)` of engine/kernels/rates.py's `fmt` entry for weights [3w, w] at each of MATMUL_ROWS,
    one curve per width w of MATMUL_WIDTHS (measured at every row count, or reused from its cache unless
    `refresh`): the figures the engine's own choices read for these shapes."""
    curves = []
    for width in MATMUL_WIDTHS:
        entry = shape_timings(fmt, 3 * width, width, dtype, every_row_count=True, refresh=refresh)
        by_rows = {t["rows"]: figure(t, width) for t in entry["timings"]}
        curves.append(tuple(by_rows[rows] for rows in MATMUL_ROWS))
    return tuple(curves)


def kernel_tables(dtype: torch.dtype, refresh: bool = False) -> dict[str, tuple[tuple[float, ...], ...]]:
    """GFLOP/s of each compressed kernel at MATMUL_ROWS for weights [3w, w] of each width w of MATMUL_WIDTHS: the
    same figures decide the engine's crossovers for these shapes."""
    def gflop_per_s(t: dict, width: int) -> float:
        return 2 * t["rows"] * 3 * width * width / t["fast_s"] / 1e9

    return {fmt: shape_curves(fmt, dtype, gflop_per_s, refresh) for fmt in KERNEL_FORMATS}


def reorder_gains(dtype: torch.dtype, refresh: bool = False) -> dict[str, tuple[tuple[float, ...], ...]]:
    """The plain GEMM's time over the reordered weight's in the profile's `dtype` at MATMUL_ROWS for weights [3w, w]
    of each width w of MATMUL_WIDTHS ("onednn" entries: the figures the engine's choice to reorder reads), keyed by
    the dtype; empty where this CPU cannot reorder it. Only the profile's dtype: float32 work on a bf16 machine is
    priced plain (a few seconds less at first use)."""
    try:
        curves = shape_curves("onednn", dtype, lambda t, width: t["dense_s"] / t["fast_s"], refresh)
    except RuntimeError:  # oneDNN cannot reorder this dtype here (bf16 needs AVX512-BW or AVX-NE-CONVERT)
        return {}
    return {str(dtype).removeprefix("torch."): curves}


def last_level_cache_bytes() -> float:
    """The CPU's largest cache (sysfs), 0 when unknown."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(float(text.rstrip("KMG")) * unit)
    return max(sizes, default=0.0)


def _timed(fn, device: torch.device, repeats: int) -> float:
    if device.type != "cuda":
        return best_seconds(fn, repeats)

    def synced():
        fn()
        torch.cuda.synchronize()

    return best_seconds(synced, repeats)


def prefill_attention_table(dtype: torch.dtype, batch: int = 4, heads: int = 16, head_dim: int = 64,
                            device: torch.device | None = None):
    """GFLOP/s of the engine's masked prefill attention (4 * B * H * D * S^2 flops) at each of PREFILL_LENS."""
    device = device or torch.device("cpu")
    out = []
    for s in PREFILL_LENS:
        q, k, v = (torch.randn(batch, heads, s, head_dim, device=device).to(dtype) for _ in range(3))
        mask = prefill_mask(torch.ones(batch, s, dtype=torch.bool)).to(device)
        seconds = _timed(lambda q=q, k=k, v=v, mask=mask: attend(q, k, v, mask), device, 5)
        out.append(4 * batch * heads * head_dim * s * s / seconds / 1e9)
    return tuple(out)


def copy_bytes_per_s(device: torch.device, nbytes: int = 64 << 20) -> float:
    """Streaming rate of a large copy, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return 2 * nbytes / _timed(lambda: dst.copy_(src), device, 3)


def cpu_device_spec(dtype: torch.dtype, refresh: bool = False) -> tuple[DeviceSpec, dict]:
    """The CPU: GEMMs, decode attention and dequantization as the engine runs them, memory streaming."""
    cpu, llc = torch.device("cpu"), last_level_cache_bytes()
    cold = max(4 * llc, 64 << 20)  # bytes of weights cycled through, so that GEMMs stream them from memory
    attn = [attention_report(batch=16, heads=16, kv_heads=16, slots=256, head_dim=64, repeats=3) for _ in range(3)]
    w = (torch.randn(*MATMUL_SHAPE) * 0.02).to(dtype)
    deq_ms = min(dequant_timings(quantize(w), dtype, 3)["dequant_ms"] for _ in range(3))
    spec = DeviceSpec(memory_bytes=_mem_total_bytes(), matmul_rows=MATMUL_ROWS, matmul_widths=MATMUL_WIDTHS,
                      matmul_gflop_per_s=matmul_table(cpu, dtype, cold_bytes=cold),
                      matmul_hot_gflop_per_s=matmul_table(cpu, dtype), cache_bytes=llc,
                      matmul_f32_gflop_per_s=() if dtype == torch.float32 else matmul_table(cpu, torch.float32,
                                                                                              cold_bytes=cold),
                      elementwise_bytes_per_s=elementwise_bytes_per_s(dtype), attention_prefill_lens=PREFILL_LENS,
                      attention_prefill_gflop_per_s=prefill_attention_table(dtype),
                      # priced at the faster PyTorch path; the engine's kernel is engine/kernels/decode_choice.py's rule
                      attention_bf16_bytes_per_s=max(max(a["chunked_bf16_gb_s"], a["sdpa_bf16_gb_s"])
                                                     for a in attn) * 1e9,
                      attention_4bit_bytes_per_s=max(a["chunked_4bit_gb_s"] for a in attn) * 1e9,
                      attention_f32_bytes_per_s=max(max(a["chunked_f32_gb_s"], a["sdpa_f32_gb_s"])
                                                    for a in attn) * 1e9,
                      dequant_bytes_per_s=w.numel() * w.element_size() / (deq_ms / 1e3),
                      kernel_gflop_per_s=kernel_tables(dtype, refresh),
                      dense_reorder_gain=reorder_gains(dtype, refresh), **call_seconds(dtype))
    return spec, {"cpu": f"measured: {dtype} GEMMs of widths {MATMUL_WIDTHS}, weights streamed from memory "
                         "(cycling through 4x the last-level cache) and cache-hot (float32 streamed too, where the "
                         "default dtype is another); planner.microbench decode attention "
                         "(16 x 16 heads x 256 slots x 64; plain, bf16 and float32: the faster of SDPA and the chunked path) and "
                         "dequant; int4/int8 kernels on compressed weights [3w, w] (engine.kernels.rates, the "
                         "engine's crossovers); dense weights reordered for oneDNN against plain (the same "
                         "module's onednn entries); masked prefill attention; the layer's "
                         "elementwise ops at 1024 tokens x 1024; the engine's block executor at tiny sizes "
                         f"(planner.overhead_probe); {torch.get_num_threads()} threads"}


def _mem_total_bytes() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return float(line.split()[1]) * 1024
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def gpu_device_spec(dtype: torch.dtype) -> tuple[DeviceSpec | None, dict, dict]:
    """The GPU (None without CUDA), and the pinned host<->device rates."""
    if not torch.cuda.is_available():
        return None, {}, {}
    dev = torch.device("cuda")
    cache = torch.randn(4, 8, 1024, 64, device=dev).to(dtype)
    q = torch.randn(4, 8, 1, 64, device=dev).to(dtype)
    attn_s = _timed(lambda: F.scaled_dot_product_attention(q, cache, cache), dev, 5)
    w = (torch.randn(*MATMUL_SHAPE, device=dev) * 0.02).to(dtype)
    qt = quantize(w)
    deq_s = _timed(lambda: dequantize(qt, dtype=dtype), dev, 3)
    spec = DeviceSpec(memory_bytes=float(torch.cuda.get_device_properties(0).total_memory),
                      matmul_rows=MATMUL_ROWS, matmul_widths=MATMUL_WIDTHS,
                      matmul_gflop_per_s=matmul_table(dev, dtype),
                      attention_bf16_bytes_per_s=2 * cache.numel() * cache.element_size() / attn_s,
                      attention_4bit_bytes_per_s=2 * cache.numel() * cache.element_size() / attn_s / 2,
                      dequant_bytes_per_s=w.numel() * w.element_size() / deq_s,
                      elementwise_bytes_per_s=copy_bytes_per_s(dev), attention_prefill_lens=PREFILL_LENS,
                      attention_prefill_gflop_per_s=prefill_attention_table(dtype, device=dev),
                      layer_call_s=1e-4, step_call_s=1e-4)
    host = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
    dev_buf = torch.empty_like(host, device=dev)
    links = {"h2d_bytes_per_s": host.numel() / _timed(lambda: dev_buf.copy_(host, non_blocking=True), dev, 3),
             "d2h_bytes_per_s": host.numel() / _timed(lambda: host.copy_(dev_buf, non_blocking=True), dev, 3)}
    name = torch.cuda.get_device_name(0)
    return spec, links, {"gpu": f"measured on {name}: GEMMs, SDPA decode (4-bit: half the bf16 rate, an "
                                "estimate), masked prefill attention, dequant; h2d/d2h with pinned 64 MiB copies; "
                                "call costs 0.1 ms "
                                "(an estimate of kernel launches per layer)"}


def disk_rates(folder: Path) -> dict[str, float]:
    """Write a probe layer file (safetensors, fsync'd) and read it back cold as the engine reads a disk tier it
    cannot cache (`engine.memory.disk_read.DirectReader`: the whole file with O_DIRECT into an aligned buffer, or
    buffered after dropping it from the page cache where O_DIRECT is refused). The warm rate is how the engine
    reads a disk tier the page cache keeps: safetensors maps the file and its pages are faulted in at first
    touch, timed as load + copy less a copy from memory."""
    folder.mkdir(parents=True, exist_ok=True)
    sweep(folder)  # the probes of a profile killed while measuring (128 MiB each)
    data = save({"probe": torch.frombuffer(bytearray(os.urandom(1 << 20) * (DISK_PROBE_BYTES >> 20)),
                                           dtype=torch.uint8)})
    name = str(temp_path(folder / "flexbatch-disk-probe.safetensors"))
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        t0 = time.perf_counter()
        os.write(fd, data)
        os.fsync(fd)
        write_s = time.perf_counter() - t0
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        reader = DirectReader()
        t0 = time.perf_counter()
        reader.read(Path(name))
        cold_s = time.perf_counter() - t0
    finally:
        os.unlink(name)
    return {"disk_write_bytes_per_s": len(data) / write_s, "disk_read_bytes_per_s": len(data) / cold_s,
            "page_cache_bytes_per_s": page_touch_bytes_per_s(folder)}


def page_touch_bytes_per_s(folder: Path, width: int = 1024) -> float:
    """Bytes/s of reading a page-cached disk layer as the engine does: a GEMM over a weight just mapped by
    safetensors' `load_file` (its pages faulted in at first touch) less the same GEMM over the weight in memory."""
    path = temp_path(folder / "flexbatch-touch-probe.safetensors")
    w = torch.randn(3 * width, width).to(torch.bfloat16)
    save_file({"w": w}, str(path))
    try:
        x = torch.randn(16, width).to(torch.bfloat16)
        mapped = best_seconds(lambda: F.linear(x, load_file(str(path))["w"]), 7)
        in_memory = best_seconds(lambda: F.linear(x, w), 7)
    finally:
        path.unlink()
    return w.numel() * w.element_size() / max(mapped - in_memory, mapped / 100)


def background_overlap(dtype: torch.dtype, width: int = 512) -> float:
    """Share of a background thread's CPU work (here: dequantizing, as the prefetch thread does) that hides
    behind GEMMs on the main thread: (t_gemm + t_background - t_both) / t_background. 1 means free, 0 serial,
    below 0 that the threads oversubscribe the cores and running both costs more than running them in turn.
    Clipped to [-3, 1]. Medians, not best times: interference is what this measures."""
    x, w = torch.randn(256, width).to(dtype), torch.randn(3 * width, width).to(dtype)
    qt = quantize((torch.randn(3 * width, width) * 0.02).to(dtype))

    def gemms():
        for _ in range(20):
            F.linear(x, w)

    def dequantizing():
        with torch.inference_mode():
            for _ in range(20):
                dequantize(qt, dtype=dtype)

    t_gemm, t_background = median_seconds(gemms, 7), median_seconds(dequantizing, 7)

    def both():
        th = threading.Thread(target=dequantizing)
        th.start()
        gemms()
        th.join()

    t_both = median_seconds(both, 7)
    return max(-3.0, min(1.0, (t_gemm + t_background - t_both) / t_background))


def profile_this_machine(offload_dir: Path | None = None, dtype: str = "auto", refresh_kernels: bool = False,
                         settle_s: float | None = None) -> HardwareSpec:
    """This machine measured (`measure_this_machine`), and measured once more, the kernels' figures too, when the
    first profile is implausible (`implausible`: rates off by orders of magnitude, OpenMP's team waiting for a
    thread another process descheduled) and took under half of `settle_s` (SETTLE_S by default), so that both
    measurements end within it. A profile that does not settle (implausible again, or no time left to measure it
    again) is kept with a warning naming the bad figure and the fix, and marked so (its sources' "implausible"):
    the run goes on, priced from what was measured, rather than measuring without end on a machine that stays busy,
    and later runs use it as it is until `flexbatch profile` measures it again."""
    settle_s = SETTLE_S if settle_s is None else settle_s
    started = time.monotonic()
    spec = measure_this_machine(offload_dir, dtype, refresh_kernels)
    why = implausible(spec)
    if why is None:
        return spec
    took = time.monotonic() - started
    if took < settle_s / 2:
        log.warning("the profile just measured is implausible (%s); measuring it again", why)
        spec = measure_this_machine(offload_dir, dtype, refresh_kernels=True)
        why = implausible(spec)
        if why is None:
            return spec
    log.warning("this machine's profile is implausible (%s) after %.0f s of measuring; it is kept as measured, so "
                "plans may be far from the best: another process probably held a core while %d threads measured it. "
                "Run `flexbatch profile` when the machine is quieter, or with fewer threads (OMP_NUM_THREADS=1; a "
                "profile is kept per thread count)", why, time.monotonic() - started, torch.get_num_threads())
    return dataclasses.replace(spec, sources={**spec.sources, "implausible": why})


def measure_this_machine(offload_dir: Path | None = None, dtype: str = "auto",
                         refresh_kernels: bool = False) -> HardwareSpec:
    """Measure this machine (minutes on 2 cores); the compressed kernels' figures are taken from their
    cache when usable, unless `refresh_kernels`."""
    started, torch_dtype = time.perf_counter(), resolve_dtype(dtype)
    folder = Path(offload_dir or DEFAULT_CACHE.parent)
    cpu, cpu_src = cpu_device_spec(torch_dtype, refresh_kernels)
    gpu, links, gpu_src = gpu_device_spec(torch_dtype)
    disk = disk_rates(folder)
    overlap = background_overlap(torch_dtype)
    sources = {**cpu_src, **gpu_src, "disk": f"measured: {DISK_PROBE_BYTES >> 20} MiB probe in {folder}: write + "
               "fsync, read cold as the engine reads a disk tier it cannot cache (O_DIRECT into one aligned "
               "buffer); page cache: a GEMM over a freshly mapped safetensors weight",
               "cpu_background_overlap": "measured: GEMMs with and without a dequantizing thread",
               "machine": machine_key(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "load_average": os.getloadavg()[0], "cpus": os.cpu_count() or 1}
    spec = HardwareSpec(name=f"this machine ({platform.node()})", cpu=cpu, gpu=gpu,
                        disk_bytes=float(shutil.disk_usage(folder).free), cpu_background_overlap=overlap,
                        sources=sources, **links, **disk)
    from planner.calibrate import cpu_run_scale

    spec = dataclasses.replace(spec, cpu_run_scale=cpu_run_scale(spec, torch_dtype))
    spec.sources["cpu_run_scale"] = ("measured: one block of a 12M-parameter Llama (48-token prompts, 8 new tokens, "
                                     "12 rows, CPU) through the engine over the cost model's prediction for it")
    log.info("profiled this machine in %.1f s", time.perf_counter() - started)
    return spec


def machine_key() -> str:
    """What a cached profile must match: CPU model, torch threads, torch version, CUDA device, the project's own
    kernels (their build: a changed kernel source measures the machine again, its rates being the profile's), and
    the profile version."""
    cpu = cpu_info("model name") or "unknown"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no gpu"
    return (f"{cpu}; {torch.get_num_threads()} threads; torch {torch.__version__}; {gpu}; {kernels_key()}; "
            f"v{PROFILE_VERSION}")


def kernels_key() -> str:
    """The own kernels the profile measures: their build key, or none where they are off or cannot be had."""
    return f"kernels {compiled.build_key()}" if compiled.ops() is not None else "no kernels"


def keyed_copy(path: Path, key: str) -> Path:
    """Where the profile of machine key `key` is kept beside `path`."""
    return path.with_name(f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}{path.suffix}")


def load_or_profile(path: Path | None = None, refresh: bool = False) -> HardwareSpec:
    """This machine's spec: a cached profile measured under the same machine key (the copy kept per key beside
    `path`, by default ~/.cache/flexbatch/hardware.json, or `path` itself as `flexbatch profile` writes it; the
    more recently measured where both match, so that `flexbatch profile` run again replaces what an earlier run
    measured), else a fresh profile, saved to the per-key copy only: `path` may be read by another flexbatch
    version on this machine, which a profile of this version's form would stop. A cached file of the wrong shape is
    set aside (engine/kept_files.py), one this version cannot read (another version's) is passed over, and an
    implausible one (`implausible`) is measured again, unless a profile that did not settle kept it so. A plausible
    one measured while the machine was busier is used as it is, with a note (measuring it again takes minutes
    inside the user's run; `flexbatch profile` does it when asked)."""
    path = Path(path or DEFAULT_CACHE)
    sweep(path.parent, once=True)  # a profile killed while it was written
    key = machine_key()
    keyed = keyed_copy(path, key)
    cached = []
    for candidate in (keyed, path):
        if not refresh and (spec := _read_cached(candidate)) is not None and spec.sources.get("machine") == key:
            cached.append(spec)
    newest = max(cached, key=lambda spec: str(spec.sources.get("measured_at", "")), default=None)  # ISO 8601, UTC
    if newest is None:
        log.info("no cached profile for %s; profiling this machine", key)
    elif (why := implausible(newest)) is None:
        note_busier(newest)
        return newest
    elif "implausible" in newest.sources:  # kept as measured by a profile that did not settle
        log.warning("the cached profile of this machine is implausible (%s), kept so after a bounded try; "
                    "`flexbatch profile` measures it again", why)
        return newest
    else:
        log.info("the cached profile is implausible (%s); profiling this machine", why)
    spec = profile_this_machine()
    save_hardware(spec, keyed)
    return spec


def _read_cached(path: Path) -> HardwareSpec | None:
    """The profile cached at `path`, or None: where it is missing, where it is not JSON of a spec's shape (set aside
    and measured again, engine/kept_files.py), and where this version cannot use its figures (another version's,
    or a bad figure: passed over, and measured again)."""
    value = read_kept(path, HARDWARE_SHAPE, "the cached profile", "this machine is profiled again")
    if value is None:
        return None
    try:
        return HardwareSpec.from_dict(value)
    except HardwareSpecError as e:
        log.info("passing over %s: %s", path, e)
        return None


_noted: set[str] = set()  # when the profiles noted by `note_busier` were measured


def note_busier(spec: HardwareSpec) -> None:
    """Log once per process that the cached profile `spec` was measured on a busier machine than this one is now
    (`engine.kernels.rates.busier_then`), and how to measure it again."""
    load, cpus = float(spec.sources.get("load_average", 0)), float(spec.sources.get("cpus", 1))
    measured_at = str(spec.sources.get("measured_at", ""))
    if busier_then(load, cpus) and measured_at not in _noted:
        _noted.add(measured_at)
        log.info("the hardware profile was measured at %s at a load average of %.1f on %d CPUs, busier than now; "
                 "`flexbatch profile` measures it again", measured_at or "an unknown time", load, cpus)
