"""Tiers (gpu, cpu, disk), what each holds, and the transfers between them.

A tier keeps byte accounts against its budget and refuses what does not fit. The `gpu` tier is CUDA when it
exists; the test-only `simulate_gpu` option makes it a separate CPU memory pool, so that every transfer and
split path runs without a GPU (a transfer there is a real copy). The `disk` tier is a folder of files.

With CUDA and a policy that computes on the GPU, host memory that crosses PCIe is pinned (`pin_host`):
host-to-device copies from it are asynchronous on the stream that issues them, while device-to-host copies
whose result the host reads next are synchronous on the compute stream only (`move`); the prefetched weights,
prefill's KV stores and decode's fetches of a host cache, and the activations use the side streams of
`engine/memory/streams.py` (`weights`, `kv`, `act`)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.errors import FlexbatchError
from engine.memory.staging import StagingRing
from engine.memory.streams import Stream, current

log = logging.getLogger(__name__)


class BudgetError(FlexbatchError):
    """A policy needs more memory on a tier than its budget allows."""


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


@dataclass
class Tier:
    """One memory tier: its name, budget in bytes (None = unlimited) and what it holds now."""

    name: str
    budget: float | None = None
    used: int = 0
    peak: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reserve(self, nbytes: int, what: str) -> None:
        with self._lock:
            if self.budget is not None and self.used + nbytes > self.budget:
                raise BudgetError(
                    f"{what} needs {human(nbytes)} on the {self.name} tier, which holds {human(self.used)} of its "
                    f"{human(self.budget)} budget; raise --{self.name}-mem or move more of it to another tier"
                )
            self.used += nbytes
            self.peak = max(self.peak, self.used)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


@dataclass
class Links:
    """Bytes moved over each link, for checking that the schedule moves what it should."""

    moved: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, src: str, dst: str, nbytes: int) -> None:
        if src != dst:
            with self._lock:
                key = f"{src}->{dst}"
                self.moved[key] = self.moved.get(key, 0) + nbytes


class Devices:
    """The compute devices (`cpu`, `gpu`) and the memory tiers with their budgets."""

    def __init__(self, budgets: dict[str, float | None] | None = None, simulate_gpu: bool = False,
                 offload_dir: str | Path | None = None):
        budgets = budgets or {}
        self.tiers = {name: Tier(name, budgets.get(name)) for name in ("gpu", "cpu", "disk")}
        self.has_cuda = torch.cuda.is_available() and not simulate_gpu
        self.gpu_available = self.has_cuda or simulate_gpu
        self.offload_dir = Path(offload_dir) if offload_dir else None
        self.links = Links()
        self.pin_host = False  # set by the engine when a policy computes on a CUDA GPU
        self.async_kv_stores = False
        self.async_moves = False
        self.compute_stream = current(self.has_cuda)
        self.streams = {name: Stream(self.has_cuda) for name in ("weights", "kv", "act")}
        self.staging = StagingRing(self.host_empty)  # decode's fetches of a host cache to the GPU

    def use_pinned_host(self, on: bool) -> None:
        """Pin host buffers that cross PCIe from now on (only with CUDA); prefill's K/V then reach a host cache
        asynchronously, on the kv stream (`async_kv_stores`), and activations and decode's fetches of a host cache
        cross on side streams, ordered by events (`async_moves`)."""
        self.pin_host = bool(on) and self.has_cuda
        self.async_kv_stores = self.async_moves = self.pin_host

    def keep_for_current_stream(self, *tensors: torch.Tensor) -> None:
        """Tell CUDA's allocator that the current (side) stream uses these compute-stream tensors (no-op on CPU)."""
        if self.has_cuda:
            for t in tensors:
                t.record_stream(torch.cuda.current_stream())

    def host_empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized CPU tensor, pinned when host buffers cross PCIe."""
        return torch.empty(shape, dtype=dtype, pin_memory=self.pin_host)

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """`t` itself, or a pinned copy of a CPU tensor when host buffers cross PCIe."""
        return t.pin_memory() if self.pin_host and t.device.type == "cpu" and not t.is_pinned() else t

    def torch_device(self, name: str) -> torch.device:
        """Where tensors of tier/compute device `name` live in torch terms (disk data is staged on the CPU)."""
        return torch.device("cuda") if name == "gpu" and self.has_cuda else torch.device("cpu")

    def move(self, x: torch.Tensor, src: str, dst: str) -> torch.Tensor:
        """Copy `x` from compute device `src` to `dst` ("cpu" / "gpu"); the same device returns `x` itself.

        Host to device is asynchronous from pinned memory (the host never rewrites a source before the compute
        stream has passed a later synchronous copy); device to host returns once the host may read the result."""
        if src == dst:
            return x
        self.links.add(src, dst, x.numel() * x.element_size())
        if self.has_cuda:
            return x.to(self.torch_device(dst), non_blocking=dst == "gpu" and x.is_pinned())
        return x.clone()

    def copy_into(self, out: torch.Tensor, x: torch.Tensor, src: str, dst: str, side: bool = False) -> torch.Tensor:
        """`move` into an existing buffer `out` on `dst` (a reused staging or cache buffer); returns `out`. With
        `side` (a copy queued on a side stream, which the caller orders with events) a copy between the GPU and
        pinned host memory is asynchronous both ways."""
        if src != dst:
            self.links.add(src, dst, x.numel() * x.element_size())
        host = x if dst == "gpu" else out
        return out.copy_(x, non_blocking=self.has_cuda and host.is_pinned() and (side or dst == "gpu"))


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
