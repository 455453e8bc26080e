"""Which kernels a run uses: the backend named by --backend, resolved to the native or the IPEX kernels.

Kept apart from engine/kernels/native.py because the IPEX kernels build on the native ones."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.errors import InvalidParamsError
from engine.options import Flag, Option

if TYPE_CHECKING:
    from engine.kernels.native import NativeKernels

log = logging.getLogger(__name__)
BACKEND_CHOICES = ("native", "aten", "ipex", "auto")  # importable without torch: the CLI's --help needs none
DEFAULT_BACKEND = "native"
BACKEND = Option("backend", kind="choice", choices=BACKEND_CHOICES, default=DEFAULT_BACKEND,
                 flag=Flag("--backend"),
                 help="CPU kernels: native (PyTorch, large dense weights reordered for oneDNN); aten "
                      "(native with every dense Linear through aten's F.linear as loaded); ipex (Intel Extension for "
                      "PyTorch, in its own torch 2.8 environment: scripts/setup_ipex_venv.sh); auto (ipex where it "
                      "imports, else native).")


def load_kernels(backend: str = DEFAULT_BACKEND) -> NativeKernels:
    """The kernels of `backend` ("native", "aten", "ipex" or "auto"; an `OptionError` for another)."""
    BACKEND.check(backend)
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
