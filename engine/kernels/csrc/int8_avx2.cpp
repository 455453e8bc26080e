// int8 x int8 GEMMs on AVX2, over the weight as stored ([N][K] row-major) and over the tile layout (int8.h).
// vpmaddubsw multiplies unsigned by signed bytes into saturating int16 pairs, so each product is taken as
// |w| * (x with w's sign): at most 2 * 127 * 127 per pair, which never saturates; vpmaddwd then sums pairs into
// int32 lanes. Activation codes stay signed.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "int8.h"
#include "row_loops.h"
#include "simd_avx2.h"

namespace flexbatch {
namespace {

void quantize_row(const void* x, int bf16, int64_t k, uint8_t* codes, float* scale, int64_t kp) {
  float m = 0.0f;
  for (int64_t i = 0; i < k; ++i) m = fmaxf(m, fabsf(load1(x, bf16, i)));
  const __m256 inv = _mm256_set1_ps(m > 0 ? 127.0f / m : 0.0f);
  int8_t* out = reinterpret_cast<int8_t*>(codes);
  for (int64_t i = 0; i < kp; i += 8) {
    float v[8];
    for (int j = 0; j < 8; ++j) v[j] = i + j < k ? load1(x, bf16, i + j) : 0.0f;
    int32_t q[8];
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), quantize8(_mm256_loadu_ps(v), inv));
    for (int j = 0; j < 8; ++j) out[i + j] = (int8_t)q[j];
  }
  *scale = m / 127.0f;
}

// R rows x C columns (R, C <= 2) starting at (r0, c0); the last partial 32 inputs go through a zero-padded copy.
template <int R, int C>
void micro(const Int8Weight* w, const uint8_t* codes, const float* scale, int64_t kp, int64_t r0, int64_t c0,
           void* y, int64_t ldy, int out_kind) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_si256();
  const int64_t k = w->k;
  for (int64_t i = 0; i < k; i += 32) {
    __m256i wv[C];
    for (int c = 0; c < C; ++c) {
      const int8_t* src = w->codes + (c0 + c) * k + i;
      if (k - i >= 32) {
        wv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      } else {
        int8_t tail[32] = {0};
        memcpy(tail, src, k - i);
        wv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tail));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + (r0 + r) * kp + i));
      for (int c = 0; c < C; ++c) {
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv[c], wv[c]), _mm256_sign_epi8(xv, wv[c]));
        acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(p, ones));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const float v = (float)hsum(acc[r][c]) * (scale[r0 + r] * w->scales[c0 + c]);
      const int64_t off = (r0 + r) * ldy + c0 + c;
      if (out_kind == OUT_F32) static_cast<float*>(y)[off] = v;
      else static_cast<uint16_t*>(y)[off] = f32_to_bf16(v);
    }
}

template <int R>
void rows_block(const Int8Weight* w, const uint8_t* codes, const float* scale, int64_t kp, int64_t r0,
                int64_t c0, int64_t c1, void* y, int64_t ldy, int out_kind) {
  int64_t c = c0;
  for (; c + 2 <= c1; c += 2) micro<R, 2>(w, codes, scale, kp, r0, c, y, ldy, out_kind);
  if (c < c1) micro<R, 1>(w, codes, scale, kp, r0, c, y, ldy, out_kind);
}

void gemm(const Int8Weight* w, const uint8_t* codes, const float* scale, int64_t kp, int64_t r0, int64_t r1,
          int64_t c0, int64_t c1, void* y, int64_t ldy, int out_kind) {
  int64_t r = r0;
  for (; r + 2 <= r1; r += 2) rows_block<2>(w, codes, scale, kp, r, c0, c1, y, ldy, out_kind);
  if (r < r1) rows_block<1>(w, codes, scale, kp, r, c0, c1, y, ldy, out_kind);
}

// R rows (1 or 2) of one tile: each 16-column tile is two halves of 8 int32 lanes; four inputs of a row are
// broadcast to every lane. The rescale as the stored form's kernel does it, so both forms give the same values.
template <int R>
void tile_rows(const int8_t* wt, const float* ws, int64_t kp, const uint8_t* codes, const float* scale, int64_t r0,
               void* y, int64_t ldy, int cols, int out_kind) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const int64_t quads = kp / 4;
  const int8_t* xr = reinterpret_cast<const int8_t*>(codes) + r0 * kp;
  for (int64_t q = 0; q < quads; ++q) {
    __m256i wv[2], wa[2];
    for (int h = 0; h < 2; ++h) {
      wv[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + q * 64 + 32 * h));
      wa[h] = _mm256_sign_epi8(wv[h], wv[h]);
    }
    for (int r = 0; r < R; ++r) {
      int32_t a;
      memcpy(&a, xr + r * kp + 4 * q, 4);
      const __m256i xb = _mm256_set1_epi32(a);
      for (int h = 0; h < 2; ++h)
        acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(wa[h], _mm256_sign_epi8(xb, wv[h])), ones));
    }
  }
  for (int r = 0; r < R; ++r) {
    float v[16];
    const __m256 xs = _mm256_set1_ps(scale[r0 + r]);
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(v + 8 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][h]), _mm256_mul_ps(xs, _mm256_loadu_ps(ws + 8 * h))));
    const int64_t off = (r0 + r) * ldy;
    for (int c = 0; c < cols; ++c) {
      if (out_kind == OUT_F32) static_cast<float*>(y)[off + c] = v[c];
      else static_cast<uint16_t*>(y)[off + c] = f32_to_bf16(v[c]);
    }
  }
}

void tile_gemm(const Int8Tiles* w, const uint8_t* codes, const float* scale, int64_t r0, int64_t r1, int64_t t0,
               int ntiles, void* y, int64_t ldy, int cols, int out_kind) {
  const int64_t kp = w->kp;
  for (int j = 0; j < ntiles; ++j) {
    const int8_t* wt = w->codes + (t0 + j) * kp * 16;
    const float* ws = w->scales + (t0 + j) * 16;
    void* yt = static_cast<char*>(y) + 16 * j * (out_kind == OUT_F32 ? 4 : 2);
    const int c = j == ntiles - 1 ? cols : 16;
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) tile_rows<2>(wt, ws, kp, codes, scale, r, yt, ldy, c, out_kind);
    if (r < r1) tile_rows<1>(wt, ws, kp, codes, scale, r, yt, ldy, c, out_kind);
  }
}

const Int8Kernels table = {"avx2", quantize_rows<quantize_row>, gemm, tile_gemm};

}  // namespace

const Int8Kernels* avx2_int8() { return &table; }

}  // namespace flexbatch
