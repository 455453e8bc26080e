// MXFP4 weights x float32 rows on AVX2: 8 code bytes widened to 8 int32 lanes at a time, each nibble's magnitude
// looked up in the 8-entry e2m1 table scaled by the block's power of two (vpermps reads the low 3 bits of each
// index) and its top bit moved to the float's sign; then FMAs as mxfp4_avx512.cpp's, 8 lanes at a time.
#include <immintrin.h>
#include <stdint.h>

#include "mxfp4.h"
#include "simd_avx2.h"

namespace flexbatch {
namespace {

const float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// The values of the nibbles at bit `Shift` (0: low, 4: high) of lanes v: magnitude from the scaled table, sign from
// the nibble's top bit.
template <int Shift>
inline __m256 decode8(__m256i v, __m256 scaled) {
  const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(v, 28 - Shift), _mm256_set1_epi32(INT32_MIN));
  const __m256 magnitude = _mm256_permutevar8x32_ps(scaled, Shift ? _mm256_srli_epi32(v, Shift) : v);
  return _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign));
}

// Rows [r0, r0 + R) x columns [n, n + C): a block's bytes in two halves of 8, each giving 8 even inputs' weights
// (low nibbles) and 8 odd ones' (high nibbles); each decoded vector serves every row.
template <int R, int C>
void tile(const uint8_t* w, int64_t blocks, const float* x, int64_t ldx, int64_t r0, int64_t n, const float* bias,
          float* y, int64_t ldy) {
  const __m256 lut = _mm256_loadu_ps(kMagnitude);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* p[C];
    __m256 scaled[C];
    for (int c = 0; c < C; ++c) {
      p[c] = w + ((n + c) * blocks + b) * kMxBlockBytes;
      scaled[c] = _mm256_mul_ps(lut, _mm256_set1_ps(kScales.of[p[c][16]]));
    }
    for (int h = 0; h < 2; ++h) {
      __m256i v[C];
      __m256 wv[C];
      for (int c = 0; c < C; ++c) {
        v[c] = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p[c] + 8 * h)));
        wv[c] = decode8<0>(v[c], scaled[c]);
      }
      for (int r = 0; r < R; ++r) {
        const __m256 evens = _mm256_loadu_ps(x + (r0 + r) * ldx + b * kMxBlock + 8 * h);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv[c], evens, acc[r][c]);
      }
      for (int c = 0; c < C; ++c) wv[c] = decode8<4>(v[c], scaled[c]);
      for (int r = 0; r < R; ++r) {
        const __m256 odds = _mm256_loadu_ps(x + (r0 + r) * ldx + b * kMxBlock + 16 + 8 * h);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv[c], odds, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[(r0 + r) * ldy + n + c] = hsum(acc[r][c]) + (bias ? bias[n + c] : 0.0f);
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

// Up to 4 rows: 2 columns at a time (8 accumulators); more: 8 rows x 1 column, so that up to 8 rows decode each
// block once.
void gemm(const uint8_t* w, int64_t blocks, const float* x, int64_t ldx, int64_t r0, int64_t r1, int64_t n0,
          int64_t n1, const float* bias, float* y, int64_t ldy) {
  if (r1 - r0 <= 4)
    columns<4, 2>(w, blocks, x, ldx, r0, r1, n0, n1, bias, y, ldy);
  else
    columns<8, 1>(w, blocks, x, ldx, r0, r1, n0, n1, bias, y, ldy);
}

// 1 / (1 + e^-z): Cephes' e^x (lanes.h) on -z clamped to [-87, 88], scaled by 2 * 2^(n - 1) through the exponent
// bits (0 at the low end, where 1 + e^x is 1 all the same).
inline __m256 sigmoid(__m256 z) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 x = _mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), z), _mm256_set1_ps(-87.0f)),
                                 _mm256_set1_ps(88.0f));
  __m256 n, r;
  const __m256 p = exp_poly<Lanes8>(x, &n, &r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), one);
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
  const __m256 e = _mm256_mul_ps(_mm256_add_ps(y, y), _mm256_castsi256_ps(scale));
  return _mm256_div_ps(one, _mm256_add_ps(one, e));
}

// One row; f a multiple of 8 (of 32: whole blocks).
void clamped_swiglu(const float* gu, float* out, int64_t f, float limit, float alpha) {
  const __m256 lim = _mm256_set1_ps(limit), neg = _mm256_set1_ps(-limit), a = _mm256_set1_ps(alpha);
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t j = 0; j < f; j += 8) {
    const __m256 g = _mm256_min_ps(_mm256_loadu_ps(gu + j), lim);
    const __m256 u = _mm256_max_ps(_mm256_min_ps(_mm256_loadu_ps(gu + f + j), lim), neg);
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_add_ps(u, one), _mm256_mul_ps(g, sigmoid(_mm256_mul_ps(g, a)))));
  }
}

void clamped_swiglu_rows(const float* gu, int64_t ldg, float* out, int64_t ldo, int64_t f, float limit, float alpha,
                         int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) clamped_swiglu(gu + r * ldg, out + r * ldo, f, limit, alpha);
}

const Mxfp4Kernels table = {"avx2", gemm, clamped_swiglu_rows};

}  // namespace

const Mxfp4Kernels* avx2_mxfp4() { return &table; }

}  // namespace flexbatch
