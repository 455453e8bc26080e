// What the AVX2 kernel files (*_avx2.cpp) share: bfloat16 conversions, float32 / bfloat16 loads, sums and maxima
// across lanes, the lanes of lanes.h, int8 codes. For files compiled with the AVX2 flags (AVX2, FMA, F16C;
// simd_avx512.h is the AVX-512 files' own); in an anonymous namespace, so that no symbol is shared with code built
// for another set.
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "lanes.h"

namespace flexbatch {
namespace {

inline float bf16_to_f32(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, as PyTorch rounds; NaN stays NaN
  if (f != f) return 0x7FC0;
  uint32_t b;
  memcpy(&b, &f, 4);
  b += 0x7FFF + ((b >> 16) & 1);
  return (uint16_t)(b >> 16);
}

// Element i of float32 or bfloat16 storage, as float32.
inline float load1(const void* p, int bf16, int64_t i) {
  return bf16 ? bf16_to_f32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// bfloat16 bits widened to float32 (exact).
inline __m256 widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

// 8 values from float32 or bfloat16 storage at element i.
inline __m256 load8(const void* p, int bf16, int64_t i) {
  if (!bf16) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
}

inline float hsum(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// 8 float32 lanes (lanes.h), summed across by hsum.
struct Lanes8 {
  FLEXBATCH_LANES(__m256, 8, _mm256)
  static F round(F x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static float sum(F x) { return hsum(x); }
};

// int8 codes in int32 lanes: v * inv rounded to nearest even, clamped to [-127, 127].
inline __m256i quantize8(__m256 v, __m256 inv) {
  const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv));
  return _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

}  // namespace
}  // namespace flexbatch
