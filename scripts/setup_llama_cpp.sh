#!/usr/bin/env bash
# llama.cpp for `flexbatch bench workloads --llama-cpp DIR`: its `llama-batched-bench` and `llama-quantize` built from
# the llama.cpp source vendored in the `llama-cpp-python` sdist, and a small Python venv for its
# `convert_hf_to_gguf.py` and for training the SentencePiece tokenizer the converter accepts. Everything goes
# into DIR, never into the project's .venv.
#
#   scripts/setup_llama_cpp.sh [--no-amx | --avx2] [DIR]   # default .llama-cpp; rerunning on a DIR only tops it up
#
# --no-amx       compile without llama.cpp's AMX kernels (-mno-amx-tile -mno-amx-int8 -mno-amx-bf16 beside
#                GGML_NATIVE's -march=native, so AVX-512, AVX512-BF16 and VNNI stay): on some Xeons with AMX they
#                crash at the first Q4_0 or Q8_0 matmul (SIGSEGV in ggml_backend_amx_mul_mat, ggml-org/llama.cpp#20824);
#                without them Q4_0 is still repacked for AVX-512, and bf16 never used AMX. Rerunning on a DIR
#                with or without it reconfigures and rebuilds to match. Its cmake flags are printed at the end.
# --avx2         compile for AVX2 alone, as for an AVX2-only EPYC (Zen 2/3): GGML_NATIVE off, AVX, AVX2, FMA, F16C,
#                BMI2 and SSE 4.2 on, AVX-VNNI, every AVX-512 set and AMX off. On a larger CPU it runs the code an
#                AVX2-only one runs (flexbatch's side: FLEXBATCH_ISA=avx2 and torch held to AVX2, docs/KERNELS.md).
#
# DIR/src        the unpacked sdist (vendor/llama.cpp: CMake sources, convert_hf_to_gguf.py, gguf-py)
# DIR/build/bin  llama-batched-bench, llama-quantize (static: no shared libraries to find at run time)
# DIR/venv       torch 2.13.0 (pip takes the local CPU wheel where one lies in find-links), transformers (llama.cpp's
#                own pin), sentencepiece, numpy; the vendored gguf-py is on its path through a .pth file
# Settings (environment): PYTHON (python3), LLAMA_CPP_PYTHON_VERSION (0.3.36), JOBS (2).
# Time and disk: measured on a 2-core AMD EPYC with other work running (load 4-7): the sdist's download 110 s, the
# build and the venv 739 s; 1.4 GB (venv 1.2 GB, src 0.2 GB, build 78 MB). It prints both at the end.
#
# Then: flexbatch bench workloads --preset 100m --llama-cpp DIR ...
# (a crash of llama-batched-bench on a CPU with amx_int8 names --no-amx: jobs/bench/llama_cpp.py AMX_CRASH)
set -euo pipefail
cd "$(dirname "$0")/.."

NO_AMX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
AVX2_ONLY="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
    -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
EXTRA_FLAGS=""
ISA_OPTIONS="-DGGML_NATIVE=ON"
case "${1:-}" in
    --no-amx) EXTRA_FLAGS=$NO_AMX_FLAGS; shift ;;
    --avx2) ISA_OPTIONS=$AVX2_ONLY; shift ;;
esac
DIR=${1:-.llama-cpp}
PYTHON=${PYTHON:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${JOBS:-2}
start=$(date +%s)
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
SRC="$DIR/src/vendor/llama.cpp"

if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DIR/dl"
    mkdir -p "$DIR/src"
    tar xzf "$DIR/dl/llama_cpp_python-$VERSION.tar.gz" -C "$DIR/src" --strip-components=1
    rm -rf "$DIR/dl"
fi

# Only the two tools; no curl/OpenSSL (no downloads), tests, examples, server or unified binary. The C/C++ flags are
# always given, empty or not, so that a rerun builds what its options say (with GGML_NATIVE on, the instruction
# set options --avx2 sets are ignored).
# shellcheck disable=SC2086  # ISA_OPTIONS: several cmake options
cmake -S "$SRC" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release $ISA_OPTIONS -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_C_FLAGS="$EXTRA_FLAGS" -DCMAKE_CXX_FLAGS="$EXTRA_FLAGS" \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_SUBPROCESS=OFF >/dev/null
cmake --build "$DIR/build" -j "$JOBS" --target llama-batched-bench llama-quantize

test -x "$DIR/venv/bin/python" || "$PYTHON" -m venv "$DIR/venv"
# torch first, on its own: resolved alone it is the CPU build where one lies in find-links
"$DIR/venv/bin/python" -m pip install -q "torch==2.13.0"
"$DIR/venv/bin/python" -m pip install -q "torch==2.13.0" "transformers==4.57.6" "sentencepiece>=0.1.98,<0.3.0" \
    "protobuf>=4.21.0,<5.0.0" numpy pyyaml tqdm safetensors
SITE=$("$DIR/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$SRC/gguf-py" > "$SITE/llama-cpp-gguf-py.pth"

"$DIR/venv/bin/python" -c 'import gguf, sentencepiece, torch, transformers; print("convert venv: torch", torch.__version__, "transformers", transformers.__version__)'
"$DIR/build/bin/llama-batched-bench" --version 2>&1 | head -2
echo "cmake C/C++ flags: ${EXTRA_FLAGS:-none}; instruction sets: $(echo $ISA_OPTIONS)"
echo "built $DIR in $(( $(date +%s) - start )) s; it takes $(du -sh "$DIR" | cut -f1) on disk"
