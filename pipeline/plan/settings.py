"""How the engines of a job run: the settings every job command shares (`flexbatch run`, `helm`, `wrangle`; `plan`
reads the planning ones), each declared once on its field (engine/options.py); the dtype and the kernels where the
engine reads them (engine/dtypes.py, engine/kernels/backend.py). The command-line options
(jobs/engine_options.py), flexbatch.run's keywords, the Ray Data stage's and lm-eval's model_args are these fields,
the tiers' budgets and the policy's fields (engine/policy.py), which the user pins."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from engine.dtypes import DTYPE
from engine.errors import InvalidParamsError
from engine.kernels.backend import BACKEND
from engine.options import Flag, Option, OptionError, check_fields, option, option_field
from engine.policy import TIERS, Pins, Policy
from pipeline.errors import ConfigError

CPU_BUDGET_SHARE = 0.8  # of the memory this process may still take (the rest: its working set grows)
# where the engines run: a job's choice; the Ray Data stage is an actor of Ray Data's, lm-eval one engine in its process
_JOB_ONLY = (("ray", "the stage's engines are Ray Data's actors (concurrency=)"),
             ("model_args", "lm-eval runs one engine in its own process"))


def _budget(tier: str, help: str, default_text: str) -> Option:
    return Option(f"{tier}_mem", kind="size", optional=True, keyword=f"budgets[{tier!r}]", help=help,
                  flag=Flag(f"--{tier}-mem", metavar="SIZE", default_text=default_text))


# each tier's memory budget: --cpu-mem, budgets={'cpu': ...} in Python and the Ray Data stage, cpu_mem in model_args
BUDGETS = {
    "gpu": _budget("gpu", "GPU tier budget, e.g. 16GiB.", "no limit"),
    "cpu": _budget("cpu", "CPU tier budget, e.g. 8GiB.", f"{CPU_BUDGET_SHARE:.0%} of the memory this process may "
                   "still take (MemAvailable or its memory cgroup's room), shared by the engines starting on the node"),
    "disk": _budget("disk", "Disk tier budget.", "no limit"),
}
assert tuple(BUDGETS) == TIERS


@dataclass(frozen=True)
class EngineSettings:
    """The engine's dtype, kernels, the user's part of the policy (`pins`: planned around, or run with defaults for
    the rest) and budgets, and where the engines run."""

    dtype: str = option_field(DTYPE)
    backend: str = option_field(BACKEND)
    pins: Pins = field(default_factory=Pins)  # Policy fields the user fixed (a dict is taken too)
    budgets: dict = field(default_factory=dict)  # tier -> bytes, a size ('8GiB') or None (no limit): BUDGETS
    offload_dir: Path | None = option(None, kind="path", optional=True,
                                      flag=Flag("--offload-dir", metavar="DIR", default_text="~/.cache/flexbatch/offload"),
                                      help="Folder for disk-tier weights (written once per model and format, then "
                                           "reused) and scratch files.")
    plan: bool = option(True, kind="bool", flag=Flag("--plan/--no-plan"),
                        absent=(("ray", "the stage plans unless it is given a whole policy (policy=)"),),
                        help="Pick the policy with the planner (keeping the policy fields given here: the pins); "
                             "--no-plan runs the pins as given, with the policy's defaults for the rest.")
    hardware: Path | None = option(None, kind="path", optional=True,
                                   flag=Flag("--hardware", default_text="this machine, profiled on first use and "
                                                                        "cached"),
                                   help="Hardware spec for the planner (e.g. infra/hardware/*.json).")
    use_ray: bool = option(True, kind="bool", flag=Flag("--ray/--no-ray"), absent=_JOB_ONLY,
                           help="Run the engines as Ray actors; --no-ray runs one engine in this process (no cluster "
                                "needed).")
    address: str | None = option(None, kind="text", optional=True, absent=_JOB_ONLY,
                                 flag=Flag("--address", metavar="ADDR", default_text="RAY_ADDRESS if set, else a "
                                                                                     "local Ray started for this job"),
                                 help="Ray cluster to join (e.g. 10.0.0.5:6379, or auto).")
    workers: int | None = option(None, kind="int", low=1, optional=True, absent=_JOB_ONLY,
                                 flag=Flag("--workers", metavar="N", checked=True,
                                           default_text="one per CPU node; GPU nodes always get one per GPU"),
                                 help="Engines on CPU-only nodes, spread over them.")

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "budgets", tier_budgets(self.budgets))  # sizes such as '8GiB' become bytes
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


def tier_budgets(value) -> dict[str, float | None]:
    """`budgets` as bytes per tier: a dict of tier -> bytes (a number), a size ('16GiB', '512MB') or None (no
    limit), over the tiers gpu, cpu and disk; None is no budgets."""
    if value is None:
        return {}
    example = "e.g. budgets={'cpu': '8GiB', 'gpu': 16e9}"
    if not isinstance(value, dict):
        raise ConfigError(f"budgets={value!r} is invalid: expected a dict of tier -> size; {example}")
    unknown = sorted(str(k) for k in value if k not in TIERS)
    if unknown:
        raise ConfigError(f"budgets names unknown tiers {unknown}: expected the tiers {', '.join(TIERS)}; {example}")
    return {tier: BUDGETS[tier].check(size) for tier, size in value.items()}


def _pins(value) -> Pins:
    if isinstance(value, Pins):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"pins={value!r} is invalid: expected engine.policy.Pins or a dict of Policy fields "
                          "to keep -> values, e.g. {'gbs': 8, 'compress_weight': True}")
    try:
        return Pins(value)
    except OptionError:
        raise
    except InvalidParamsError as e:
        raise ConfigError(f"pins={value!r} is invalid: {e}; expected Policy fields to keep -> values, e.g. "
                          "{'gbs': 8, 'compress_weight': True}") from None
