"""Tiers (gpu, cpu, disk), what each holds, and the transfers between them.

A tier keeps byte accounts against its budget and refuses what does not fit. The `gpu` tier is CUDA when it
exists; the test-only `simulate_gpu` option makes it a separate CPU memory pool, so that every transfer and
split path runs without a GPU (a transfer there is a real copy). The `disk` tier is a folder of files."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.errors import FlexbatchError

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

    def torch_device(self, name: str) -> torch.device:
        """Where tensors of tier/compute device `name` live in torch terms (disk data is staged on the CPU)."""
        return torch.device("cuda") if name == "gpu" and self.has_cuda else torch.device("cpu")

    def move(self, x: torch.Tensor, src: str, dst: str) -> torch.Tensor:
        """Copy `x` from compute device `src` to `dst` ("cpu" / "gpu"); the same device returns `x` itself."""
        if src == dst:
            return x
        self.links.add(src, dst, x.numel() * x.element_size())
        if self.has_cuda:
            return x.to(self.torch_device(dst), non_blocking=True)
        return x.clone()


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
