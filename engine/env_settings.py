"""The environment variables flexbatch reads, declared once and checked as options are (engine/options.py): a bad
value is one `EnvSettingError` naming the variable, the value and the values it takes, which a command prints as
one line and exit 2 before anything runs (jobs/cli.py, pipeline/job.py) rather than a traceback wherever it is
first read (a worker's start, under Ray)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ConfigError


class EnvSettingError(ConfigError):
    """An environment variable of flexbatch's set to a value it does not take."""


@dataclass(frozen=True)
class EnvSetting:
    """One variable: its `name`, the words it takes (`choices`, matched exactly as options are; empty: any text
    that `check` accepts), and what leaving it unset means (`unset`)."""

    name: str
    unset: str
    choices: tuple[str, ...] = ()

    def value(self) -> str:
        """The variable's value ('' when unset or empty), checked."""
        value = os.environ.get(self.name, "")
        if value and self.choices and value not in self.choices:
            raise EnvSettingError(f"{self.name}={value!r} is invalid: expected one of {', '.join(self.choices)}, or "
                                  f"unset ({self.unset})")
        return value


ISA = EnvSetting("FLEXBATCH_ISA", "the best set this CPU runs", ("avx512", "avx2", "scalar"))
KERNELS = EnvSetting("FLEXBATCH_KERNELS", "on", ("on", "off", "1", "0", "yes", "no"))
CACHE = EnvSetting("FLEXBATCH_CACHE", "~/.cache/flexbatch")
SETTINGS = (ISA, KERNELS, CACHE)


def isa_pin() -> str:
    """The instruction set FLEXBATCH_ISA pins the own kernels to ('' for none)."""
    return ISA.value()


def kernels_off() -> bool:
    """Whether FLEXBATCH_KERNELS turns the own kernels off."""
    return KERNELS.value() in ("off", "0", "no")


def cache_folder() -> str:
    """FLEXBATCH_CACHE ('' when unset): where it names something, that must be a folder."""
    value = CACHE.value()
    if value and Path(value).expanduser().exists() and not Path(value).expanduser().is_dir():
        raise EnvSettingError(f"{CACHE.name}={value!r} is invalid: it is not a folder; name a folder flexbatch may "
                              f"write, or unset it ({CACHE.unset})")
    return value


def check_environment() -> None:
    """Check every variable flexbatch reads (before a command runs anything)."""
    isa_pin()
    kernels_off()
    cache_folder()
