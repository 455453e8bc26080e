// What the AVX-512 kernel files (*_avx512.cpp) share: lane masks, float32 / bfloat16 loads and stores, the lanes
// of lanes.h, int8 codes of a row. For files compiled with the AVX-512 flags only (simd_avx2.h is
// the AVX2 files' own); in an anonymous namespace, so that no symbol is shared with code built for another set.
#pragma once
#include <immintrin.h>
#include <stdint.h>

#include "lanes.h"

namespace flexbatch {
namespace {

// The first n of 16 lanes, n >= 0 (all for n >= 16).
inline __mmask16 first16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

// bfloat16 bits widened to float32 (exact).
inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// float32 rounded to bfloat16 bits (nearest even, as PyTorch rounds; NaN stays NaN).
inline __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

// 16 values (fewer under mask m; the others read as 0) from float32 or bfloat16 storage at element i.
inline __m512 load16(const void* p, int bf16, int64_t i, __mmask16 m) {
  if (!bf16) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  return widen_bf16(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
}

// 16 values from float32 or bfloat16 storage at element i where n >= 16 are left, else the first n (none for n <= 0;
// the others read as 0).
inline __m512 load_upto16(const void* p, int bf16, int64_t i, int64_t n) {
  if (n < 16) return load16(p, bf16, i, first16(n > 0 ? n : 0));
  if (!bf16) return _mm512_loadu_ps(static_cast<const float*>(p) + i);
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i)));
}

// The lanes of v under mask m to float32 or bfloat16 storage at element i.
inline void store16(void* p, int bf16, int64_t i, __m512 v, __mmask16 m) {
  if (!bf16) return _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, to_bf16(v));
}

// 16 float32 lanes (lanes.h).
struct Lanes16 {
  FLEXBATCH_LANES(__m512, 16, _mm512)
  static F round(F x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static float sum(F x) { return _mm512_reduce_add_ps(x); }
};

// max |x[i]| for i in [i0, i1), float32 or bfloat16 values.
inline float absmax(const void* x, int bf16, int64_t i0, int64_t i1) {
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = i0; i < i1; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(load_upto16(x, bf16, i, i1 - i)));
  return _mm512_reduce_max_ps(m);
}

// int8 codes in int32 lanes: v * inv rounded to nearest even, clamped to [-127, 127].
inline __m512i quantize16(__m512 v, __m512 inv) {
  const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
  return _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
}

}  // namespace
}  // namespace flexbatch
