// The MXFP4 GEMM each instruction set provides, over raw pointers (no torch types): mxfp4_avx2.cpp and
// mxfp4_avx512.cpp define it, compiled with their own -m flags; mxfp4_bind.cpp chooses a table at run time.
//
// Weights as gpt-oss's checkpoints store its experts (engine/kernels/mxfp4_linear.py): per output column, per block
// of 32 inputs, 17 bytes: 16 code bytes (two e2m1 values a byte, the low nibble first) and the block's e8m0 scale,
// w = E2M1[code] * 2^(scale - 127). Decoded through a 16-entry table scaled by the block's power of two (exact: a
// value has 2 significant bits), multiplied and summed in float32.
#pragma once
#include <stdint.h>

namespace flexbatch {

constexpr int64_t kMxBlock = 32;       // inputs per block
constexpr int64_t kMxBlockBytes = 17;  // 16 code bytes, then the scale

struct Mxfp4Kernels {
  const char* name;
  // y[r][n] = sum_k x[r][k] w[n][k] + bias[n] (no bias where null) in float32, for rows [r0, r1) and columns
  // [n0, n1) of w [N][blocks][17]. x is float32 in block order (row stride ldx): within each block of 32 inputs,
  // the 16 even ones, then the 16 odd ones, the order a block's bytes decode in (low nibbles, then high).
  void (*gemm)(const uint8_t* w, int64_t blocks, const float* x, int64_t ldx, int64_t r0, int64_t r1, int64_t n0,
               int64_t n1, const float* bias, float* y, int64_t ldy);
  // Rows [r0, r1) of gu [R][2F] float32 (gate, then up; row stride ldg) -> gpt-oss's clamped SwiGLU
  // (min(up, limit) clamped at -limit, + 1) * g sigmoid(alpha g), g = min(gate, limit), into out [R][F] float32
  // (row stride ldo).
  void (*clamped_swiglu)(const float* gu, int64_t ldg, float* out, int64_t ldo, int64_t f, float limit, float alpha,
                         int64_t r0, int64_t r1);
};

const Mxfp4Kernels* avx512_mxfp4();
const Mxfp4Kernels* avx2_mxfp4();

namespace {

// Each e8m0 scale's power of two as float32, exactly: 2^(s - 127), a subnormal for s = 0 (255, NaN in the format,
// reads as inf). A constant table: a kernel's broadcast of its block's scale is then one load.
struct Scales {
  float of[256];
};

constexpr Scales make_scales() {
  Scales t{};
  float p = 1.0f;
  for (int i = 0; i < 127; ++i) p *= 0.5f;  // 2^-127
  for (int s = 0; s < 255; ++s) {
    t.of[s] = p;
    if (s < 254) p *= 2.0f;  // up to 2^127: float32's largest power of two
  }
  t.of[255] = __builtin_inff();
  return t;
}

constexpr Scales kScales = make_scales();

}  // namespace
}  // namespace flexbatch
