// MXFP4 weights x float32 rows on AVX-512: a block's 16 code bytes widened to 16 int32 lanes, each lane's low and
// high nibble looked up in the 16-entry e2m1 table scaled by the block's power of two (vpermps reads the low 4 bits
// of each index), then two FMAs per row: the block's even inputs by the low nibbles, its odd ones by the high.
#include <immintrin.h>
#include <stdint.h>

#include "mxfp4.h"
#include "simd_avx512.h"

namespace flexbatch {
namespace {

const float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

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
    for (int c = 0; c < C; ++c) {
      const uint8_t* p = col[c] + b * kMxBlockBytes;
      const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      const __m512 scaled = _mm512_mul_ps(lut, _mm512_set1_ps(e8m0(p[16])));
      lo[c] = _mm512_permutexvar_ps(codes, scaled);
      hi[c] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), scaled);
    }
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

template <int C>
void column_rows(const uint8_t* w, int64_t blocks, const float* x, int64_t ldx, int64_t r0, int64_t r1, int64_t n,
                 const float* bias, float* y, int64_t ldy) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) tile<4, C>(w, blocks, x, ldx, r, n, bias, y, ldy);
  switch (r1 - r) {
    case 3: tile<3, C>(w, blocks, x, ldx, r, n, bias, y, ldy); break;
    case 2: tile<2, C>(w, blocks, x, ldx, r, n, bias, y, ldy); break;
    case 1: tile<1, C>(w, blocks, x, ldx, r, n, bias, y, ldy); break;
    default: break;
  }
}

void gemm(const uint8_t* w, int64_t blocks, const float* x, int64_t ldx, int64_t r0, int64_t r1, int64_t n0,
          int64_t n1, const float* bias, float* y, int64_t ldy) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) column_rows<4>(w, blocks, x, ldx, r0, r1, n, bias, y, ldy);
  switch (n1 - n) {
    case 3: column_rows<3>(w, blocks, x, ldx, r0, r1, n, bias, y, ldy); break;
    case 2: column_rows<2>(w, blocks, x, ldx, r0, r1, n, bias, y, ldy); break;
    case 1: column_rows<1>(w, blocks, x, ldx, r0, r1, n, bias, y, ldy); break;
    default: break;
  }
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

// One row: each block of 32 gated values computed in order, then stored evens first, odds after (block order).
void clamped_swiglu(const float* gu, float* out, int64_t f, float limit, float alpha) {
  const __m512 lim = _mm512_set1_ps(limit), neg = _mm512_set1_ps(-limit), a = _mm512_set1_ps(alpha);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
  for (int64_t j = 0; j < f; j += kMxBlock) {
    __m512 v[2];
    for (int h = 0; h < 2; ++h) {
      const __m512 g = _mm512_min_ps(_mm512_loadu_ps(gu + j + 16 * h), lim);
      const __m512 u = _mm512_max_ps(_mm512_min_ps(_mm512_loadu_ps(gu + f + j + 16 * h), lim), neg);
      v[h] = _mm512_mul_ps(_mm512_add_ps(u, one), _mm512_mul_ps(g, sigmoid(_mm512_mul_ps(g, a))));
    }
    _mm512_storeu_ps(out + j, _mm512_permutex2var_ps(v[0], evens, v[1]));
    _mm512_storeu_ps(out + j + 16, _mm512_permutex2var_ps(v[0], odds, v[1]));
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
