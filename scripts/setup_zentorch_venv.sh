#!/usr/bin/env bash
# AMD's zentorch (its int4 weight-only linear, RMSNorm and SDPA for torch 2.13 on AMD CPUs) in an environment of its
# own, for `scripts/bench_zentorch.py`: never in the project's .venv.
#
#   scripts/setup_zentorch_venv.sh [DIR]      # default .venv-zentorch; about 1.1 GB (torch 754 MB, zentorch 104 MB)
#
# Then: PYTHONPATH=. DIR/bin/python scripts/bench_zentorch.py --threads 1,2
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.venv-zentorch}
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv "$DIR"
"$DIR/bin/pip" install -q torch==2.13.0   # the CPU build; zentorch 2.13.0.2 is built for it
"$DIR/bin/pip" install -q zentorch==2.13.0.2 click safetensors numpy
PYTHONPATH=. "$DIR/bin/python" -m engine.kernels.compiled   # the project's kernels against this torch
