"""How the engines of a job run: the settings every job command shares (`flexbatch run`, `helm`, `wrangle`; `plan`
reads the planning ones), declared once here and once as command-line options (jobs/engine_options.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from engine.dtypes import DTYPE_CHOICES
from engine.errors import InvalidParamsError
from engine.kernels.backend import BACKEND_CHOICES, DEFAULT_BACKEND
from engine.policy import Pins, Policy
from pipeline.errors import ConfigError
from pipeline.option_checks import check_bool, check_optional_text, check_path, tier_budgets, whole_number


@dataclass(frozen=True)
class EngineSettings:
    """The engine's dtype, kernels, the user's part of the policy (`pins`: planned around, or run with defaults for
    the rest) and budgets, and where the engines run."""

    dtype: str = "auto"
    backend: str = DEFAULT_BACKEND  # CPU kernels (engine/kernels/native.py): native, aten, ipex or auto
    pins: Pins = field(default_factory=Pins)  # Policy fields the user fixed (a dict is taken too)
    budgets: dict = field(default_factory=dict)
    offload_dir: Path | None = None
    plan: bool = True  # pick the policy with the planner, keeping `pins`; False runs `pins.policy()`
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
        object.__setattr__(self, "budgets", tier_budgets(self.budgets))  # sizes such as '8GiB' become bytes
        for name in ("plan", "use_ray"):
            check_bool(name, getattr(self, name))
        check_path("offload_dir", self.offload_dir, "a folder for offloaded tensors", optional=True)
        check_path("hardware", self.hardware, "a hardware spec file", optional=True)
        check_optional_text("address", self.address, "a Ray address such as 'ray://head:10001'")
        object.__setattr__(self, "pins", _pins(self.pins))
        if not self.plan:
            self.policy  # noqa: B018  (run as given: the pins must make a whole policy now, not at the first shard)

    def settings(self) -> dict:
        """The engine settings by field name (a job's `RunConfig` carries them too)."""
        return {f.name: getattr(self, f.name) for f in fields(EngineSettings)}

    @property
    def policy(self) -> Policy:
        """The policy without planning (`Pins.policy`); with planning, what the planner keeps of it is `pins`."""
        return self.pins.policy()

    def pinned(self, name: str):
        """A policy field as the user fixed it, else Policy's default: what a planned run keeps of it (compression
        is never turned on by the planner), with or without planning."""
        return self.pins.get(name, getattr(Policy, name))


def _pins(value) -> Pins:
    if isinstance(value, Pins):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"pins={value!r} is invalid: expected engine.policy.Pins or a dict of Policy fields "
                          "to keep -> values, e.g. {'gbs': 8, 'compress_weight': True}")
    try:
        return Pins(value)
    except InvalidParamsError as e:
        raise ConfigError(f"pins={value!r} is invalid: {e}; expected Policy fields to keep -> values, e.g. "
                          "{'gbs': 8, 'compress_weight': True}") from None
