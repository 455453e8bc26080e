// The bfloat16-weight x float32-activation GEMM, over raw pointers (no torch types): bf16w_avx2.cpp defines it,
// bf16w_bind.cpp splits a call over the threads. Float32 products and sums: the weight widened in registers.
//
// The tile layout (engine/kernels/bf16_tiles.py): for each tile of 16 output columns, for each input k, 32 bytes =
// 16 bfloat16 values, column c at position 2 c for c < 8 and 2 (c - 8) + 1 for c >= 8. Read as 8 32-bit lanes, lane
// j holds column j in its low half and column j + 8 in its high one: a shift left by 16 widens columns 0-7 to
// float32, a mask of the low half columns 8-15. Columns padded to a multiple of 16 with zeros; inputs unpadded.
#pragma once
#include <stdint.h>

namespace flexbatch {

struct Bf16wKernels {
  const char* name;
  // y[m][16 t + c] = sum_k x[m][k] w[16 t + c][k] (float32, k in order) for rows [r0, r1) and tiles [t0, t0 +
  // ntiles) (ntiles <= 4), x [rows][k] float32 at row stride ldx, written at y + m * ldy + 16 (t - t0) + c, the
  // last tile's `cols` (<= 16) columns only; `next` (or null): the tiles the caller computes next, read into cache
  // meanwhile
  void (*tile_gemm)(const uint16_t* tiles, int64_t k, const float* x, int64_t ldx, int64_t r0, int64_t r1, int64_t t0,
                    int ntiles, float* y, int64_t ldy, int cols, const uint16_t* next);
};

const Bf16wKernels* avx2_bf16w();

}  // namespace flexbatch
