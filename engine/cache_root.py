"""Where flexbatch keeps what it measures or builds once per machine and then reuses: the hardware profile, the
kernel rates, disk-tier weights and the benchmarks' checkpoints, all under `CACHE_ROOT` (~/.cache/flexbatch, or the
folder that $FLEXBATCH_CACHE names)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("FLEXBATCH_CACHE") or Path.home() / ".cache" / "flexbatch").expanduser()
