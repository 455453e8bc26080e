// bfloat16 weights x float32 activations on AVX2 + FMA, over the tile layout (bf16w.h): per input k, one 32-byte
// load of a tile widened to two float32 vectors of 8 columns (a shift, an and), each row's x[k] broadcast, one
// fused multiply-add per vector. Each output is one chain of FMAs over k in order, whatever the block shape.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "bf16w.h"

namespace flexbatch {
namespace {

// R rows x T tiles from row 0 of x and tile 0 of w (tile t at w + t k 16); the last tile writes `cols` columns.
// Registers: 2 R T sums, 2 T widened weights, a broadcast; R T >= 4 keeps 8 FMA chains in flight. `ahead`, where
// given, is prefetched into L2 a line every other input: the weights computed next, read from memory meanwhile.
template <int R, int T>
void micro(const uint16_t* w, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy, int cols,
           const uint16_t* ahead) {
  const __m256i high = _mm256_set1_epi32((int)0xFFFF0000);
  __m256 acc[R][T][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    if (ahead && i % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(ahead + i * 16), _MM_HINT_T1);
    __m256 lo[T], hi[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (t * k + i) * 16));
      lo[t] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      hi[t] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * ldx + i);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        acc[r][t][0] = _mm256_fmadd_ps(xb, lo[t], acc[r][t][0]);
        acc[r][t][1] = _mm256_fmadd_ps(xb, hi[t], acc[r][t][1]);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      float* out = y + r * ldy + 16 * t;
      if (t < T - 1 || cols == 16) {
        _mm256_storeu_ps(out, acc[r][t][0]);
        _mm256_storeu_ps(out + 8, acc[r][t][1]);
      } else {
        float v[16];
        _mm256_storeu_ps(v, acc[r][t][0]);
        _mm256_storeu_ps(v + 8, acc[r][t][1]);
        memcpy(out, v, cols * sizeof(float));
      }
    }
}

// One or two rows over all ntiles (<= 4) tiles at once: 2 ntiles or 4 FMA chains per pass.
void few_rows(const uint16_t* w, int64_t k, const float* x, int64_t ldx, int64_t rows, int ntiles, float* y,
              int64_t ldy, int cols) {
  if (rows == 2) {
    if (ntiles > 1) micro<2, 2>(w, k, x, ldx, y, ldy, ntiles == 2 ? cols : 16, nullptr);
    if (ntiles == 3) micro<2, 1>(w + 2 * k * 16, k, x, ldx, y + 32, ldy, cols, nullptr);
    if (ntiles == 4) micro<2, 2>(w + 2 * k * 16, k, x, ldx, y + 32, ldy, cols, nullptr);
    if (ntiles == 1) micro<2, 1>(w, k, x, ldx, y, ldy, cols, nullptr);
    return;
  }
  switch (ntiles) {
    case 4: micro<1, 4>(w, k, x, 0, y, 0, cols, nullptr); break;
    case 3: micro<1, 3>(w, k, x, 0, y, 0, cols, nullptr); break;
    case 2: micro<1, 2>(w, k, x, 0, y, 0, cols, nullptr); break;
    default: micro<1, 1>(w, k, x, 0, y, 0, cols, nullptr); break;
  }
}

// rows (>= 3) of one tile in blocks of 6 (12 sums), the last 7 or 8 as 4 + 3 or 4 + 4 rather than leave one or two;
// the first block prefetches `ahead`.
void one_tile(const uint16_t* w, int64_t k, const float* x, int64_t ldx, int64_t rows, float* y, int64_t ldy,
              int cols, const uint16_t* ahead) {
  for (int64_t r = 0; r < rows; ahead = nullptr) {
    const int64_t left = rows - r, n = left == 7 || left == 8 ? 4 : left < 6 ? left : 6;
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    switch (n) {
      case 6: micro<6, 1>(w, k, xr, ldx, yr, ldy, cols, ahead); break;
      case 5: micro<5, 1>(w, k, xr, ldx, yr, ldy, cols, ahead); break;
      case 4: micro<4, 1>(w, k, xr, ldx, yr, ldy, cols, ahead); break;
      case 3: micro<3, 1>(w, k, xr, ldx, yr, ldy, cols, ahead); break;
      case 2: micro<2, 1>(w, k, xr, ldx, yr, ldy, cols, ahead); break;
      default: micro<1, 1>(w, k, xr, ldx, yr, ldy, cols, ahead); break;
    }
    r += n;
  }
}

// Tile by tile, all rows of one before the next (its weights stay in L1 / L2 across the rows), each prefetching
// the next tile; the last prefetches `next` (the tiles of the caller's next work item, or null).
void tile_gemm(const uint16_t* tiles, int64_t k, const float* x, int64_t ldx, int64_t r0, int64_t r1, int64_t t0,
               int ntiles, float* y, int64_t ldy, int cols, const uint16_t* next) {
  const uint16_t* w = tiles + t0 * k * 16;
  const int64_t rows = r1 - r0;
  if (rows <= 2) return few_rows(w, k, x + r0 * ldx, ldx, rows, ntiles, y + r0 * ldy, ldy, cols);
  for (int j = 0; j < ntiles; ++j)
    one_tile(w + j * k * 16, k, x + r0 * ldx, ldx, rows, y + r0 * ldy + 16 * j, ldy, j + 1 == ntiles ? cols : 16,
             j + 1 < ntiles ? w + (j + 1) * k * 16 : next);
}

const Bf16wKernels table = {"avx2", tile_gemm};

}  // namespace

const Bf16wKernels* avx2_bf16w() { return &table; }

}  // namespace flexbatch
