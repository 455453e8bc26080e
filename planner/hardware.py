"""`HardwareSpec`: what the cost model needs to know about a machine of CPUs and at most one GPU.

A spec is measured on this machine (`planner.profiler.profile_this_machine`) or written by hand for another one
(`infra/hardware/*.json`, each figure with its source). Units are in the names: bytes, bytes per second,
GFLOP/s, seconds."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from engine.atomic_files import write_atomic
from engine.kept_files import BOOL, NUMBER, TEXT, Either, Table, parse
from planner.errors import HardwareSpecError

DEVICES = ("cpu", "gpu")
PROCESS_FIELDS = ("memory_room_bytes", "memory_limit_binds")  # of the planning process: not saved with a profile


def _positive(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise HardwareSpecError(f"{owner}.{name}={value!r} is invalid: expected a positive finite number")


def _log_interp(x: float, xs: tuple, ys: tuple) -> float:
    """ys at x, linear in log(x) between table points, held at the end values outside them."""
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0)) * (y1 - y0)
    return ys[-1]


def _increasing(owner: str, name: str, values: tuple) -> None:
    if not values or any(v < 1 for v in values) or list(values) != sorted(set(values)):
        raise HardwareSpecError(f"{owner}.{name}={values} is invalid: expected increasing counts >= 1")


@dataclass(frozen=True)
class DeviceSpec:
    """One compute device and its memory.

    matmul_gflop_per_s is the bf16 GEMM rate by row count (rows = tokens in the GEMM; the rate grows with rows
    until the device is compute-bound), one curve per width in matmul_widths (the GEMM's input width, a layer's
    hidden size: small layers run less efficiently), or a single curve when matmul_widths is empty. Between
    table points rates are interpolated in log rows and log width, outside held at the end values. These rates
    stream the weights from memory; matmul_hot_gflop_per_s, when given, holds the rates for weights that stay
    in a last-level cache of cache_bytes (a model whose layers all fit in it). kernel_gflop_per_s holds, per
    compressed weight format (int4, int8), the rates of the kernel that computes on compressed weights, shaped as
    matmul_gflop_per_s (measured by `flexbatch profile` through engine/kernels/rates.py; none in a hand-written
    spec: compressed weights are then priced as dequantization + GEMM). The GEMM tables are in the dtype the
    profile measured, the machine's default compute dtype; matmul_f32_gflop_per_s, shaped alike, holds float32
    rates where that default is another (bf16 on CPUs with native bf16), read for float32 work, cached or not
    (without it float32 work is priced at the main tables' rates). dense_reorder_gain holds, per dtype
    ("bfloat16", "float32"), how many times faster a dense weight reordered for oneDNN computes than the plain
    one, shaped as matmul_gflop_per_s (engine/kernels/rates.py's "onednn" entries; none: priced plain).
    layer_call_s is the fixed cost of one layer call on one GPU batch (the dispatch of its few dozen operations),
    step_call_s that of one step's work outside the layers (masks, embedding, head, token choice); dequant_call_s,
    cache_codec_call_s, disk_layer_call_s and split_call_s what 4-bit weights (per layer per step), a 4-bit
    cache (per layer call), a layer read from disk (per layer per step) and a cache or activations split over
    tiers (per layer call) add to them. These fixed costs dominate for tiny models."""

    memory_bytes: float
    matmul_rows: tuple[int, ...]
    matmul_gflop_per_s: tuple
    attention_bf16_bytes_per_s: float
    attention_4bit_bytes_per_s: float
    dequant_bytes_per_s: float
    elementwise_bytes_per_s: float
    layer_call_s: float = 0.0  # per layer call on one GPU batch
    step_call_s: float = 0.0  # per step, outside the layers
    dequant_call_s: float = 0.0  # added by 4-bit weights, per layer per step
    cache_codec_call_s: float = 0.0  # added by a 4-bit cache, per layer call
    disk_layer_call_s: float = 0.0  # added by a layer read from disk, per layer per step
    split_call_s: float = 0.0  # added by a cache or activations split over tiers, per layer call
    matmul_widths: tuple[int, ...] = ()
    attention_prefill_lens: tuple[int, ...] = ()
    attention_prefill_gflop_per_s: tuple[float, ...] = ()
    cache_bytes: float = 0.0
    matmul_hot_gflop_per_s: tuple = ()
    kernel_gflop_per_s: dict = field(default_factory=dict)  # compressed format -> curves like matmul_gflop_per_s
    # decode attention over a float32 cache (SDPA runs it natively, ~3x the bytes/s of bf16 on the CPU, where bf16
    # is converted); 0: priced at the bf16 rate (a spec written before it was measured, or by hand)
    attention_f32_bytes_per_s: float = 0.0
    matmul_f32_gflop_per_s: tuple = ()
    dense_reorder_gain: dict = field(default_factory=dict)  # dtype -> curves like matmul_gflop_per_s

    def __post_init__(self) -> None:
        rows = tuple(int(r) for r in self.matmul_rows)
        widths = tuple(int(w) for w in self.matmul_widths)
        curves = self.matmul_gflop_per_s
        curves = [curves] if not widths else list(curves)
        curves = tuple(tuple(float(g) for g in c) for c in curves)
        _increasing("device", "matmul_rows", rows)
        if widths:
            _increasing("device", "matmul_widths", widths)
        if len(curves) != max(1, len(widths)) or any(len(c) != len(rows) for c in curves):
            raise HardwareSpecError(f"matmul_gflop_per_s must hold one rate per row count {rows} "
                                    f"{'for each width ' + str(widths) if widths else ''}")
        for g in (g for c in curves for g in c):
            _positive("device", "matmul_gflop_per_s", g)
        object.__setattr__(self, "matmul_rows", rows)
        object.__setattr__(self, "matmul_widths", widths)
        object.__setattr__(self, "matmul_gflop_per_s", curves if widths else curves[0])
        for name in ("matmul_hot_gflop_per_s", "matmul_f32_gflop_per_s"):  # optional tables shaped alike
            table = getattr(self, name) or ()
            if table:
                table = tuple(tuple(float(g) for g in c) for c in ([table] if not widths else table))
                if len(table) != len(curves) or any(len(c) != len(rows) or min(c) <= 0 for c in table):
                    raise HardwareSpecError(f"{name} must hold positive rates shaped as matmul_gflop_per_s")
            object.__setattr__(self, name, table if widths or not table else table[0])
        object.__setattr__(self, "kernel_gflop_per_s",
                           self._keyed_tables("kernel_gflop_per_s", ("int4", "int8"), "rates", curves))
        object.__setattr__(self, "dense_reorder_gain",
                           self._keyed_tables("dense_reorder_gain", ("bfloat16", "float32"), "ratios", curves))
        lens = tuple(int(n) for n in self.attention_prefill_lens)
        rates = tuple(float(g) for g in self.attention_prefill_gflop_per_s)
        if lens:
            _increasing("device", "attention_prefill_lens", lens)
        if len(lens) != len(rates) or any(g <= 0 for g in rates):
            raise HardwareSpecError(f"attention_prefill_gflop_per_s {rates} must hold one positive rate per "
                                    f"prompt length of attention_prefill_lens {lens}")
        object.__setattr__(self, "attention_prefill_lens", lens)
        object.__setattr__(self, "attention_prefill_gflop_per_s", rates)
        for name in ("memory_bytes", "attention_bf16_bytes_per_s", "attention_4bit_bytes_per_s",
                     "dequant_bytes_per_s", "elementwise_bytes_per_s"):
            _positive("device", name, getattr(self, name))
        if self.attention_f32_bytes_per_s != 0:
            _positive("device", "attention_f32_bytes_per_s", self.attention_f32_bytes_per_s)
        for name in ("layer_call_s", "step_call_s", "dequant_call_s", "cache_codec_call_s", "disk_layer_call_s",
                     "split_call_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise HardwareSpecError(f"{name}={value!r} is invalid: expected seconds >= 0")

    def _keyed_tables(self, field_name: str, keys: tuple[str, ...], what: str, curves: tuple) -> dict:
        """A dict field of tables checked: each key one of `keys`, each table positive `what` shaped as the GEMM
        table (kernel_gflop_per_s by compressed format, dense_reorder_gain by dtype)."""
        out = {}
        for key, table in (getattr(self, field_name) or {}).items():
            table = tuple(tuple(float(g) for g in c) for c in ([table] if not self.matmul_widths else table))
            if key not in keys or len(table) != len(curves) or any(
                    len(c) != len(self.matmul_rows) or min(c) <= 0 for c in table):
                raise HardwareSpecError(f"{field_name}[{key!r}] must name {' or '.join(keys)} and hold positive "
                                        f"{what} shaped as matmul_gflop_per_s")
            out[key] = table if self.matmul_widths else table[0]
        return out

    def reorder_gain(self, dtype: str, rows: float, width: float | None = None) -> float | None:
        """How many times faster a dense `dtype` GEMM at `rows` rows and input `width` runs on a weight reordered
        for oneDNN, None where it was not measured (interpolated as `matmul_flop_per_s`)."""
        table = self.dense_reorder_gain.get(dtype)
        return None if table is None else self._interp(table, rows, width) / 1e9

    def kernel_flop_per_s(self, fmt: str, rows: float, width: float | None = None) -> float | None:
        """FLOP/s of the compressed `fmt` kernel at `rows` rows and input `width`, None where it was not measured
        (interpolated as `matmul_flop_per_s`)."""
        table = self.kernel_gflop_per_s.get(fmt)
        return None if table is None else self._interp(table, rows, width)

    def _interp(self, table: tuple, rows: float, width: float | None) -> float:
        if not self.matmul_widths:
            return _log_interp(rows, self.matmul_rows, table) * 1e9
        by_width = tuple(_log_interp(rows, self.matmul_rows, c) for c in table)
        return _log_interp(width or self.matmul_widths[-1], self.matmul_widths, by_width) * 1e9

    def matmul_flop_per_s(self, rows: float, width: float | None = None, hot: bool = False,
                          dtype: str | None = None) -> float:
        """GEMM FLOP/s at `rows` rows and input `width` (ignored with a single curve); `hot` when the weights
        stay in the last-level cache (the hot table, where one was measured); `dtype` "float32" reads the float32
        table where one was measured."""
        if dtype == "float32" and self.matmul_f32_gflop_per_s:
            return self._interp(self.matmul_f32_gflop_per_s, rows, width)
        table = self.matmul_hot_gflop_per_s if hot and self.matmul_hot_gflop_per_s else self.matmul_gflop_per_s
        return self._interp(table, rows, width)

    def prefill_attention_flop_per_s(self, prompt_len: float, head_dim: int) -> float:
        """Prefill attention FLOP/s by prompt length (the GEMM rate at prompt_len rows and width head_dim when
        no table is given)."""
        if not self.attention_prefill_lens:
            return self.matmul_flop_per_s(prompt_len, head_dim)
        return _log_interp(prompt_len, self.attention_prefill_lens, self.attention_prefill_gflop_per_s) * 1e9

    def attention_bytes_per_s(self, compressed: bool, dtype_bytes: int = 2) -> float:
        """Decode attention's rate over a cache of this kind: 4-bit, or plain in a dtype of dtype_bytes."""
        if compressed:
            return self.attention_4bit_bytes_per_s
        if dtype_bytes == 4 and self.attention_f32_bytes_per_s > 0:
            return self.attention_f32_bytes_per_s
        return self.attention_bf16_bytes_per_s


@dataclass(frozen=True)
class HardwareSpec:
    """A machine: its CPU, its GPU (None without one), the links between them and the disk.

    h2d/d2h are the host-to-device and device-to-host rates (absent without a GPU). Disk-tier files are read
    and written at disk_*_bytes_per_s when cold, and at page_cache_bytes_per_s while the OS page cache still
    holds them. cpu_background_overlap is the share of the prefetch thread's CPU work (copies, dequantization)
    that hides behind CPU compute: 1 on a machine with cores to spare, 0 when it runs in turn with compute,
    below 0 (down to -3) where the threads oversubscribe the cores and cost more together than in turn.
    cpu_run_scale multiplies the predicted compute time of CPU-computed layers (not the bytes they read or move): a
    real block over the sum of its profiled parts, measured once by `flexbatch profile` on a calibration model
    (1.0 in a hand-written spec).
    memory_room_bytes and memory_limit_binds describe the process that plans, not the machine (set by
    `pipeline.plan.planning` from `engine.memory.room`, never saved in a profile): the memory it may still take, and
    whether that is a memory cgroup's room below MemAvailable. The room decides how disk-tier weights are read
    (`engine.memory.disk_read.reads_direct`: O_DIRECT at disk_read_bytes_per_s, else through the page cache); a binding
    limit also charges disk-tier scratch (a mapped KV cache, activations) to the CPU memory it counts against."""

    name: str
    cpu: DeviceSpec
    disk_read_bytes_per_s: float
    disk_write_bytes_per_s: float
    disk_bytes: float
    page_cache_bytes_per_s: float
    gpu: DeviceSpec | None = None
    h2d_bytes_per_s: float | None = None
    d2h_bytes_per_s: float | None = None
    cpu_background_overlap: float = 1.0
    cpu_run_scale: float = 1.0  # measured whole-block time / predicted on the CPU (planner/calibrate.py)
    sources: dict = field(default_factory=dict)
    memory_room_bytes: float | None = None  # the planning process's room; None: cpu.memory_bytes
    memory_limit_binds: bool = False

    def __post_init__(self) -> None:
        if self.memory_room_bytes is not None and not self.memory_room_bytes >= 0:
            raise HardwareSpecError(f"{self.name}: memory_room_bytes={self.memory_room_bytes!r} is invalid: "
                                    "expected bytes >= 0")
        for name in ("disk_read_bytes_per_s", "disk_write_bytes_per_s", "disk_bytes", "page_cache_bytes_per_s",
                     "cpu_run_scale"):
            _positive(self.name, name, getattr(self, name))
        links = (self.h2d_bytes_per_s, self.d2h_bytes_per_s)
        if self.gpu is None and any(x is not None for x in links):
            raise HardwareSpecError(f"{self.name}: h2d/d2h bandwidths are given but there is no gpu; drop them "
                                    "or describe the gpu")
        if self.gpu is not None:
            for name in ("h2d_bytes_per_s", "d2h_bytes_per_s"):
                _positive(self.name, name, getattr(self, name))
        if not -3.0 <= self.cpu_background_overlap <= 1.0:
            raise HardwareSpecError(f"{self.name}: cpu_background_overlap={self.cpu_background_overlap!r} is "
                                    "invalid: expected a share in [-3, 1]")

    @property
    def has_gpu(self) -> bool:
        return self.gpu is not None

    def device(self, name: str) -> DeviceSpec:
        spec = getattr(self, name)
        if spec is None:
            raise HardwareSpecError(f"{self.name} has no {name}")
        return spec

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> HardwareSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise HardwareSpecError(f"unknown hardware fields {unknown}; known: {sorted(known)}")
        try:
            devices = {k: _device(d[k], k) if d.get(k) is not None else None for k in DEVICES}
            return cls(**{**d, **devices})
        except TypeError as e:
            raise HardwareSpecError(f"hardware spec {d.get('name')!r}: {e}") from None


def _device(d: dict, name: str) -> DeviceSpec:
    try:
        return DeviceSpec(**d)
    except TypeError as e:
        raise HardwareSpecError(f"the {name} entry of a hardware spec: {e}") from None


_TABLE = Either([NUMBER], [[NUMBER]])  # one curve, or one per width
DEVICE_SHAPE = {name: NUMBER for name in ("memory_bytes", "attention_bf16_bytes_per_s", "attention_4bit_bytes_per_s",
                                          "dequant_bytes_per_s", "elementwise_bytes_per_s", "layer_call_s",
                                          "step_call_s", "dequant_call_s", "cache_codec_call_s", "disk_layer_call_s",
                                          "split_call_s", "cache_bytes", "attention_f32_bytes_per_s")} | {
    "matmul_rows": [NUMBER], "matmul_widths": [NUMBER], "attention_prefill_lens": [NUMBER],
    "attention_prefill_gflop_per_s": [NUMBER], "matmul_gflop_per_s": _TABLE, "matmul_hot_gflop_per_s": _TABLE,
    "matmul_f32_gflop_per_s": _TABLE, "kernel_gflop_per_s": Table(_TABLE), "dense_reorder_gain": Table(_TABLE)}
# the JSON kinds of a spec file's fields (engine/kept_files.py); the dataclasses then check the values
HARDWARE_SHAPE = {"name": TEXT, "cpu": DEVICE_SHAPE, "gpu": Either(None, DEVICE_SHAPE),
                  "sources": {"machine": TEXT, "measured_at": TEXT, "load_average": NUMBER, "cpus": NUMBER},
                  "memory_limit_binds": BOOL, "memory_room_bytes": Either(None, NUMBER),
                  "h2d_bytes_per_s": Either(None, NUMBER), "d2h_bytes_per_s": Either(None, NUMBER)} | {
    name: NUMBER for name in ("disk_read_bytes_per_s", "disk_write_bytes_per_s", "disk_bytes", "page_cache_bytes_per_s",
                              "cpu_background_overlap", "cpu_run_scale")}


def read_spec_text(text: str, what: str = "the spec") -> HardwareSpec:
    """A spec from the text of a spec file: HardwareSpecError where it is not JSON, not of HARDWARE_SHAPE, or has a
    bad or missing figure."""
    value, problem = parse(text, HARDWARE_SHAPE, what)
    if problem:
        raise HardwareSpecError(problem)
    return HardwareSpec.from_dict(value)


def load_hardware(path: str | Path) -> HardwareSpec:
    """Read a spec written by `save_hardware` or by hand; HardwareSpecError naming the file and the fix where it is
    missing, not JSON, of another shape or has a bad figure."""
    p = Path(path).expanduser()
    fix = "run `flexbatch profile` or pass a file from infra/hardware/"
    if not p.is_file():
        raise HardwareSpecError(f"hardware spec {str(p)!r} does not exist; {fix}")
    try:
        return read_spec_text(p.read_text(), "the spec")
    except (OSError, UnicodeDecodeError) as e:
        raise HardwareSpecError(f"hardware spec {str(p)!r} cannot be read ({e}); {fix}") from None
    except HardwareSpecError as e:
        raise HardwareSpecError(f"hardware spec {str(p)!r} cannot be used: {e}; {fix}") from None


def save_hardware(spec: HardwareSpec, path: str | Path) -> Path:
    """Write atomically (a temporary name, then rename), so a reader never sees half a file."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    stored = {k: v for k, v in spec.to_dict().items() if k not in PROCESS_FIELDS}
    write_atomic(p, (json.dumps(stored, indent=1) + "\n").encode())
    return p
