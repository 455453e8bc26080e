"""Whether the `ipex` kernel backend can run here: tests marked `ipex` are skipped where it cannot."""

from __future__ import annotations

import importlib.util
from functools import cache


@cache
def ipex_missing() -> str | None:
    """None when IPEX imports and matches this torch, else why not (IPEX is imported only when installed)."""
    if importlib.util.find_spec("intel_extension_for_pytorch") is None:
        return "intel-extension-for-pytorch is not installed"
    from engine.kernels.ipex import IpexUnavailable, ipex_kernels

    try:
        ipex_kernels()
    except IpexUnavailable as e:
        return str(e)
    return None
