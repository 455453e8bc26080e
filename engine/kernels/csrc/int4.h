// The 4-bit x int8 GEMM each instruction set provides, over raw pointers (no torch types): int4_avx2.cpp and
// int4_avx512.cpp define them, compiled with their own -m flags; int4_bind.cpp chooses a table at run time.
#pragma once
#include <stdint.h>

#include "out.h"

namespace flexbatch {

// 4-bit weights in the tile layout (engine/kernels/int4_tiles.py): for each tile of 16 output columns, for each
// octet o of inputs, 64 bytes = 16 columns x 4 bytes; byte j of column c holds code q[c, 8o + j] in its low
// nibble and q[c, 8o + 4 + j] in its high one. Per tile and group g: 16 float16 scales and 16 float16 mins
// (w = q * scale + min).
struct Int4Tile {
  const uint8_t* codes;     // [Kp / 8][64] of this tile
  const uint16_t* scales;   // [ng][16] float16
  const uint16_t* mins;     // [ng][16] float16
};

// Activations quantized per row and group (quantize_groups): codes [M][Kp] int8, scale [M][ng] and
// scale * sum(codes of the group) [M][ng], so that x . w over a group = scale (s q . qx) + min (scale sum qx).
struct QuantRows {
  const int8_t* codes;
  const float* scale;
  const float* scaled_sum;
  int64_t rows;
  int64_t kp;     // padded inputs (a multiple of group)
  int64_t group;  // inputs per group (a multiple of 8)
};

struct Int4Kernels {
  const char* name;
  // x [rows][k] (float32 or bfloat16 by x_bf16, row stride ldx) -> QuantRows buffers, rows [r0, r1)
  void (*quantize_groups)(const void* x, int x_bf16, int64_t ldx, int64_t k, int64_t r0, int64_t r1,
                          int8_t* codes, float* scale, float* scaled_sum, int64_t kp, int64_t group);
  // y[m][c] for rows [r0, r1) over `ntiles` (1 or 2) adjacent tiles, 16 columns each but the last's `cols`
  // (<= 16), written at y + m * ldy (float32 or bf16)
  void (*int4_tile_gemm)(const Int4Tile* tiles, int ntiles, const QuantRows* x, int64_t r0, int64_t r1, void* y,
                         int64_t ldy, int cols, int out_kind);
};

const Int4Kernels* avx512_int4();
const Int4Kernels* avx2_int4();

}  // namespace flexbatch
