// MXFP4 weights x float32 rows on AVX-512: a block's 16 code bytes widened to 16 int32 lanes, each lane's low and
// high nibble looked up in the 16-entry e2m1 table scaled by the block's power of two (vpermps reads the low 4 bits
// of each index), then two FMAs per row: the block's even inputs by the low nibbles, its odd ones by the high.
// (bfloat16 pair dot products, vdpbf16ps, measured slower here: no more products a cycle than two FMAs, and the
// pairs cost two more operations per block to form.)
#include <immintrin.h>
#include <stdint.h>

#include "mxfp4.h"
#include "simd_avx512.h"

namespace flexbatch {
namespace {

const float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Block b of column `p` (its 17 bytes): the float32 weights of its even inputs (lo) and its odd ones (hi).
inline void decode(const uint8_t* p, __m512 lut, __m512* lo, __m512* hi) {
  const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512 scaled = _mm512_mul_ps(lut, _mm512_set1_ps(kScales.of[p[16]]));
  *lo = _mm512_permutexvar_ps(codes, scaled);
  *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), scaled);
}

// Rows [r0, r0 + R) x columns [n, n + C): R x C accumulators of 16 lanes over every block, summed across once.
// The C columns' decoded blocks serve every row; each row's two loads serve the C columns.
template <int R, int C>
void tile(const uint8_t* w, int64_t blocks, const float* x, int64_t ldx, int64_t r0, int64_t n, const float* bias,
          float* y, int64_t ldy) {
  const __m512 lut = _mm512_loadu_ps(kE2m1);
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const uint8_t* col[C];
  for (int c = 0; c < C; ++c) col[c] = w + (n + c) * blocks * kMxBlockBytes;
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 lo[C], hi[C];
    for (int c = 0; c < C; ++c) decode(col[c] + b * kMxBlockBytes, lut, &lo[c], &hi[c]);
    for (int r = 0; r < R; ++r) {
      const float* xr = x + (r0 + r) * ldx + b * kMxBlock;
      const __m512 evens = _mm512_loadu_ps(xr), odds = _mm512_loadu_ps(xr + 16);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(hi[c], odds, _mm512_fmadd_ps(lo[c], evens, acc[r][c]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      y[(r0 + r) * ldy + n + c] = _mm512_reduce_add_ps(acc[r][c]) + (bias ? bias[n + c] : 0.0f);
}

// The last `left` (< R) rows of a column group: one tile of that many rows.
template <int R, int C>
void last_rows(int64_t left, const uint8_t* w, int64_t blocks, const float* x, int64_t ldx, int64_t r0, int64_t n,
               const float* bias, float* y, int64_t ldy) {
  if constexpr (R > 0) {
    if (left == R) return tile<R, C>(w, blocks, x, ldx, r0, n, bias, y, ldy);
    last_rows<R - 1, C>(left, w, blocks, x, ldx, r0, n, bias, y, ldy);
  }
}

// Columns [n0, n1) in groups of C (the last group narrower), each over rows [r0, r1) in tiles of up to R rows.
template <int R, int C>
void columns(const uint8_t* w, int64_t blocks, const float* x, int64_t ldx, int64_t r0, int64_t r1, int64_t n0,
             int64_t n1, const float* bias, float* y, int64_t ldy) {
  int64_t n = n0;
  for (; n + C <= n1; n += C) {
    int64_t r = r0;
    for (; r + R <= r1; r += R) tile<R, C>(w, blocks, x, ldx, r, n, bias, y, ldy);
    last_rows<R - 1, C>(r1 - r, w, blocks, x, ldx, r, n, bias, y, ldy);
  }
  if constexpr (C > 1)
    if (n < n1) columns<R, C - 1>(w, blocks, x, ldx, r0, r1, n, n1, bias, y, ldy);
}

// Up to 4 rows: 4 columns at a time (16 accumulators); more: 8 rows x 2 columns, so that up to 8 rows decode each
// block once.
void gemm(const uint8_t* w, int64_t blocks, const float* x, int64_t ldx, int64_t r0, int64_t r1, int64_t n0,
          int64_t n1, const float* bias, float* y, int64_t ldy) {
  if (r1 - r0 <= 4)
    columns<4, 4>(w, blocks, x, ldx, r0, r1, n0, n1, bias, y, ldy);
  else
    columns<8, 2>(w, blocks, x, ldx, r0, r1, n0, n1, bias, y, ldy);
}

// 1 / (1 + e^-z): Cephes' e^x (lanes.h) on -z clamped to [-104, 89], scaled by vscalefps (inf past 88.7: 0).
inline __m512 sigmoid(__m512 z) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 x = _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), z), _mm512_set1_ps(-104.0f)),
                                 _mm512_set1_ps(89.0f));
  __m512 n, r;
  const __m512 p = exp_poly<Lanes16>(x, &n, &r);
  const __m512 e = _mm512_scalef_ps(_mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), one), n);
  return _mm512_div_ps(one, _mm512_add_ps(one, e));
}

void clamped_swiglu(const float* gu, float* out, int64_t f, float limit, float alpha) {
  const __m512 lim = _mm512_set1_ps(limit), neg = _mm512_set1_ps(-limit), a = _mm512_set1_ps(alpha);
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t j = 0; j < f; j += 16) {
    const __mmask16 m = first16(f - j);
    const __m512 g = _mm512_min_ps(_mm512_maskz_loadu_ps(m, gu + j), lim);
    const __m512 u = _mm512_max_ps(_mm512_min_ps(_mm512_maskz_loadu_ps(m, gu + f + j), lim), neg);
    _mm512_mask_storeu_ps(out + j, m,
                          _mm512_mul_ps(_mm512_add_ps(u, one), _mm512_mul_ps(g, sigmoid(_mm512_mul_ps(g, a)))));
  }
}

void clamped_swiglu_rows(const float* gu, int64_t ldg, float* out, int64_t ldo, int64_t f, float limit, float alpha,
                         int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) clamped_swiglu(gu + r * ldg, out + r * ldo, f, limit, alpha);
}

const Mxfp4Kernels table = {"avx512", gemm, clamped_swiglu_rows};

}  // namespace

const Mxfp4Kernels* avx512_mxfp4() { return &table; }

}  // namespace flexbatch
