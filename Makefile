PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
HELM_VERSION ?= 0.5.16
XGRAMMAR ?= xgrammar>=0.2.9,<0.3

.PHONY: venv demo test lint bench clean

# torch is pinned in the project's own resolve (one pass; a torch-only install before it resolved torch twice):
# on this kind of machine 2.13.0 is a CPU build already on disk, while an unpinned torch would pull a multi-GB
# CUDA build from the registry. crfm-helm (the HELM tests run
# its helm-run and helm-summarize) comes without its own requirements, which would pull torchvision and with
# it another torch: the `helm` extra lists the packages those two commands import. The `lm-eval` extra (the
# lm-evaluation-harness backend and its tests) adds ~25 s to a fresh install. xgrammar (the `grammar` extra) comes
# without its own requirements too: they pull triton (~1 GB, never imported here); pyproject.toml lists what it
# imports. pip installs without compiling bytecode, one file after another; compileall then compiles the
# environment on every core (pip ignores files that do not compile, as -qq and `|| true` do here). Last, the
# project's C++ kernels are built against the installed torch (engine/kernels/compiled.py, ~40 s on 2 cores).
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e ".[test,helm,lm-eval]" "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q --no-compile --no-deps "crfm-helm==$(HELM_VERSION)" "$(XGRAMMAR)"
	$(PY) -m compileall -qq -j 0 $(VENV)/lib || true
	$(PY) -m engine.kernels.compiled
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/flexbatch run --input examples/prompts.parquet --output out/demo --overwrite --max-new-tokens 24 --show 24

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Tests use tiny models: one thread each is faster than two and immune to OpenMP stalls when the cores are shared.
# Two workers: the tests that start Ray or whole processes on one (tests/conftest.py SERIAL), the rest on the other.
# A worker that dies (a crash in native code) fails the run: restarted under loadgroup, the session waits forever.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadgroup --max-worker-restart=0 --durations=15

# The benchmark's baselines need HF Accelerate (the `bench` extra); e.g. make bench BENCH_ARGS="--preset tiny".
bench: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]" "torch==$(TORCH_VERSION)"
	$(VENV)/bin/flexbatch bench engine $(BENCH_ARGS)

clean:
	rm -rf out .pytest_cache
