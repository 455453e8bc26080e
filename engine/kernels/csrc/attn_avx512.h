// Helpers of the AVX-512 attention kernels (attn_*avx512.cpp), for files compiled with
// the AVX-512 flags only; in an anonymous namespace, so that no symbol is shared with code built for another set.
#pragma once
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn.h"
#include "simd_avx512.h"

namespace flexbatch {
namespace {

// e^x, relative error ~1e-7 (Cephes' polynomial); 0 for x <= -150 (and -inf).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-150.0f)), _mm512_set1_ps(88.0f));
  __m512 n, r;
  const __m512 p = exp_poly<Lanes16>(x, &n, &r);
  return _mm512_scalef_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f))), n);
}

// acc + a . b over pairs of bf16 (vdpbf16ps). Written as asm: GCC 12 stores an accumulator array updated by the
// intrinsic back to the stack at every step instead of keeping it in registers.
inline __m512 dot_bf16(__m512 acc, __m512i a, __m512i b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// ---- decode: the work item's scratch, masks and the online-softmax step between its two passes ----

struct Scratch {
  float* s;       // [n][tp] scores, then probabilities
  float* pw;      // [n][tp] 4-bit: probabilities times the slots' scales (and q's group sums in the first pass)
  uint16_t* ph;   // [n][tp] probabilities in bf16
  uint16_t* pl;   // [n][tp] their bf16 remainders
  uint16_t* qh;   // [n][dp] q in bf16
  uint16_t* ql;   // [n][dp] its bf16 remainder
  float* zero;    // [dp] zeros: the row read in place of a slot past the end
  int64_t tp;
};

inline Scratch carve(const AttnQuery* a) {
  Scratch w;
  w.tp = attn_padded_slots(a->t);
  char* p = static_cast<char*>(a->scratch);
  const int64_t nt = a->n * w.tp, nd = a->n * a->dp;
  w.s = reinterpret_cast<float*>(p); p += 4 * nt;
  w.pw = reinterpret_cast<float*>(p); p += 4 * nt;
  w.ph = reinterpret_cast<uint16_t*>(p); p += 2 * nt;
  w.pl = reinterpret_cast<uint16_t*>(p); p += 2 * nt;
  w.qh = reinterpret_cast<uint16_t*>(p); p += 2 * nd;
  w.ql = reinterpret_cast<uint16_t*>(p); p += 2 * nd;
  w.zero = reinterpret_cast<float*>(p);
  memset(w.zero, 0, 4 * a->dp);
  return w;
}

// Which of slots [t0, t0 + 16) exist.
inline __mmask16 live16(int64_t t0, int64_t t) { return t0 >= t ? (__mmask16)0 : first16(t - t0); }

// Which of slots [t0, t0 + 16) exist and may be attended to.
inline __mmask16 allowed16(const uint8_t* mask, int64_t t0, int64_t t) {
  const __mmask16 live = live16(t0, t);
  if (!mask) return live;
  const __m128i m = _mm_maskz_loadu_epi8(live, mask + t0);
  return _mm_test_epi8_mask(m, m) & live;
}

// ---- the online-softmax step between the passes ----

// Scores -> probabilities relative to the new running max (zero past t), the state rescaled to it; in bf16
// halves too where the values are bf16.
inline void softmax(const AttnQuery* a, const Scratch& w, bool bf16) {
  const int64_t T = a->t;
  for (int64_t h = 0; h < a->n; ++h) {
    float* s = w.s + h * w.tp;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t t0 = 0; t0 < T; t0 += 16) mx = _mm512_mask_max_ps(mx, live16(t0, T), mx, _mm512_loadu_ps(s + t0));
    fold_step(a, h, _mm512_reduce_max_ps(mx), s, w.tp, [&](float m_new) {
      const __m512 mv = _mm512_set1_ps(m_new);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t t0 = 0; t0 < w.tp; t0 += 16) {
        const __m512 p = _mm512_maskz_mov_ps(live16(t0, T), exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t0), mv)));
        _mm512_storeu_ps(s + t0, p);
        acc = _mm512_add_ps(acc, p);
      }
      return _mm512_reduce_add_ps(acc);
    });
    if (!bf16) continue;
    for (int64_t t0 = 0; t0 < w.tp; t0 += 16) {
      const __m512 p = _mm512_loadu_ps(s + t0);
      const __m256i ph = to_bf16(p);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.ph + h * w.tp + t0), ph);
      const __m256i pl = to_bf16(_mm512_sub_ps(p, widen_bf16(ph)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.pl + h * w.tp + t0), pl);
    }
  }
}

// Whether any of HB query rows gives slots [t0, t0 + 16) a nonzero probability (masked slots have none).
template <int HB>
inline bool any16(const Scratch& w, int64_t h0, int64_t t0) {
  __m512 x = _mm512_setzero_ps();
  for (int hb = 0; hb < HB; ++hb) x = _mm512_or_ps(x, _mm512_loadu_ps(w.s + (h0 + hb) * w.tp + t0));
  return _mm512_test_epi32_mask(_mm512_castps_si512(x), _mm512_castps_si512(x)) != 0;
}

}  // namespace
}  // namespace flexbatch
