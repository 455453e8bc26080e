// The int8 x int8 GEMM each instruction set provides, over raw pointers (no torch types): int8_avx2.cpp and
// int8_avx512.cpp define them; int8_bind.cpp chooses a table at run time. The weight is read as it is stored
// (codes [N][K] int8 row-major, one float32 scale per output row), so nothing is repacked or kept twice.
#pragma once
#include <stdint.h>

#include "out.h"

namespace flexbatch {

struct Int8Weight {
  const int8_t* codes;      // [N][K]
  const float* scales;      // [N]
  const int32_t* code_sums; // [N]: sum over k of codes[n][k] (the AVX-512 path's offset activations need it)
  int64_t n, k;
};

struct Int8Kernels {
  const char* name;
  // x [rows][k] (float32 or bfloat16 by x_bf16, row stride ldx) -> activation codes [rows][kp] in the form this
  // set's GEMM reads, and scale[r] = max|x_r| / 127 (codes = round(x_r / scale), |codes| <= 127)
  void (*quantize_rows)(const void* x, int x_bf16, int64_t ldx, int64_t k, int64_t r0, int64_t r1, uint8_t* codes,
                        float* scale, int64_t kp);
  // y[m][n] = scale[m] * w.scales[n] * (codes_m . w.codes_n) for rows [r0, r1), columns [c0, c1), written at
  // y + m * ldy + n (float32 or bf16 by out_kind)
  void (*gemm)(const Int8Weight* w, const uint8_t* codes, const float* scale, int64_t kp, int64_t r0, int64_t r1,
               int64_t c0, int64_t c1, void* y, int64_t ldy, int out_kind);
};

const Int8Kernels* avx512_int8();
const Int8Kernels* avx2_int8();

}  // namespace flexbatch
