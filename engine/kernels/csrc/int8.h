// The int8 x int8 GEMMs each instruction set provides, over raw pointers (no torch types): int8_avx2.cpp and
// int8_avx512.cpp define them; int8_bind.cpp chooses a table at run time. Two weight forms: as stored (codes
// [N][K] int8 row-major, one float32 scale per output row; for layers read anew at every step, so nothing is
// repacked per step) and the tile layout (engine/kernels/int8_tiles.py; for layers kept in memory, packed once).
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

// The tile layout: for each tile of 16 output columns, for each quad of inputs, 64 bytes = 16 columns x 4 bytes
// (byte j of column c holds code q[c, 4 quad + j]); inputs padded to kp, columns to a multiple of 16, with zeros.
struct Int8Tiles {
  const int8_t* codes;      // [Np/16][kp/4][16][4]
  const float* scales;      // [Np]
  const int32_t* code_sums; // [Np]
  int64_t kp;
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
  // The same for tiles [t0, t0 + ntiles) (ntiles <= 4) of the tile layout, rows [r0, r1): columns 16 t0 ... written
  // at y + m * ldy + 16 (t - t0), the last tile's `cols` (<= 16) of them
  void (*tile_gemm)(const Int8Tiles* w, const uint8_t* codes, const float* scale, int64_t r0, int64_t r1,
                    int64_t t0, int ntiles, void* y, int64_t ldy, int cols, int out_kind);
};

const Int8Kernels* avx512_int8();
const Int8Kernels* avx2_int8();

}  // namespace flexbatch
