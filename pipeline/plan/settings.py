"""How the engines of a job run: the settings every job command shares (`flexbatch run`, `helm`, `wrangle`; `plan`
reads the planning ones), declared once here and once as command-line options (jobs/engine_options.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from engine.policy import Policy
from engine.request import BACKEND_CHOICES, DEFAULT_BACKEND, DTYPE_CHOICES
from pipeline.errors import ConfigError
from pipeline.option_checks import check_bool, check_optional_text, check_path, tier_budgets, whole_number

REFILL_CHOICES = ("auto", "on", "off")  # --refill; auto (the default): the planner decides, on and off pin it


@dataclass(frozen=True)
class EngineSettings:
    """The engine's dtype, kernels, policy (given or planned) and budgets, and where the engines run."""

    dtype: str = "auto"
    backend: str = DEFAULT_BACKEND  # CPU kernels (engine/kernels/native.py): native, ipex or auto
    policy: Policy = field(default_factory=Policy)
    budgets: dict = field(default_factory=dict)
    offload_dir: Path | None = None
    plan: bool = True  # pick the policy with the planner, keeping `pins`; False runs `policy` as given
    pins: dict = field(default_factory=dict)
    hardware: Path | None = None  # hardware spec file; None: this machine's cached profile
    use_ray: bool = True  # False: one worker in this process, no Ray
    address: str | None = None  # Ray cluster to join; None: RAY_ADDRESS, else a local Ray on 127.0.0.1
    workers: int | None = None  # engines on CPU-only nodes; None: one per node

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"--dtype {self.dtype!r} is invalid: expected one of {', '.join(DTYPE_CHOICES)}")
        if self.backend not in BACKEND_CHOICES:
            raise ConfigError(f"--backend {self.backend!r} is invalid: expected one of {', '.join(BACKEND_CHOICES)}")
        object.__setattr__(self, "workers", whole_number("workers", self.workers, 1,
                                                         "the number of engines on CPU-only nodes (--workers)",
                                                         optional=True))
        if not isinstance(self.policy, Policy):
            raise ConfigError(f"policy {self.policy!r} is invalid: expected an engine.policy.Policy")
        object.__setattr__(self, "budgets", tier_budgets(self.budgets))  # sizes such as '8GiB' become bytes
        for name in ("plan", "use_ray"):
            check_bool(name, getattr(self, name))
        check_path("offload_dir", self.offload_dir, "a folder for offloaded tensors", optional=True)
        check_path("hardware", self.hardware, "a hardware spec file", optional=True)
        check_optional_text("address", self.address, "a Ray address such as 'ray://head:10001'")
        known = [f.name for f in fields(Policy)]
        if not isinstance(self.pins, dict) or not all(k in known for k in self.pins):
            raise ConfigError(f"pins={self.pins!r} is invalid: expected a dict of the Policy fields to keep "
                              f"({', '.join(known)}) -> values")

    def settings(self) -> dict:
        """The engine settings by field name (a job's `RunConfig` carries them too)."""
        return {f.name: getattr(self, f.name) for f in fields(EngineSettings)}

    @property
    def refill(self) -> str:
        """"on" or "off" where refill is pinned, else "auto": planned, and planned again as rows finish with
        what they really generated (off with --no-plan)."""
        return {True: "on", False: "off"}.get(self.pins.get("refill"), REFILL_CHOICES[0])

    def planner_pins(self) -> dict:
        """What the planner keeps: the user's pins, and compression where the policy asks for it (compression is
        lossy, so the planner never turns it on by itself)."""
        asked = {name: True for name in ("compress_weight", "compress_cache") if getattr(self.policy, name)}
        if self.policy.compress_weight:  # the format prices its own kernel
            asked["weight_format"] = self.policy.weight_format
        return {**asked, **self.pins}
