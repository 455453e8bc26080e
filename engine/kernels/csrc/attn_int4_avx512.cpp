// Decode attention over the 4-bit cache on AVX-512, vectorized over 16 slots as the cache stores them (slots
// innermost): q . k = scale (q . codes) + min (q's group sum) per group, and p . v one pair row of a group at a
// time over all slots, p weighted by each slot's scale.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn.h"
#include "attn_avx512.h"

namespace flexbatch {
namespace {

// ---- the 4-bit cache, vectorized over 16 slots ----

inline __m512 codes16(const uint8_t* p, __mmask16 live, __m512* hi) {
  const __m512i x = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, p));
  *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4));
  return _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(15)));
}

inline __m512 half16(const uint16_t* p, __mmask16 live) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, p)); }

// q . k over a group = scale (q . codes) + min (sum of q over the group); qsum [n][groups] in w.pw
template <int HC>
void scores_int4_rows(const AttnQuery* a, const Int4Kv* k, const Scratch& w, int64_t h0) {
  const int64_t G = k->group, half = G / 2;
  const __m512 neg = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(a->scale);
  for (int64_t t0 = 0; t0 < a->t; t0 += 16) {
    const __mmask16 live = live16(t0, a->t), allow = allowed16(a->mask, t0, a->t);
    if (!allow) {
      for (int hc = 0; hc < HC; ++hc) _mm512_storeu_ps(w.s + (h0 + hc) * w.tp + t0, neg);
      continue;
    }
    __m512 sacc[HC];
    for (int hc = 0; hc < HC; ++hc) sacc[hc] = _mm512_setzero_ps();
    for (int64_t g = 0; g < k->groups; ++g) {
      __m512 gacc[HC];
      for (int hc = 0; hc < HC; ++hc) gacc[hc] = _mm512_setzero_ps();
      const uint8_t* base = k->data + g * k->group_stride + t0;
      const int64_t rows = a->d - g * G < half ? a->d - g * G : half;
      for (int64_t j = 0; j < rows; ++j) {
        __m512 hi;
        const __m512 lo = codes16(base + j * k->row_stride, live, &hi);
        for (int hc = 0; hc < HC; ++hc) {
          const float* q = a->q + (h0 + hc) * a->dp + g * G + j;
          gacc[hc] = _mm512_fmadd_ps(_mm512_set1_ps(q[0]), lo, gacc[hc]);
          gacc[hc] = _mm512_fmadd_ps(_mm512_set1_ps(q[half]), hi, gacc[hc]);
        }
      }
      const __m512 s = half16(k->scales + g * k->param_stride + t0, live);
      const __m512 mn = half16(k->mins + g * k->param_stride + t0, live);
      for (int hc = 0; hc < HC; ++hc) {
        const __m512 qs = _mm512_set1_ps(w.pw[(h0 + hc) * k->groups + g]);
        sacc[hc] = _mm512_fmadd_ps(s, gacc[hc], _mm512_fmadd_ps(mn, qs, sacc[hc]));
      }
    }
    for (int hc = 0; hc < HC; ++hc)
      _mm512_storeu_ps(w.s + (h0 + hc) * w.tp + t0, _mm512_mask_blend_ps(allow, neg, _mm512_mul_ps(sacc[hc], sc)));
  }
}

// o[d] += sum_t (p_t scale_t) code_t[d] + sum_t p_t min_t, one pair row (j) of a group at a time over all slots
template <int HC>
void pv_int4_rows(const AttnQuery* a, const Int4Kv* v, const Scratch& w, int64_t h0) {
  const int64_t G = v->group, half = G / 2, T = a->t;
  for (int64_t g = 0; g < v->groups; ++g) {
    float mterm[HC];
    for (int hc = 0; hc < HC; ++hc) {
      const float* p = w.s + (h0 + hc) * w.tp;
      float* pw = w.pw + hc * w.tp;
      __m512 macc = _mm512_setzero_ps();
      for (int64_t t0 = 0; t0 < T; t0 += 16) {
        const __mmask16 live = live16(t0, T);
        const __m512 pv = _mm512_maskz_loadu_ps(live, p + t0);
        _mm512_storeu_ps(pw + t0, _mm512_mul_ps(pv, half16(v->scales + g * v->param_stride + t0, live)));
        macc = _mm512_fmadd_ps(pv, half16(v->mins + g * v->param_stride + t0, live), macc);
      }
      mterm[hc] = _mm512_reduce_add_ps(macc);
    }
    const int64_t rows = a->d - g * G < half ? a->d - g * G : half;
    for (int64_t j = 0; j < rows; ++j) {
      const uint8_t* row = v->data + g * v->group_stride + j * v->row_stride;
      __m512 alo[HC], ahi[HC];
      for (int hc = 0; hc < HC; ++hc) alo[hc] = ahi[hc] = _mm512_setzero_ps();
      for (int64_t t0 = 0; t0 < T; t0 += 16) {
        __m512 hi;
        const __m512 lo = codes16(row + t0, live16(t0, T), &hi);
        for (int hc = 0; hc < HC; ++hc) {
          const __m512 pw = _mm512_loadu_ps(w.pw + hc * w.tp + t0);
          alo[hc] = _mm512_fmadd_ps(pw, lo, alo[hc]);
          ahi[hc] = _mm512_fmadd_ps(pw, hi, ahi[hc]);
        }
      }
      for (int hc = 0; hc < HC; ++hc) {
        float* o = a->o + (h0 + hc) * a->d + g * G;
        o[j] += _mm512_reduce_add_ps(alo[hc]);
        if (g * G + half + j < a->d) o[half + j] += _mm512_reduce_add_ps(ahi[hc]);
      }
    }
    const int64_t end = (g + 1) * G < a->d ? (g + 1) * G : a->d;
    for (int hc = 0; hc < HC; ++hc)
      for (int64_t i = g * G; i < end; ++i) a->o[(h0 + hc) * a->d + i] += mterm[hc];
  }
}

template <int HC>
void int4_rows(const AttnQuery* a, const Int4Kv* k, const Int4Kv* v, const Scratch& w, int64_t h0, int pass) {
  if (pass == 0) scores_int4_rows<HC>(a, k, w, h0);
  else pv_int4_rows<HC>(a, v, w, h0);
}

void int4_pass(const AttnQuery* a, const Int4Kv* k, const Int4Kv* v, const Scratch& w, int pass) {
  for (int64_t h = 0; h < a->n; h += 8) {
    switch (a->n - h < 8 ? a->n - h : 8) {
      case 1: int4_rows<1>(a, k, v, w, h, pass); break;
      case 2: int4_rows<2>(a, k, v, w, h, pass); break;
      case 3: int4_rows<3>(a, k, v, w, h, pass); break;
      case 4: int4_rows<4>(a, k, v, w, h, pass); break;
      case 5: int4_rows<5>(a, k, v, w, h, pass); break;
      case 6: int4_rows<6>(a, k, v, w, h, pass); break;
      case 7: int4_rows<7>(a, k, v, w, h, pass); break;
      default: int4_rows<8>(a, k, v, w, h, pass); break;
    }
  }
}

void decode_int4(const AttnQuery* a, const Int4Kv* k, const Int4Kv* v) {
  const Scratch w = carve(a);
  for (int64_t h = 0; h < a->n; ++h)  // q's sum over each group (zero past d)
    for (int64_t g = 0; g < k->groups; ++g) {
      float s = 0.0f;
      for (int64_t i = 0; i < k->group; ++i) s += a->q[h * a->dp + g * k->group + i];
      w.pw[h * k->groups + g] = s;
    }
  int4_pass(a, k, v, w, 0);
  softmax(a, w, false);
  int4_pass(a, k, v, w, 1);
}

}  // namespace

void avx512_decode_int4(const AttnQuery* a, const Int4Kv* k, const Int4Kv* v) { decode_int4(a, k, v); }

}  // namespace flexbatch
