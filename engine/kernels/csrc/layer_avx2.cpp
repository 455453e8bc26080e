// A layer's row-wise work on AVX2 (8 float32 lanes; bfloat16 rounded to nearest even with integer arithmetic,
// as PyTorch rounds): residual add + RMSNorm, SiLU * up, rotary positions in place, the greedy argmax. Same
// arithmetic as layer_avx512.cpp; the last n % 8 values of a row go through the same operations one at a time.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "layer.h"
#include "row_loops.h"
#include "simd_avx2.h"

namespace flexbatch {
namespace {

inline void store1(void* p, int bf16, int64_t i, float v) {
  if (bf16) static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
  else static_cast<float*>(p)[i] = v;
}

// v as a tensor of the dtype holds it: rounded to bfloat16, or in float32 kept from being fused with the next
// add into one FMA (the empty asm): one rounding per op, as the reference's separate ops round
inline float round_to(float v, int bf16) {
  if (bf16) return bf16_to_f32(f32_to_bf16(v));
  __asm__("" : "+x"(v));
  return v;
}

// bfloat16 bits of v (round to nearest even, NaN kept a NaN) in the low half of each 32-bit lane
inline __m256i bf16_bits(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
}

inline __m256 round_bf16(__m256 v) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v), 16)); }

inline __m256 round_to(__m256 v, int bf16) {
  if (bf16) return round_bf16(v);
  __asm__("" : "+x"(v));
  return v;
}

inline void store8(void* p, int bf16, int64_t i, __m256 v) {
  if (!bf16) return _mm256_storeu_ps(static_cast<float*>(p) + i, v);
  const __m256i b = bf16_bits(v);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i), packed);
}

void add_rms_norm(const float* h, const void* delta, int delta_bf16, float* h_out, const void* w, void* x, int bf16,
                  int64_t n, float eps) {
  const int64_t n8 = n - n % 8;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0, c = 0; i < n8; i += 8, c = (c + 1) & 3) {
    __m256 v = _mm256_loadu_ps(h + i);
    if (delta) v = _mm256_add_ps(v, load8(delta, delta_bf16, i));
    if (h_out) _mm256_storeu_ps(h_out + i, v);
    acc[c] = _mm256_fmadd_ps(v, v, acc[c]);
  }
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (int64_t i = n8; i < n; ++i) {
    float v = h[i] + (delta ? load1(delta, delta_bf16, i) : 0.0f);
    if (h_out) h_out[i] = v;
    sum += v * v;
  }
  const float* s = h_out ? h_out : h;
  const bool add = delta && !h_out;
  const float rs = 1.0f / sqrtf(sum / (float)n + eps);
  const __m256 r = _mm256_set1_ps(rs);
  for (int64_t i = 0; i < n8; i += 8) {
    __m256 v = _mm256_loadu_ps(s + i);
    if (add) v = _mm256_add_ps(v, load8(delta, delta_bf16, i));
    const __m256 normed = round_to(_mm256_mul_ps(v, r), bf16);
    store8(x, bf16, i, _mm256_mul_ps(normed, load8(w, bf16, i)));
  }
  for (int64_t i = n8; i < n; ++i) {
    const float v = s[i] + (add ? load1(delta, delta_bf16, i) : 0.0f);
    store1(x, bf16, i, round_to(v * rs, bf16) * load1(w, bf16, i));
  }
}

// exp(x) within 2 ulp (Cephes' polynomial on x - n ln 2, |x - n ln 2| <= ln 2 / 2, scaled by 2 * 2^(n - 1)
// through the exponent bits, 2^(n - 1) a normal number for x in [-86.5, 88.72]); below that range the result is
// exp(-86.5) (1 + exp(-x) rounds to 1 all the same), above it inf, as exp's is
inline __m256 exp_ps(__m256 x) {
  const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(88.7228394f), _CMP_GT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-86.5f)), _mm256_set1_ps(88.7228394f));
  __m256 n, r;
  const __m256 p = exp_poly<Lanes8>(x, &n, &r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
  const __m256 e = _mm256_mul_ps(_mm256_add_ps(y, y), _mm256_castsi256_ps(scale));
  return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), over);
}

inline __m256 silu_ps(__m256 x) {
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_ps(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)))));
}

void silu_mul(const void* g, void* out, int64_t f, int bf16) {
  const int64_t f8 = f - f % 8;
  for (int64_t j = 0; j < f8; j += 8)
    store8(out, bf16, j, _mm256_mul_ps(round_to(silu_ps(load8(g, bf16, j)), bf16), load8(g, bf16, f + j)));
  if (f8 < f) {  // the tail through the same vector arithmetic, in a zero-padded copy
    float x[8] = {0}, up[8] = {0}, y[8];
    for (int64_t j = f8; j < f; ++j) x[j - f8] = load1(g, bf16, j), up[j - f8] = load1(g, bf16, f + j);
    _mm256_storeu_ps(y, _mm256_mul_ps(round_to(silu_ps(_mm256_loadu_ps(x)), bf16), _mm256_loadu_ps(up)));
    for (int64_t j = f8; j < f; ++j) store1(out, bf16, j, y[j - f8]);
  }
}

void rope(void* row, int64_t heads, int64_t d, const void* c, const void* s, int bf16) {
  const int64_t half = d / 2, h8 = half - half % 8;
  for (int64_t h = 0; h < heads; ++h) {
    void* p = static_cast<char*>(row) + h * d * (bf16 ? 2 : 4);
    for (int64_t j = 0; j < h8; j += 8) {
      const __m256 cj = load8(c, bf16, j), sj = load8(s, bf16, j);
      const __m256 x1 = load8(p, bf16, j), x2 = load8(p, bf16, half + j);
      store8(p, bf16, j, _mm256_sub_ps(round_to(_mm256_mul_ps(x1, cj), bf16), round_to(_mm256_mul_ps(x2, sj), bf16)));
      store8(p, bf16, half + j,
             _mm256_add_ps(round_to(_mm256_mul_ps(x2, cj), bf16), round_to(_mm256_mul_ps(x1, sj), bf16)));
    }
    for (int64_t j = h8; j < half; ++j) {
      const float cj = load1(c, bf16, j), sj = load1(s, bf16, j), x1 = load1(p, bf16, j), x2 = load1(p, bf16, half + j);
      store1(p, bf16, j, round_to(x1 * cj, bf16) - round_to(x2 * sj, bf16));
      store1(p, bf16, half + j, round_to(x2 * cj, bf16) + round_to(x1 * sj, bf16));
    }
  }
}

// As layer_avx512.cpp's: per lane the largest value and the index where it was first seen, then the smallest
// index among the lanes holding the row's largest; the last n % 8 values one at a time.
int64_t argmax(const float* x, int64_t n) {
  if (n < 8) return argmax_scalar(x, n);
  __m256 best = _mm256_loadu_ps(x);
  __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), idx = at;
  __m256 nan = _mm256_cmp_ps(best, best, _CMP_UNORD_Q);
  const __m256i step = _mm256_set1_epi32(8);
  int64_t i = 8;
  for (; i + 8 <= n; i += 8) {
    idx = _mm256_add_epi32(idx, step);
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    best = _mm256_blendv_ps(best, v, gt);
    at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(idx), gt));
  }
  if (_mm256_movemask_ps(nan)) return first_nan(x, n);
  alignas(32) float b[8];
  alignas(32) int32_t a[8];
  _mm256_store_ps(b, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), at);
  int64_t arg = a[0];
  for (int j = 1; j < 8; ++j)
    if (b[j] > x[arg] || (b[j] == x[arg] && a[j] < arg)) arg = a[j];
  for (; i < n; ++i) {
    if (x[i] != x[i]) return i;
    if (x[i] > x[arg]) arg = i;
  }
  return arg;
}

const LayerKernels table = {"avx2", add_rms_norm_rows<add_rms_norm>, silu_mul_rows<silu_mul>,
                            rope_rows<rope>, argmax_rows<argmax>};

}  // namespace

const LayerKernels* avx2_layer() { return &table; }

}  // namespace flexbatch
