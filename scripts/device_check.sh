#!/usr/bin/env bash
# The checks that need a GPU, run unattended on a one-GPU machine without network access, in under 8 minutes:
#
#   env      python, torch, CUDA device (nvidia-smi), CPU
#   install  the wheels carried in .whl/ (scripts/fetch_device_wheels.sh) into /tmp/site; flexbatch itself runs
#            from this source tree (PYTHONPATH), so nothing has to be built
#   tests    the GPU-marked tests: first those of the newest paths (tests/engine/test_gpu_path.py: the embeddings
#            and LM head on the GPU, activations and cache fetches on side streams), then all others
#            (with SIMULATE=1: the simulated-tier tests of that file instead)
#   profile  flexbatch profile (CPU, GPU, pinned h2d/d2h), which the bench's planner uses; its GPU figures
#   bench    flexbatch bench gpu: FlexInfer's per-phase policies vs FlexGen-like offloading under a GPU budget
#   flexgen  FlexGen 0.1.8 vs flexbatch, same OPT shape, budget and policy (scripts/flexgen_baseline.py), when
#            its wheel is in .whl/
#
# Each stage has its own timeout, cut to what is left of the whole budget (CHECK_BUDGET_S, default 460 s), so a
# hang costs only its stage; a failing stage is reported, and the others still run. Everything goes under $OUT
# (default ./device-check-out): one log and result file per stage, summary.tsv, and the summary table printed
# last. Without CUDA the GPU stages are reported as skipped.
#
# Settings (environment): PYTHON (python3), OUT, SITE (/tmp/site, emptied first), CHECK_BUDGET_S, STAGES ("env install tests bench flexgen"),
# FLEXBATCH_CACHE (/tmp/flexbatch-cache: built checkpoints, offloaded weights; kept out of $OUT),
# BENCH_ARGS (default: opt-1.3b, prompt 512, gen 32, batch sizes 1,4,16, one round: sized so that the CPU
# prefills of the CPU-only and split policies fit the stage on a 16-core CPU without AMX),
# FLEXGEN_ARGS (default: opt-1.3b, prompt 512, gen 32, GPU batch 16, as the bench's largest batch),
# SIMULATE=1 (test this script without a GPU: the bench and flexbatch's side of the comparison on a tiny model
# with --simulate-gpu).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

PYTHON=${PYTHON:-python3}
OUT=${OUT:-$PWD/device-check-out}
BUDGET=${CHECK_BUDGET_S:-460}
STAGES=${STAGES:-env install tests profile bench flexgen}
CACHE=${FLEXBATCH_CACHE:-/tmp/flexbatch-cache}
SITE=${SITE:-/tmp/site}
SIMULATE=${SIMULATE:-0}
if [[ $SIMULATE == 1 ]]; then
  # 300 KiB: the tiny model's embeddings and head (65 KiB, on the GPU), two staged layers and the activations
  BENCH_ARGS=${BENCH_ARGS:---simulate-gpu --preset tiny-opt --prompt-len 16 --gen-len 4 --batch-sizes 1,4 --repeats 1 --gpu-mem 300KiB}
  FLEXGEN_ARGS=${FLEXGEN_ARGS:---simulate-gpu --preset tiny-opt --prompt-len 16 --gen-len 4 --gpu-batch-size 4 --gpu-mem 300KiB}
else
  BENCH_ARGS=${BENCH_ARGS:---preset opt-1.3b --prompt-len 512 --gen-len 32 --batch-sizes 1,4,16 --repeats 1}
  FLEXGEN_ARGS=${FLEXGEN_ARGS:---preset opt-1.3b --prompt-len 512 --gen-len 32 --gpu-batch-size 16 --timeout 65}
fi

mkdir -p "$OUT" "$CACHE"
SUMMARY=$OUT/summary.tsv
printf 'stage\tstatus\tseconds\tresult\n' >"$SUMMARY"
START=$(date +%s)
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

wants() { [[ " $STAGES " == *" $1 "* ]]; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$SUMMARY"; }

# stage NAME MAX_SECONDS RESULT_PATTERN CMD...: run CMD under `timeout` (at most MAX_SECONDS and what is left of the
# budget), output in $OUT/NAME.log; the result is the last output line matching RESULT_PATTERN (grep -E).
stage() {
  local name=$1 max=$2 pattern=$3
  shift 3
  local left=$((BUDGET - ($(date +%s) - START) - 5))
  local limit=$((max < left ? max : left))
  if ((limit < 15)); then
    record "$name" skipped 0 "no time left of the ${BUDGET} s budget"
    return
  fi
  echo "== $name (timeout ${limit} s): $*"
  local t0 rc status result
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  result=$(grep -E "$pattern" "$OUT/$name.log" | tail -n 1 | cut -c1-400)
  case $rc in
    0) status=ok ;;
    124 | 137) status="TIMEOUT" ;;
    *) status="FAILED rc=$rc" ;;
  esac
  if [[ $rc != 0 && -z $result ]]; then
    result=$(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-400)
  fi
  record "$name" "$status" $(($(date +%s) - t0)) "$result"
  tail -n 3 "$OUT/$name.log"
}

CUDA=no
if wants env; then
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "python: $($PYTHON --version 2>&1) at $(command -v "$PYTHON")"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    grep -m1 'model name' /proc/cpuinfo
    echo "cpus: $(nproc)"
    free -g | sed -n 2p
  } >"$OUT/env.log" 2>&1
fi
TORCH_LINE=$($PYTHON - <<'EOF' 2>&1 | tail -n 1
import torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {name}")
EOF
)
[[ $TORCH_LINE == *"no CUDA device"* || $TORCH_LINE != torch* ]] || CUDA=yes
wants env && echo "$TORCH_LINE" >>"$OUT/env.log" && record env ok 0 "$TORCH_LINE"

if wants install; then
  shopt -s nullglob
  wheels=(.whl/*.whl)
  shopt -u nullglob
  if ((${#wheels[@]} == 0)); then
    record install skipped 0 "no wheels in .whl/ (run scripts/fetch_device_wheels.sh where the registry is reachable)"
  else
    rm -rf "$SITE"  # a previous install may be for another Python
    stage install 90 'Successfully|ERROR' "$PYTHON" -m pip install --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$SITE" "${wheels[@]}"
    $PYTHON -c "import cvxpy, highspy, pytest; print('imports: cvxpy', cvxpy.__version__, 'highspy, pytest', pytest.__version__)" \
      >>"$OUT/install.log" 2>&1 || record install FAILED 0 "cvxpy, highspy or pytest does not import: see install.log"
  fi
fi

GPU_SKIP="needs CUDA: $TORCH_LINE"
PATH_TESTS=tests/engine/test_gpu_path.py  # the newest GPU paths (head on the GPU, side-stream copies): first
if wants tests; then
  if [[ $CUDA == yes ]]; then
    stage tests-path 70 '(passed|failed|error|no tests ran)' "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider \
      "$PATH_TESTS"
    # exit code 5: no test is marked gpu
    stage tests 80 '(passed|failed|error|no tests ran)' "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider \
      --continue-on-collection-errors --ignore "$PATH_TESTS" tests
    if tail -n 1 "$SUMMARY" | grep -q 'FAILED rc=5'; then
      sed -i '$ s/FAILED rc=5/ok (no gpu tests)/' "$SUMMARY"
    fi
  elif [[ $SIMULATE == 1 ]]; then  # their simulated-tier twins, as a rehearsal of the stage
    stage tests-path 150 '(passed|failed|error|no tests ran)' "$PYTHON" -m pytest -q -m "not gpu" \
      -p no:cacheprovider "$PATH_TESTS"
    record tests skipped 0 "$GPU_SKIP"
  else
    record tests skipped 0 "$GPU_SKIP"
  fi
fi

if wants profile; then
  if [[ $CUDA == yes ]]; then
    stage profile 90 '^(gpu:|flexbatch: error)' bash -c "$PYTHON -m jobs.cli profile >/dev/null && $PYTHON -c '
from planner.profiler import load_or_profile
hw = load_or_profile()
g = hw.gpu
print(f\"gpu: {g.memory_bytes / 2**30:.0f} GiB, GEMM up to {max(max(r) for r in g.matmul_gflop_per_s) / 1e3:.0f} TFLOP/s, \"
      f\"h2d {hw.h2d_bytes_per_s / 1e9:.1f} GB/s, d2h {hw.d2h_bytes_per_s / 1e9:.1f} GB/s (pinned); cpu_run_scale {hw.cpu_run_scale:.2f}\")
'"
  else
    record profile skipped 0 "$GPU_SKIP"
  fi
fi

if wants bench; then
  if [[ $CUDA == yes || $SIMULATE == 1 ]]; then
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
    stage bench 240 '^(headline|flexbatch: error)' "$PYTHON" -m jobs.cli bench gpu $BENCH_ARGS --cache-dir "$CACHE" \
      --json "$OUT/bench_gpu.json"
  else
    record bench skipped 0 "$GPU_SKIP"
  fi
fi

if wants flexgen; then
  if ! ls .whl/flexgen-*.whl >/dev/null 2>&1; then
    record flexgen skipped 0 "no flexgen wheel in .whl/"
  elif [[ $CUDA == yes || $SIMULATE == 1 ]]; then
    # shellcheck disable=SC2086  # FLEXGEN_ARGS is a list of options
    stage flexgen 150 '^summary:' "$PYTHON" scripts/flexgen_baseline.py $FLEXGEN_ARGS --cache-dir "$CACHE" \
      --json "$OUT/flexgen.json"
  else
    record flexgen skipped 0 "$GPU_SKIP"
  fi
fi

echo
echo "device check: $(($(date +%s) - START)) s of a ${BUDGET} s budget; logs and JSON in $OUT"
column -t -s $'\t' "$SUMMARY" 2>/dev/null || cat "$SUMMARY"
