#!/usr/bin/env bash
# A separate virtual environment for the `ipex` kernel backend: torch 2.8 + intel-extension-for-pytorch 2.8
# (IPEX's last release; it needs torch 2.8.*, while the main .venv pins torch 2.13), plus flexbatch itself
# (editable, with its `ipex` and `test` extras).
#
#   scripts/setup_ipex_venv.sh [DIR]      # default .venv-ipex; rerunning on an existing DIR only tops it up
#
# Time and disk: torch 2.8.0 from PyPI is a CUDA build that pulls ~6 GB of nvidia-* wheels. Measured on a
# 2-core machine: torch + IPEX 1 min 56 s and 6.8 GB, then flexbatch's dependencies 1 min 19 s: ~3.5 min and
# ~8 GB in all. A CPU-only torch is much smaller: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu.
# Settings (environment): PYTHON (python3), TORCH_INDEX_URL (unset: the default index).
#
# Then: DIR/bin/flexbatch run --backend ipex ...    OMP_NUM_THREADS=1 DIR/bin/python -m pytest -q -m ipex
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${1:-.venv-ipex}
PYTHON=${PYTHON:-python3}
PINS=("torch==2.8.0" "intel-extension-for-pytorch==2.8.0")
start=$(date +%s)

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
    "$VENV/bin/python" -m pip install -q "${PINS[0]}" --index-url "$TORCH_INDEX_URL"
fi
"$VENV/bin/python" -m pip install -q "${PINS[@]}"
# the pins again, so that resolving flexbatch's dependencies cannot move torch off 2.8
"$VENV/bin/python" -m pip install -q -e ".[ipex,test,grammar]" "${PINS[@]}"

"$VENV/bin/python" - <<'EOF'
import torch

from engine.kernels.native import load_kernels

kernels = load_kernels("ipex")
print(f"torch {torch.__version__}: the {kernels.name} backend works, int4 GEMM {'on' if kernels.int4 else 'off'}")
EOF
echo "built $VENV in $(( $(date +%s) - start )) s; it takes $(du -sh "$VENV" | cut -f1) on disk"
