"""Which kernels a run uses: the backend named by --backend, resolved to the native or the IPEX kernels.

Kept apart from engine/kernels/native.py because the IPEX kernels build on the native ones."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.errors import InvalidParamsError

if TYPE_CHECKING:
    from engine.kernels.native import NativeKernels

log = logging.getLogger(__name__)
BACKEND_CHOICES = ("native", "aten", "ipex", "auto")  # importable without torch: the CLI's --help needs none
DEFAULT_BACKEND = "native"


def load_kernels(backend: str = DEFAULT_BACKEND) -> NativeKernels:
    """The kernels of `backend` ("native", "aten", "ipex" or "auto")."""
    if backend not in BACKEND_CHOICES:
        raise InvalidParamsError(f"backend={backend!r} is invalid: use one of {', '.join(BACKEND_CHOICES)}")
    from engine.kernels.native import AtenKernels, NativeKernels

    if backend in ("native", "aten"):
        return NativeKernels() if backend == "native" else AtenKernels()
    from engine.kernels.ipex import IpexUnavailable, ipex_kernels

    try:
        return ipex_kernels()
    except IpexUnavailable as e:
        if backend == "ipex":
            raise InvalidParamsError(
                f"backend='ipex' cannot be used: {e}; install it in a separate environment "
                "(scripts/setup_ipex_venv.sh) or use --backend native") from None
        log.info("backend auto: %s; using the native kernels", e)
        return NativeKernels()
