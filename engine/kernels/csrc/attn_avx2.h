// Helpers of the AVX2 attention kernels (attn_*avx2.cpp), for files compiled with the AVX2 flags only; in an
// anonymous namespace, so that no symbol is shared with code built for another set.
#pragma once
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "simd_avx2.h"

namespace flexbatch {
namespace {

// e^x, relative error ~1e-7 (Cephes' polynomial); 0 below -87.3 (and for -inf).
inline __m256 exp_ps(__m256 x) {
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 n, r;
  const __m256 p = exp_poly<Lanes8>(x, &n, &r);
  const __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// 8 float32 rounded to bfloat16 bits (nearest even, as PyTorch rounds; NaN stays NaN).
inline __m128i to_bf16(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// Lanes j < 8 set where bit j of `bits` is.
inline __m256 lanes_of(unsigned bits) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), bit), bit));
}

}  // namespace
}  // namespace flexbatch
