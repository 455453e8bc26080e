// int8 x int8 GEMMs on AVX-512 VNNI: vpdpbusd multiplies unsigned by signed bytes, so activation codes are offset
// by 128 (1..255) and the offset's share, 128 * sum_k w[n][k], is taken off at the end (exact in int32).
// Over the weight as stored ([N][K] row-major), a micro-tile of up to 4 rows x 4 columns keeps 16 dot products in
// flight, 64 inputs per step, each reduced across its lanes once, at the end. Over the tile layout, each lane is
// an output column: four inputs of a row are broadcast to every lane, and nothing is reduced across lanes.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "int8.h"
#include "row_loops.h"
#include "simd_avx512.h"

namespace flexbatch {
namespace {

void quantize_row(const void* x, int bf16, int64_t k, uint8_t* codes, float* scale, int64_t kp) {
  const float m = absmax(x, bf16, 0, k);
  const __m512 inv = _mm512_set1_ps(m > 0 ? 127.0f / m : 0.0f);
  for (int64_t i = 0; i < kp; i += 16) {
    const __m512i q = _mm512_add_epi32(quantize16(load_upto16(x, bf16, i, k - i), inv), _mm512_set1_epi32(128));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(q));
  }
  *scale = m / 127.0f;
}

// The four lane sums of a0..a3, as one 128-bit vector [sum a0, sum a1, sum a2, sum a3].
inline __m128i reduce4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
  const __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
  const __m256i v = _mm256_add_epi32(_mm512_castsi512_si256(u), _mm512_extracti64x4_epi64(u, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

inline void store4(void* y, int64_t off, __m128 v, int cols, int out_kind) {
  float f[4];
  _mm_storeu_ps(f, v);
  if (out_kind == OUT_F32) {
    memcpy(static_cast<float*>(y) + off, f, cols * sizeof(float));
  } else {
    uint16_t h[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h), (__m128i)_mm256_cvtneps_pbh(_mm256_castps128_ps256(v)));
    memcpy(static_cast<uint16_t*>(y) + off, h, cols * sizeof(uint16_t));
  }
}

// R rows x C columns (C <= 4) starting at (r0, c0).
template <int R, int C>
void micro(const Int8Weight* w, const uint8_t* codes, const float* scale, int64_t kp, int64_t r0, int64_t c0,
           void* y, int64_t ldy, int out_kind) {
  __m512i acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_si512();
  const int8_t* wr[C];
  for (int c = 0; c < C; ++c) wr[c] = w->codes + (c0 + c) * w->k;
  const int64_t k = w->k;
  const int64_t full = k / 64 * 64;
  for (int64_t i = 0; i < full; i += 64) {
    __m512i wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_si512(wr[c] + i);
    for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_loadu_si512(codes + (r0 + r) * kp + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], xv, wv[c]);
    }
  }
  if (full < k) {  // the last inputs: weight bytes past k read as zero
    const __mmask64 m = ((__mmask64)1 << (k - full)) - 1;
    __m512i wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm512_maskz_loadu_epi8(m, wr[c] + full);
    for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_loadu_si512(codes + (r0 + r) * kp + full);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], xv, wv[c]);
    }
  }
  float ws[4] = {0, 0, 0, 0};
  int32_t sums[4] = {0, 0, 0, 0};
  for (int c = 0; c < C; ++c) {
    ws[c] = w->scales[c0 + c];
    sums[c] = 128 * w->code_sums[c0 + c];
  }
  const __m128 wsv = _mm_loadu_ps(ws);
  const __m128i off = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sums));
  for (int r = 0; r < R; ++r) {
    const __m128i dot = _mm_sub_epi32(reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), off);
    const __m128 v = _mm_mul_ps(_mm_cvtepi32_ps(dot), _mm_mul_ps(wsv, _mm_set1_ps(scale[r0 + r])));
    store4(y, (r0 + r) * ldy + c0, v, C, out_kind);
  }
}

template <int R>
void rows_block(const Int8Weight* w, const uint8_t* codes, const float* scale, int64_t kp, int64_t r0,
                int64_t c0, int64_t c1, void* y, int64_t ldy, int out_kind) {
  int64_t c = c0;
  for (; c + 4 <= c1; c += 4) micro<R, 4>(w, codes, scale, kp, r0, c, y, ldy, out_kind);
  switch (c1 - c) {
    case 3: micro<R, 3>(w, codes, scale, kp, r0, c, y, ldy, out_kind); break;
    case 2: micro<R, 2>(w, codes, scale, kp, r0, c, y, ldy, out_kind); break;
    case 1: micro<R, 1>(w, codes, scale, kp, r0, c, y, ldy, out_kind); break;
    default: break;
  }
}

void gemm(const Int8Weight* w, const uint8_t* codes, const float* scale, int64_t kp, int64_t r0, int64_t r1,
          int64_t c0, int64_t c1, void* y, int64_t ldy, int out_kind) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) rows_block<4>(w, codes, scale, kp, r, c0, c1, y, ldy, out_kind);
  switch (r1 - r) {
    case 3: rows_block<3>(w, codes, scale, kp, r, c0, c1, y, ldy, out_kind); break;
    case 2: rows_block<2>(w, codes, scale, kp, r, c0, c1, y, ldy, out_kind); break;
    case 1: rows_block<1>(w, codes, scale, kp, r, c0, c1, y, ldy, out_kind); break;
    default: break;
  }
}

// R rows (1..4) x T tiles (1..4) of the tile layout: R T int32 accumulators of 16 columns, four inputs per
// vpdpbusd; the rescale as the stored form's kernel does it, so both forms give the same values.
template <int R, int T>
void tile_rows(const Int8Tiles* w, const uint8_t* codes, const float* scale, int64_t r0, int64_t t0, void* y,
               int64_t ldy, int cols, int out_kind) {
  const int64_t kp = w->kp, quads = kp / 4;
  __m512i acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < T; ++j) acc[r][j] = _mm512_setzero_si512();
  const int8_t* wt = w->codes + t0 * kp * 16;
  const uint8_t* xr = codes + r0 * kp;
  for (int64_t q = 0; q < quads; ++q) {
    __m512i wv[T];
    for (int j = 0; j < T; ++j) wv[j] = _mm512_loadu_si512(wt + (j * quads + q) * 64);
    for (int r = 0; r < R; ++r) {
      int32_t a;
      memcpy(&a, xr + r * kp + 4 * q, 4);
      const __m512i xb = _mm512_set1_epi32(a);
      for (int j = 0; j < T; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], xb, wv[j]);
    }
  }
  for (int j = 0; j < T; ++j) {
    const int64_t c = (t0 + j) * 16;
    const __m512 ws = _mm512_loadu_ps(w->scales + c);
    const __m512i off = _mm512_slli_epi32(_mm512_loadu_si512(w->code_sums + c), 7);
    const __mmask16 m = first16(j == T - 1 ? cols : 16);
    for (int r = 0; r < R; ++r) {
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][j], off));
      const __m512 v = _mm512_mul_ps(dot, _mm512_mul_ps(ws, _mm512_set1_ps(scale[r0 + r])));
      store16(y, out_kind == OUT_BF16, (r0 + r) * ldy + 16 * j, v, m);
    }
  }
}

template <int T>
void tiles_rows(const Int8Tiles* w, const uint8_t* codes, const float* scale, int64_t r0, int64_t r1, int64_t t0,
                void* y, int64_t ldy, int cols, int out_kind) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) tile_rows<4, T>(w, codes, scale, r, t0, y, ldy, cols, out_kind);
  switch (r1 - r) {
    case 3: tile_rows<3, T>(w, codes, scale, r, t0, y, ldy, cols, out_kind); break;
    case 2: tile_rows<2, T>(w, codes, scale, r, t0, y, ldy, cols, out_kind); break;
    case 1: tile_rows<1, T>(w, codes, scale, r, t0, y, ldy, cols, out_kind); break;
    default: break;
  }
}

void tile_gemm(const Int8Tiles* w, const uint8_t* codes, const float* scale, int64_t r0, int64_t r1, int64_t t0,
               int ntiles, void* y, int64_t ldy, int cols, int out_kind) {
  switch (ntiles) {
    case 4: tiles_rows<4>(w, codes, scale, r0, r1, t0, y, ldy, cols, out_kind); break;
    case 3: tiles_rows<3>(w, codes, scale, r0, r1, t0, y, ldy, cols, out_kind); break;
    case 2: tiles_rows<2>(w, codes, scale, r0, r1, t0, y, ldy, cols, out_kind); break;
    default: tiles_rows<1>(w, codes, scale, r0, r1, t0, y, ldy, cols, out_kind); break;
  }
}

const Int8Kernels table = {"avx512", quantize_rows<quantize_row>, gemm, tile_gemm};

}  // namespace

const Int8Kernels* avx512_int8() { return &table; }

}  // namespace flexbatch
