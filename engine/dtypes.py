"""Compute dtype selection: bfloat16 where the CPU has native bf16 (AMX or AVX512-BF16), else float32; and what
the CPU is (/proc/cpuinfo), read once here for every caller."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from engine.options import Flag, Option

if TYPE_CHECKING:
    import torch

DTYPE_CHOICES = ("auto", "float32", "bfloat16")  # importable without torch: the CLI's --help needs none
DTYPE = Option("dtype", kind="choice", choices=DTYPE_CHOICES, default="auto", flag=Flag("--dtype"),
               help="Compute dtype; auto is bfloat16 on CPUs with native bf16 (AMX, AVX512-BF16), else float32 "
                    "(on AVX2 CPUs a bf16 checkpoint's weights are then kept in bf16 unless --compress-weight is "
                    "given).")


@cache
def cpu_info(field: str) -> str | None:
    """A field of the first processor in /proc/cpuinfo ("model name", "flags"); None where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@cache
def cpu_has_native_bf16() -> bool:
    flags = (cpu_info("flags") or "").split()
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(name: str) -> torch.dtype:
    """The torch dtype of the option `dtype` (an `OptionError` for a name it does not declare)."""
    import torch

    if DTYPE.check(name) == "auto":
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    return getattr(torch, name)
