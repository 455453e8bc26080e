// Decode attention's two passes over the 4-bit cache, written once over lanes of slots: attn_avx2.cpp runs them
// over 8 slots at a time (Slots8), attn_int4_avx512.cpp over 16 (Slots16). Vectorized over slots as the cache
// stores them (slots innermost): q . k = scale (q . codes) + min (q's group sum) per group, and p . v one pair row
// of a group at a time over all slots, p weighted by each slot's scale. For files compiled for one instruction set;
// in an anonymous namespace, so that each instance stays in its own object file.
//
// V gives besides the vector operations of lanes.h: ROWS, the query rows whose accumulators stay in registers;
// live(t0, t), which of slots [t0, t0 + W) exist, and allowed(mask, t0, t), which of those may be attended (zero:
// none); load(p, live), W floats (zero past t); codes(p, live, &hi), the low (returned) and high nibbles of W code
// bytes as float32; half(p, live), W float16 as float32; store_scores(out, s, allowed), s with -inf where not
// allowed. The scratch w has the scores, then probabilities, s [n][tp] and float32 rows pw [n][tp].
#pragma once
#include <math.h>
#include <stdint.h>

#include "attn.h"

namespace flexbatch {
namespace {

// q . k over a group = scale (q . codes) + min (sum of q over the group); qsum [n][groups] in w.pw
template <class V, int HC, class Scratch>
void scores_int4_rows(const AttnQuery* a, const Int4Kv* k, const Scratch& w, int64_t h0) {
  using F = typename V::F;
  const int64_t G = k->group, half = G / 2;
  const F sc = V::set1(a->scale);
  for (int64_t t0 = 0; t0 < a->t; t0 += V::W) {
    const auto live = V::live(t0, a->t), allow = V::allowed(a->mask, t0, a->t);
    if (!allow) {
      for (int hc = 0; hc < HC; ++hc) V::store(w.s + (h0 + hc) * w.tp + t0, V::set1(-INFINITY));
      continue;
    }
    F sacc[HC];
    for (int hc = 0; hc < HC; ++hc) sacc[hc] = V::zero();
    for (int64_t g = 0; g < k->groups; ++g) {
      F gacc[HC];
      for (int hc = 0; hc < HC; ++hc) gacc[hc] = V::zero();
      const uint8_t* base = k->data + g * k->group_stride + t0;
      const int64_t rows = a->d - g * G < half ? a->d - g * G : half;
      for (int64_t j = 0; j < rows; ++j) {
        F hi;
        const F lo = V::codes(base + j * k->row_stride, live, &hi);
        for (int hc = 0; hc < HC; ++hc) {
          const float* q = a->q + (h0 + hc) * a->dp + g * G + j;
          gacc[hc] = V::fmadd(V::set1(q[0]), lo, gacc[hc]);
          gacc[hc] = V::fmadd(V::set1(q[half]), hi, gacc[hc]);
        }
      }
      const F s = V::half(k->scales + g * k->param_stride + t0, live);
      const F mn = V::half(k->mins + g * k->param_stride + t0, live);
      for (int hc = 0; hc < HC; ++hc) {
        const F qs = V::set1(w.pw[(h0 + hc) * k->groups + g]);
        sacc[hc] = V::fmadd(s, gacc[hc], V::fmadd(mn, qs, sacc[hc]));
      }
    }
    for (int hc = 0; hc < HC; ++hc) V::store_scores(w.s + (h0 + hc) * w.tp + t0, V::mul(sacc[hc], sc), allow);
  }
}

// o[d] += sum_t (p_t scale_t) code_t[d] + sum_t p_t min_t, one pair row (j) of a group at a time over all slots
template <class V, int HC, class Scratch>
void pv_int4_rows(const AttnQuery* a, const Int4Kv* v, const Scratch& w, int64_t h0) {
  using F = typename V::F;
  const int64_t G = v->group, half = G / 2, T = a->t;
  for (int64_t g = 0; g < v->groups; ++g) {
    float mterm[HC];
    for (int hc = 0; hc < HC; ++hc) {
      const float* p = w.s + (h0 + hc) * w.tp;
      float* pw = w.pw + hc * w.tp;
      F macc = V::zero();
      for (int64_t t0 = 0; t0 < T; t0 += V::W) {
        const auto live = V::live(t0, T);
        const F pv = V::load(p + t0, live);
        V::store(pw + t0, V::mul(pv, V::half(v->scales + g * v->param_stride + t0, live)));
        macc = V::fmadd(pv, V::half(v->mins + g * v->param_stride + t0, live), macc);
      }
      mterm[hc] = V::sum(macc);
    }
    const int64_t rows = a->d - g * G < half ? a->d - g * G : half;
    for (int64_t j = 0; j < rows; ++j) {
      const uint8_t* row = v->data + g * v->group_stride + j * v->row_stride;
      F alo[HC], ahi[HC];
      for (int hc = 0; hc < HC; ++hc) alo[hc] = ahi[hc] = V::zero();
      for (int64_t t0 = 0; t0 < T; t0 += V::W) {
        F hi;
        const F lo = V::codes(row + t0, V::live(t0, T), &hi);
        for (int hc = 0; hc < HC; ++hc) {
          const F pw = V::loadu(w.pw + hc * w.tp + t0);
          alo[hc] = V::fmadd(pw, lo, alo[hc]);
          ahi[hc] = V::fmadd(pw, hi, ahi[hc]);
        }
      }
      for (int hc = 0; hc < HC; ++hc) {
        float* o = a->o + (h0 + hc) * a->d + g * G;
        o[j] += V::sum(alo[hc]);
        if (g * G + half + j < a->d) o[half + j] += V::sum(ahi[hc]);
      }
    }
    const int64_t end = (g + 1) * G < a->d ? (g + 1) * G : a->d;
    for (int hc = 0; hc < HC; ++hc)
      for (int64_t i = g * G; i < end; ++i) a->o[(h0 + hc) * a->d + i] += mterm[hc];
  }
}

// Pass 0 (scores over kv = K) or 1 (p . v over kv = V) for query rows [h0, h0 + min(rows, HC)): each row count
// its own instance, its accumulators in registers.
template <class V, int HC, class Scratch>
void int4_rows(int64_t rows, int pass, const AttnQuery* a, const Int4Kv* kv, const Scratch& w, int64_t h0) {
  if constexpr (HC > 1) {
    if (rows < HC) return int4_rows<V, HC - 1>(rows, pass, a, kv, w, h0);
  }
  if (pass == 0) scores_int4_rows<V, HC>(a, kv, w, h0);
  else pv_int4_rows<V, HC>(a, kv, w, h0);
}

// Pass 1: q's sum over each group (zero past d) into w.pw, then the scaled scores of every slot into w.s.
template <class V, class Scratch>
void int4_scores(const AttnQuery* a, const Int4Kv* k, const Scratch& w) {
  for (int64_t h = 0; h < a->n; ++h)
    for (int64_t g = 0; g < k->groups; ++g) {
      float s = 0.0f;
      for (int64_t i = 0; i < k->group; ++i) s += a->q[h * a->dp + g * k->group + i];
      w.pw[h * k->groups + g] = s;
    }
  for (int64_t h = 0; h < a->n; h += V::ROWS) int4_rows<V, V::ROWS>(a->n - h, 0, a, k, w, h);
}

// Pass 2: the probabilities in w.s (zero past t) times the values, added to a->o.
template <class V, class Scratch>
void int4_values(const AttnQuery* a, const Int4Kv* v, const Scratch& w) {
  for (int64_t h = 0; h < a->n; h += V::ROWS) int4_rows<V, V::ROWS>(a->n - h, 1, a, v, w, h);
}

}  // namespace
}  // namespace flexbatch
