// Decode attention on AVX2 + FMA: scores of 8 slots at a time (one accumulator per slot, summed across lanes by
// one transposing reduction), bf16 caches widened to float32 as they are read, the 4-bit cache vectorized over
// slots, as it is stored (slots innermost).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn.h"

namespace flexbatch {
namespace {

struct Scratch {
  float* s;     // [n][tp] scores, then probabilities
  float* pw;    // [n][tp] 4-bit: probabilities times the slots' scales (and q's group sums in the first pass)
  float* zero;  // [dp] zeros: the row read in place of a slot past the end
  int64_t tp;
};

Scratch carve(const AttnQuery* a) {
  Scratch w;
  w.tp = attn_padded_slots(a->t);
  char* p = static_cast<char*>(a->scratch);
  w.s = reinterpret_cast<float*>(p);
  w.pw = w.s + a->n * w.tp;
  w.zero = w.pw + a->n * w.tp;
  memset(w.zero, 0, 4 * a->dp);
  return w;
}

inline bool allowed(const uint8_t* mask, int64_t t) { return !mask || mask[t]; }

// e^x, relative error ~1e-7 (Cephes' polynomial); 0 below -87.3 (and for -inf).
inline __m256 exp_ps(__m256 x) {
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

inline float hsum(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// r[j] = sum of the lanes of a[j], j < 8
inline __m256 reduce8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

template <bool BF16>
inline __m256 load8(const void* p, int64_t i) {
  if (!BF16) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <bool BF16>
inline const void* row(const PlainKv* kv, const void* base, int64_t stride, int64_t t) {
  return static_cast<const char*>(base) + t * stride * (BF16 ? 2 : 4);
}

// ---- plain caches ----

template <bool BF16>
void scores_plain(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  const __m256 sc = _mm256_set1_ps(a->scale);
  for (int64_t t0 = 0; t0 < a->t; t0 += 8) {
    const void* rows[8];
    bool any = false;
    for (int j = 0; j < 8; ++j) {
      const bool live = t0 + j < a->t;
      rows[j] = live ? row<BF16>(kv, kv->k, kv->k_stride, t0 + j) : w.zero;
      any |= live && allowed(a->mask, t0 + j);
    }
    for (int64_t h = 0; h < a->n; ++h) {
      float* out = w.s + h * w.tp + t0;
      if (!any) {
        _mm256_storeu_ps(out, _mm256_set1_ps(-INFINITY));
        continue;
      }
      const float* q = a->q + h * a->dp;
      __m256 acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t c = 0; c < a->d; c += 8) {
        const __m256 qc = _mm256_loadu_ps(q + c);
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qc, load8<BF16>(rows[j], c), acc[j]);
      }
      _mm256_storeu_ps(out, _mm256_mul_ps(reduce8(acc), sc));
      for (int j = 0; j < 8; ++j)
        if (!(t0 + j < a->t && allowed(a->mask, t0 + j))) out[j] = -INFINITY;
    }
  }
}

// Scores -> probabilities relative to the new running max (zero past t), the state rescaled to it.
void softmax(const AttnQuery* a, const Scratch& w) {
  const int64_t T = a->t;
  for (int64_t h = 0; h < a->n; ++h) {
    float* s = w.s + h * w.tp;
    float mx = -INFINITY;
    for (int64_t t = 0; t < T; ++t) mx = fmaxf(mx, s[t]);
    const float m_new = fmaxf(a->m[h], mx);
    float alpha = 1.0f, sum = 0.0f;
    if (m_new == -INFINITY) {
      memset(s, 0, 4 * w.tp);
    } else {
      alpha = expf(a->m[h] - m_new);
      const __m256 mv = _mm256_set1_ps(m_new);
      __m256 acc = _mm256_setzero_ps();
      for (int64_t t0 = 0; t0 < w.tp; t0 += 8) {
        __m256 p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + t0), mv));
        if (t0 + 8 > T) {
          const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)t0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
          p = _mm256_and_ps(p, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)T), idx)));
        }
        _mm256_storeu_ps(s + t0, p);
        acc = _mm256_add_ps(acc, p);
      }
      sum = hsum(acc);
    }
    a->m[h] = m_new;
    a->l[h] = a->l[h] * alpha + sum;
    for (int64_t i = 0; i < a->d; ++i) a->o[h * a->d + i] *= alpha;
  }
}

// o[h] += sum_t p[h][t] v_t, the outputs in memory (one row of values is read once for every query row)
template <bool BF16>
void pv_plain(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  for (int64_t t = 0; t < a->t; ++t) {
    bool any = false;
    for (int64_t h = 0; h < a->n; ++h) any |= w.s[h * w.tp + t] != 0.0f;
    if (!any) continue;  // masked for every row: the slot's values are not read
    const void* vr = row<BF16>(kv, kv->v, kv->v_stride, t);
    for (int64_t c = 0; c < a->d; c += 8) {
      const __m256 v = load8<BF16>(vr, c);
      for (int64_t h = 0; h < a->n; ++h) {
        float* o = a->o + h * a->d + c;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_set1_ps(w.s[h * w.tp + t]), v, _mm256_loadu_ps(o)));
      }
    }
  }
}

void decode_plain(const AttnQuery* a, const PlainKv* kv) {
  const Scratch w = carve(a);
  if (kv->bf16) scores_plain<true>(a, kv, w);
  else scores_plain<false>(a, kv, w);
  softmax(a, w);
  if (kv->bf16) pv_plain<true>(a, kv, w);
  else pv_plain<false>(a, kv, w);
}

// ---- the 4-bit cache, vectorized over 8 slots ----

inline __m256 codes8(const uint8_t* p, int64_t live, __m256* hi) {
  int64_t bits = 0;
  memcpy(&bits, p, live < 8 ? live : 8);
  const __m256i x = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bits));
  *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4));
  return _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(15)));
}

inline __m256 half8(const uint16_t* p, int64_t live) {
  uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  memcpy(h, p, 2 * (live < 8 ? live : 8));
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

template <int HC>
void scores_int4_rows(const AttnQuery* a, const Int4Kv* k, const Scratch& w, int64_t h0) {
  const int64_t G = k->group, half = G / 2;
  for (int64_t t0 = 0; t0 < a->t; t0 += 8) {
    const int64_t live = a->t - t0;
    __m256 sacc[HC];
    for (int hc = 0; hc < HC; ++hc) sacc[hc] = _mm256_setzero_ps();
    for (int64_t g = 0; g < k->groups; ++g) {
      __m256 gacc[HC];
      for (int hc = 0; hc < HC; ++hc) gacc[hc] = _mm256_setzero_ps();
      const uint8_t* base = k->data + g * k->group_stride + t0;
      const int64_t rows = a->d - g * G < half ? a->d - g * G : half;
      for (int64_t j = 0; j < rows; ++j) {
        __m256 hi;
        const __m256 lo = codes8(base + j * k->row_stride, live, &hi);
        for (int hc = 0; hc < HC; ++hc) {
          const float* q = a->q + (h0 + hc) * a->dp + g * G + j;
          gacc[hc] = _mm256_fmadd_ps(_mm256_set1_ps(q[0]), lo, gacc[hc]);
          gacc[hc] = _mm256_fmadd_ps(_mm256_set1_ps(q[half]), hi, gacc[hc]);
        }
      }
      const __m256 s = half8(k->scales + g * k->param_stride + t0, live);
      const __m256 mn = half8(k->mins + g * k->param_stride + t0, live);
      for (int hc = 0; hc < HC; ++hc) {
        const __m256 qs = _mm256_set1_ps(w.pw[(h0 + hc) * k->groups + g]);
        sacc[hc] = _mm256_fmadd_ps(s, gacc[hc], _mm256_fmadd_ps(mn, qs, sacc[hc]));
      }
    }
    for (int hc = 0; hc < HC; ++hc) {
      float* out = w.s + (h0 + hc) * w.tp + t0;
      _mm256_storeu_ps(out, _mm256_mul_ps(sacc[hc], _mm256_set1_ps(a->scale)));
      for (int j = 0; j < 8; ++j)
        if (!(t0 + j < a->t && allowed(a->mask, t0 + j))) out[j] = -INFINITY;
    }
  }
}

template <int HC>
void pv_int4_rows(const AttnQuery* a, const Int4Kv* v, const Scratch& w, int64_t h0) {
  const int64_t G = v->group, half = G / 2, T = a->t;
  for (int64_t g = 0; g < v->groups; ++g) {
    float mterm[HC];
    for (int hc = 0; hc < HC; ++hc) {
      const float* p = w.s + (h0 + hc) * w.tp;
      float* pw = w.pw + hc * w.tp;
      __m256 macc = _mm256_setzero_ps();
      for (int64_t t0 = 0; t0 < T; t0 += 8) {
        const __m256 pv = _mm256_loadu_ps(p + t0);  // zero past T
        _mm256_storeu_ps(pw + t0, _mm256_mul_ps(pv, half8(v->scales + g * v->param_stride + t0, T - t0)));
        macc = _mm256_fmadd_ps(pv, half8(v->mins + g * v->param_stride + t0, T - t0), macc);
      }
      mterm[hc] = hsum(macc);
    }
    const int64_t rows = a->d - g * G < half ? a->d - g * G : half;
    for (int64_t j = 0; j < rows; ++j) {
      const uint8_t* r = v->data + g * v->group_stride + j * v->row_stride;
      __m256 alo[HC], ahi[HC];
      for (int hc = 0; hc < HC; ++hc) alo[hc] = ahi[hc] = _mm256_setzero_ps();
      for (int64_t t0 = 0; t0 < T; t0 += 8) {
        __m256 hi;
        const __m256 lo = codes8(r + t0, T - t0, &hi);
        for (int hc = 0; hc < HC; ++hc) {
          const __m256 pw = _mm256_loadu_ps(w.pw + hc * w.tp + t0);
          alo[hc] = _mm256_fmadd_ps(pw, lo, alo[hc]);
          ahi[hc] = _mm256_fmadd_ps(pw, hi, ahi[hc]);
        }
      }
      for (int hc = 0; hc < HC; ++hc) {
        float* o = a->o + (h0 + hc) * a->d + g * G;
        o[j] += hsum(alo[hc]);
        if (g * G + half + j < a->d) o[half + j] += hsum(ahi[hc]);
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
  for (int64_t h = 0; h < a->n; h += 4) {
    switch (a->n - h < 4 ? a->n - h : 4) {
      case 1: int4_rows<1>(a, k, v, w, h, pass); break;
      case 2: int4_rows<2>(a, k, v, w, h, pass); break;
      case 3: int4_rows<3>(a, k, v, w, h, pass); break;
      default: int4_rows<4>(a, k, v, w, h, pass); break;
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
  softmax(a, w);
  int4_pass(a, k, v, w, 1);
}

const AttnKernels table = {"avx2", decode_plain, decode_int4, nullptr};

}  // namespace

const AttnKernels* avx2_attn() { return &table; }

}  // namespace flexbatch
