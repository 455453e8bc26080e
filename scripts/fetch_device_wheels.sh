#!/usr/bin/env bash
# Download into .whl/ the wheels scripts/device_check.sh installs on a GPU machine without network access:
# CPython 3.12, manylinux x86_64. That machine already has torch (CUDA), transformers, pyarrow, click, safetensors,
# pyyaml, requests, tqdm, numpy and scipy; it lacks the planner's solver stack and FlexGen.
#
#   cvxpy + highspy: the planner's integer placement program (HiGHS). cvxpy imports qdldl and declares
#     sparsediffpy; it probes its other solvers (clarabel, osqp, scs) at import, and osqp imports jinja2
#     (markupsafe) and joblib. scs 3.2.7.post2 is the newest that satisfies cvxpy's pin at a quarter of 3.3's size.
#   flexgen 0.1.8 (the FlexGen comparison, pure Python) and attrs, which flexgen.utils imports (its pulp
#     dependency is only used by an experimental cost model that flex_opt never imports).
#   pytest and what it needs (pluggy, iniconfig, pygments, packaging >= 24), for the GPU-marked tests.
#
# Versions are those of the development environment (pyproject: cvxpy>=1.5, highspy>=1.7).
# Run from the repository root on a machine that reaches the package registry:  bash scripts/fetch_device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${PIP:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PIP=".venv/bin/python -m pip"; else PIP="python3 -m pip"; fi
fi
DEST=${DEST:-.whl}
WHEELS=(
  cvxpy==1.9.3 highspy==1.16.0 qdldl==0.1.9.post1 sparsediffpy==0.6.1
  clarabel==0.11.1 osqp==1.1.3 scs==3.2.7.post2 jinja2==3.1.6 markupsafe==3.0.4 joblib==1.6.0
  flexgen==0.1.8 attrs==26.1.0
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 packaging==26.4
)

mkdir -p "$DEST"
for spec in "${WHEELS[@]}"; do
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "$spec"
done

# each wheel's declared needs, to compare with what the GPU machine has
for w in "$DEST"/*.whl; do
  needs=$(unzip -p "$w" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' | tr '\n' ';' || true)
  echo "$(basename "$w"): ${needs:-no requirements}"
done
du -ch "$DEST"/*.whl | tail -n 1
