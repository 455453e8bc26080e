// Decode attention on AVX-512: scores of 16 slots at a time (one accumulator per slot, summed across lanes by one
// transposing reduction), bf16 caches through AVX512-BF16 (vdpbf16ps: pairs of bf16 products summed into float32
// lanes) for q . k and for p . v (two slots' values interleaved), float32 caches through FMA; the 4-bit cache
// vectorized over slots, as it is stored (slots innermost).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn.h"

namespace flexbatch {
namespace {

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

Scratch carve(const AttnQuery* a) {
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

inline __mmask16 live16(int64_t t0, int64_t t) {
  return t0 >= t ? 0 : t - t0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (t - t0)) - 1);
}

// Which of slots [t0, t0 + 16) exist and may be attended to.
inline __mmask16 allowed16(const uint8_t* mask, int64_t t0, int64_t t) {
  const __mmask16 live = live16(t0, t);
  if (!mask) return live;
  const __m128i m = _mm_maskz_loadu_epi8(live, mask + t0);
  return _mm_test_epi8_mask(m, m) & live;
}

// e^x, relative error ~1e-7 (Cephes' polynomial); 0 for x <= -150 (and -inf).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-150.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// acc + a . b over pairs of bf16 (vdpbf16ps). Written as asm: GCC 12 stores an accumulator array updated by the
// intrinsic back to the stack at every step instead of keeping it in registers.
inline __m512 dot_bf16(__m512 acc, __m512i a, __m512i b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

inline __m512 bf16_to_f32(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// r[j] = sum of the lanes of a[j], j < 16: four halving steps of shuffles and adds, then one permutation.
inline __m512 reduce16(const __m512* a) {
  __m512 x[8], y[4], z[2];
  for (int j = 0; j < 8; ++j)
    x[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[j], a[j + 8], 0x44), _mm512_shuffle_f32x4(a[j], a[j + 8], 0xEE));
  for (int j = 0; j < 4; ++j)
    y[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x[j], x[j + 4], 0x88), _mm512_shuffle_f32x4(x[j], x[j + 4], 0xDD));
  for (int j = 0; j < 2; ++j)
    z[j] = _mm512_add_ps(_mm512_shuffle_ps(y[j], y[j + 2], 0x44), _mm512_shuffle_ps(y[j], y[j + 2], 0xEE));
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xDD));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15), r);
}

// ---- plain caches: pass 1, scores ----

// Scores of 8 slots for query rows h and h + 1 (r: lanes 0-7 and 8-15), scaled, -inf where not allowed (allow8).
inline void store_pair(const Scratch& w, int64_t h, int64_t t0, __m512 r, __m512 sc, unsigned allow8) {
  r = _mm512_mask_blend_ps((__mmask16)(allow8 | allow8 << 8), _mm512_set1_ps(-INFINITY), _mm512_mul_ps(r, sc));
  _mm256_storeu_ps(w.s + h * w.tp + t0, _mm512_castps512_ps256(r));
  _mm256_storeu_ps(w.s + (h + 1) * w.tp + t0, _mm512_extractf32x8_ps(r, 1));
}

template <int NC>  // NC = d / 16
void scores_f32(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  const float* K = static_cast<const float*>(kv->k);
  const __m512 neg = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(a->scale);
  for (int64_t t0 = 0; t0 < a->t; t0 += 16) {
    const __mmask16 allow = allowed16(a->mask, t0, a->t);
    const float* rows[16];
    for (int j = 0; j < 16; ++j) rows[j] = t0 + j < a->t ? K + (t0 + j) * kv->k_stride : w.zero;
    int64_t h = 0;
    for (; h + 2 <= a->n && allow; h += 2)  // two query rows share each load of a key
      for (int half = 0; half < 16; half += 8) {
        __m512 acc[16];
        for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
        for (int c = 0; c < NC; ++c) {
          const __m512 q0 = _mm512_loadu_ps(a->q + h * a->dp + 16 * c);
          const __m512 q1 = _mm512_loadu_ps(a->q + (h + 1) * a->dp + 16 * c);
          for (int j = 0; j < 8; ++j) {
            const __m512 k = _mm512_loadu_ps(rows[half + j] + 16 * c);
            acc[j] = _mm512_fmadd_ps(q0, k, acc[j]);
            acc[8 + j] = _mm512_fmadd_ps(q1, k, acc[8 + j]);
          }
        }
        store_pair(w, h, t0 + half, reduce16(acc), sc, (allow >> half) & 0xFF);
      }
    for (; h < a->n; ++h) {
      float* out = w.s + h * w.tp + t0;
      if (!allow) {
        _mm512_storeu_ps(out, neg);
        continue;
      }
      const float* q = a->q + h * a->dp;
      __m512 acc[16];
      for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
      for (int c = 0; c < NC; ++c) {
        const __m512 qc = _mm512_loadu_ps(q + 16 * c);
        for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(rows[j] + 16 * c), acc[j]);
      }
      _mm512_storeu_ps(out, _mm512_mask_blend_ps(allow, neg, _mm512_mul_ps(reduce16(acc), sc)));
    }
  }
}

// q in bf16 (and, for float32 queries, its bf16 remainder: q ~ qh + ql to 2^-16)
void split_q(const AttnQuery* a, const Scratch& w) {
  for (int64_t i = 0; i < a->n * a->dp; i += 16) {
    const __m512 x = _mm512_loadu_ps(a->q + i);
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.qh + i), h);
    const __m256i l = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(x, bf16_to_f32(h)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.ql + i), l);
  }
}

inline __mmask32 chunk_mask(int c, int nb, int64_t d) {
  return c < nb - 1 || d % 32 == 0 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (d % 32)) - 1);
}

template <int NB, bool LO>  // NB = d / 32 rounded up
void scores_bf16(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  const uint16_t* K = static_cast<const uint16_t*>(kv->k);
  const __m512 neg = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(a->scale);
  for (int64_t t0 = 0; t0 < a->t; t0 += 16) {
    const __mmask16 allow = allowed16(a->mask, t0, a->t);
    const uint16_t* rows[16];
    for (int j = 0; j < 16; ++j)
      rows[j] = t0 + j < a->t ? K + (t0 + j) * kv->k_stride : reinterpret_cast<const uint16_t*>(w.zero);
    int64_t h = 0;
    for (; h + 2 <= a->n && allow; h += 2)  // two query rows share each load of a key
      for (int half = 0; half < 16; half += 8) {
        __m512 acc[16];
        for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
        for (int c = 0; c < NB; ++c) {
          const __mmask32 m = chunk_mask(c, NB, a->d);
          const __m512i q0 = _mm512_loadu_si512(w.qh + h * a->dp + 32 * c);
          const __m512i q1 = _mm512_loadu_si512(w.qh + (h + 1) * a->dp + 32 * c);
          for (int j = 0; j < 8; ++j) {
            const __m512i k = _mm512_maskz_loadu_epi16(m, rows[half + j] + 32 * c);
            acc[j] = dot_bf16(acc[j], q0, k);
            acc[8 + j] = dot_bf16(acc[8 + j], q1, k);
            if constexpr (LO) {
              acc[j] = dot_bf16(acc[j], _mm512_loadu_si512(w.ql + h * a->dp + 32 * c), k);
              acc[8 + j] = dot_bf16(acc[8 + j], _mm512_loadu_si512(w.ql + (h + 1) * a->dp + 32 * c), k);
            }
          }
        }
        store_pair(w, h, t0 + half, reduce16(acc), sc, (allow >> half) & 0xFF);
      }
    for (; h < a->n; ++h) {
      float* out = w.s + h * w.tp + t0;
      if (!allow) {
        _mm512_storeu_ps(out, neg);
        continue;
      }
      __m512 acc[16];
      for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
      for (int c = 0; c < NB; ++c) {
        const __mmask32 m = chunk_mask(c, NB, a->d);
        const __m512i qh = _mm512_loadu_si512(w.qh + h * a->dp + 32 * c);
        const __m512i ql = _mm512_loadu_si512(w.ql + h * a->dp + 32 * c);
        for (int j = 0; j < 16; ++j) {
          const __m512i k = _mm512_maskz_loadu_epi16(m, rows[j] + 32 * c);
          acc[j] = dot_bf16(acc[j], qh, k);
          if constexpr (LO) acc[j] = dot_bf16(acc[j], ql, k);
        }
      }
      _mm512_storeu_ps(out, _mm512_mask_blend_ps(allow, neg, _mm512_mul_ps(reduce16(acc), sc)));
    }
  }
}

// ---- the online-softmax step between the passes ----

// Scores -> probabilities relative to the new running max (zero past t), the state rescaled to it; in bf16
// halves too where the values are bf16.
void softmax(const AttnQuery* a, const Scratch& w, bool bf16) {
  const int64_t T = a->t;
  for (int64_t h = 0; h < a->n; ++h) {
    float* s = w.s + h * w.tp;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t t0 = 0; t0 < T; t0 += 16) mx = _mm512_mask_max_ps(mx, live16(t0, T), mx, _mm512_loadu_ps(s + t0));
    const float m_new = fmaxf(a->m[h], _mm512_reduce_max_ps(mx));
    float alpha = 1.0f, sum = 0.0f;
    if (m_new == -INFINITY) {
      memset(s, 0, 4 * w.tp);
    } else {
      alpha = expf(a->m[h] - m_new);
      const __m512 mv = _mm512_set1_ps(m_new);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t t0 = 0; t0 < w.tp; t0 += 16) {
        const __m512 p = _mm512_maskz_mov_ps(live16(t0, T), exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t0), mv)));
        _mm512_storeu_ps(s + t0, p);
        acc = _mm512_add_ps(acc, p);
      }
      sum = _mm512_reduce_add_ps(acc);
    }
    a->m[h] = m_new;
    a->l[h] = a->l[h] * alpha + sum;
    float* o = a->o + h * a->d;
    for (int64_t i = 0; i < a->d; i += 16) _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(o + i), _mm512_set1_ps(alpha)));
    if (!bf16) continue;
    for (int64_t t0 = 0; t0 < w.tp; t0 += 16) {
      const __m512 p = _mm512_loadu_ps(s + t0);
      const __m256i ph = (__m256i)_mm512_cvtneps_pbh(p);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.ph + h * w.tp + t0), ph);
      const __m256i pl = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(p, bf16_to_f32(ph)));
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

// ---- plain caches: pass 2, p . V for HB query rows at a time (their accumulators in registers) ----

template <int NC, int HB>
void pv_f32_rows(const AttnQuery* a, const PlainKv* kv, const Scratch& w, int64_t h0) {
  const float* V = static_cast<const float*>(kv->v);
  __m512 acc[HB][NC];
  const float* p[HB];
  for (int hb = 0; hb < HB; ++hb) {
    p[hb] = w.s + (h0 + hb) * w.tp;
    for (int c = 0; c < NC; ++c) acc[hb][c] = _mm512_setzero_ps();
  }
  const int64_t T = a->t, stride = kv->v_stride;
  for (int64_t t0 = 0; t0 < T; t0 += 16) {
    if (!any16<HB>(w, h0, t0)) continue;  // masked for every row: the slots' values are not read
    const int64_t t1 = t0 + 16 < T ? t0 + 16 : T;
    // (no branch inside: a conditional step keeps GCC from holding the accumulators in registers)
    for (int64_t t = t0; t < t1; ++t) {
      const float* vr = V + t * stride;
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        const __m512 v = _mm512_loadu_ps(vr + 16 * c);
#pragma GCC unroll 8
        for (int hb = 0; hb < HB; ++hb) acc[hb][c] = _mm512_fmadd_ps(_mm512_set1_ps(p[hb][t]), v, acc[hb][c]);
      }
    }
  }
  for (int hb = 0; hb < HB; ++hb)
    for (int c = 0; c < NC; ++c) {
      float* o = a->o + (h0 + hb) * a->d + 16 * c;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[hb][c]));
    }
}

// Two slots at a time: their values interleaved (unpack lo/hi) so that one vdpbf16ps adds p0 v0[i] + p1 v1[i];
// lane i of the lo accumulator holds d = 8 (i / 4) + i % 4 of its 32-wide chunk, of the hi one 4 more.
template <int NB, int HB, bool LO>
void pv_bf16_rows(const AttnQuery* a, const PlainKv* kv, const Scratch& w, int64_t h0) {
  const uint16_t* V = static_cast<const uint16_t*>(kv->v);
  const uint16_t* zero = reinterpret_cast<const uint16_t*>(w.zero);
  const __mmask32 last = chunk_mask(NB - 1, NB, a->d);
  const uint16_t *ph[HB], *pl[HB];
  __m512 acc[HB * 2 * NB];
#pragma GCC unroll 8
  for (int hb = 0; hb < HB; ++hb) {
    ph[hb] = w.ph + (h0 + hb) * w.tp;
    pl[hb] = w.pl + (h0 + hb) * w.tp;
#pragma GCC unroll 16
    for (int c = 0; c < 2 * NB; ++c) acc[hb * 2 * NB + c] = _mm512_setzero_ps();
  }
  const int64_t T = a->t, stride = kv->v_stride;
  for (int64_t t0 = 0; t0 < T; t0 += 16) {
    if (!any16<HB>(w, h0, t0)) continue;  // masked for every row: the slots' values are not read
    const int64_t t1 = t0 + 16 < T ? t0 + 16 : T;
    // (no branch inside: a conditional step keeps GCC from holding the accumulators in registers)
    for (int64_t t = t0; t < t1; t += 2) {
      __m512i hi[HB], lo[HB];
#pragma GCC unroll 8
      for (int hb = 0; hb < HB; ++hb) {
        hi[hb] = _mm512_broadcastd_epi32(_mm_loadu_si32(ph[hb] + t));
        if constexpr (LO) lo[hb] = _mm512_broadcastd_epi32(_mm_loadu_si32(pl[hb] + t));
      }
      const uint16_t* v0 = V + t * stride;
      const uint16_t* v1 = t + 1 < T ? v0 + stride : zero;
#pragma GCC unroll 8
      for (int c = 0; c < NB; ++c) {
        const __mmask32 m = c == NB - 1 ? last : (__mmask32)0xFFFFFFFFu;
        const __m512i x0 = _mm512_maskz_loadu_epi16(m, v0 + 32 * c), x1 = _mm512_maskz_loadu_epi16(m, v1 + 32 * c);
        const __m512i ulo = _mm512_unpacklo_epi16(x0, x1), uhi = _mm512_unpackhi_epi16(x0, x1);
#pragma GCC unroll 8
        for (int hb = 0; hb < HB; ++hb) {
          acc[hb * 2 * NB + 2 * c] = dot_bf16(acc[hb * 2 * NB + 2 * c], ulo, hi[hb]);
          acc[hb * 2 * NB + 2 * c + 1] = dot_bf16(acc[hb * 2 * NB + 2 * c + 1], uhi, hi[hb]);
          if constexpr (LO) {
            acc[hb * 2 * NB + 2 * c] = dot_bf16(acc[hb * 2 * NB + 2 * c], ulo, lo[hb]);
            acc[hb * 2 * NB + 2 * c + 1] = dot_bf16(acc[hb * 2 * NB + 2 * c + 1], uhi, lo[hb]);
          }
        }
      }
    }
  }
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int hb = 0; hb < HB; ++hb)
    for (int c = 0; c < NB; ++c) {
      float* o = a->o + (h0 + hb) * a->d + 32 * c;
      const __m512 y0 = _mm512_permutex2var_ps(acc[hb * 2 * NB + 2 * c], first, acc[hb * 2 * NB + 2 * c + 1]);
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), y0));
      if (32 * c + 32 <= a->d) {
        const __m512 y1 = _mm512_permutex2var_ps(acc[hb * 2 * NB + 2 * c], second, acc[hb * 2 * NB + 2 * c + 1]);
        _mm512_storeu_ps(o + 16, _mm512_add_ps(_mm512_loadu_ps(o + 16), y1));
      }
    }
}

template <int NC>
void decode_f32(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  constexpr int HB = NC <= 4 ? 4 : NC <= 8 ? 2 : 1;
  scores_f32<NC>(a, kv, w);
  softmax(a, w, false);
  int64_t h = 0;
  for (; h + HB <= a->n; h += HB) pv_f32_rows<NC, HB>(a, kv, w, h);
  for (; h < a->n; ++h) pv_f32_rows<NC, 1>(a, kv, w, h);
}

template <int NB, bool LO>
void decode_bf16(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  constexpr int HB = NB <= 2 ? 4 : NB <= 4 ? 2 : 1;
  split_q(a, w);
  scores_bf16<NB, LO>(a, kv, w);
  softmax(a, w, true);
  int64_t h = 0;
  for (; h + HB <= a->n; h += HB) pv_bf16_rows<NB, HB, LO>(a, kv, w, h);
  for (; h < a->n; ++h) pv_bf16_rows<NB, 1, LO>(a, kv, w, h);
}

#define F32_CASE(N) case N: decode_f32<N>(a, kv, w); break;
#define BF16_CASE(N)                                                  \
  case N:                                                             \
    if (a->precise) decode_bf16<N, true>(a, kv, w);                   \
    else decode_bf16<N, false>(a, kv, w);                             \
    break;

void decode_plain(const AttnQuery* a, const PlainKv* kv) {
  const Scratch w = carve(a);
  if (!kv->bf16) {
    switch (a->d / 16) {
      F32_CASE(1) F32_CASE(2) F32_CASE(3) F32_CASE(4) F32_CASE(5) F32_CASE(6) F32_CASE(7) F32_CASE(8)
      F32_CASE(9) F32_CASE(10) F32_CASE(11) F32_CASE(12) F32_CASE(13) F32_CASE(14) F32_CASE(15) F32_CASE(16)
      default: break;
    }
    return;
  }
  switch ((a->d + 31) / 32) {
    BF16_CASE(1) BF16_CASE(2) BF16_CASE(3) BF16_CASE(4) BF16_CASE(5) BF16_CASE(6) BF16_CASE(7) BF16_CASE(8)
    default: break;
  }
}

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

// ---- prefill: blocks of query rows against blocks of 64 keys, vdpbf16ps on operands packed in pairs ----

struct PrefillWork {
  uint32_t* kp;  // [tp / 64][d / 2][64]: for 64 keys, the pair (k[2p], k[2p + 1]) of each
  uint32_t* vp;  // [tp / 2][d]: for each d, the pair of two consecutive keys' values
  uint16_t* qb;  // [rows][d] the block's queries
  float* sc;     // [rows][64] scores
  uint16_t* pb;  // [rows][64] probabilities (bf16)
  float* ob;     // [rows][d] weighted values
  float* m;      // [rows] running max
  float* l;      // [rows] sum of exponentials
  int64_t rows, tp;
};

PrefillWork carve_prefill(const PrefillItem* it) {
  PrefillWork w;
  w.tp = (it->t + 63) / 64 * 64 + 64;
  w.rows = prefill_rows(it->g);
  char* p = static_cast<char*>(it->scratch);
  w.kp = reinterpret_cast<uint32_t*>(p); p += 2 * w.tp * it->d;
  w.vp = reinterpret_cast<uint32_t*>(p); p += 2 * w.tp * it->d;
  w.qb = reinterpret_cast<uint16_t*>(p); p += 2 * w.rows * it->d;
  w.sc = reinterpret_cast<float*>(p); p += 4 * w.rows * 64;
  w.pb = reinterpret_cast<uint16_t*>(p); p += 2 * w.rows * 64;
  w.ob = reinterpret_cast<float*>(p); p += 4 * w.rows * it->d;
  w.m = reinterpret_cast<float*>(p); p += 4 * w.rows;
  w.l = reinterpret_cast<float*>(p);
  return w;
}

// K and V of the item in the pair layouts vdpbf16ps takes (zero past t), once per item.
void pack_kv(const PrefillItem* it, const PrefillWork& w) {
  const int64_t T = it->t, D = it->d, half = D / 2, blocks = (T + 63) / 64;
  memset(w.kp, 0, 4 * blocks * 64 * half);
  for (int64_t n = 0; n < T; ++n) {
    const uint16_t* k = it->k + n * it->k_stride;
    uint32_t* dst = w.kp + (n / 64) * half * 64 + n % 64;
    for (int64_t p = 0; p < half; ++p) memcpy(dst + p * 64, k + 2 * p, 4);
  }
  for (int64_t i = 0; i < blocks * 32; ++i) {
    const uint16_t* v0 = it->v + 2 * i * it->v_stride;
    uint32_t* dst = w.vp + i * D;
    if (2 * i >= T) {
      memset(dst, 0, 4 * D);
      continue;
    }
    const bool two = 2 * i + 1 < T;
    for (int64_t c = 0; c < D; c += 16) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v0 + c));
      const __m256i b = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v0 + it->v_stride + c))
                            : _mm256_setzero_si256();
      const __m512i x = _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
      _mm512_storeu_si512(dst + c, x);
    }
  }
}

// Scores of rows [r0, r0 + 8) against keys [n0, n0 + 32) of key block kb, scaled, into w.sc.
void qk_8x32(const PrefillItem* it, const PrefillWork& w, int64_t kb, int64_t r0, int64_t n0) {
  const int64_t D = it->d, half = D / 2;
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  const uint32_t* kp = w.kp + kb * half * 64 + n0;
  const uint16_t* q = w.qb + r0 * D;
  for (int64_t p = 0; p < half; ++p) {
    const __m512i k0 = _mm512_loadu_si512(kp + p * 64), k1 = _mm512_loadu_si512(kp + p * 64 + 16);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      const __m512i qp = _mm512_broadcastd_epi32(_mm_loadu_si32(q + r * D + 2 * p));
      acc[2 * r] = dot_bf16(acc[2 * r], qp, k0);
      acc[2 * r + 1] = dot_bf16(acc[2 * r + 1], qp, k1);
    }
  }
  const __m512 sc = _mm512_set1_ps(it->scale);
  for (int r = 0; r < 8; ++r) {
    _mm512_storeu_ps(w.sc + (r0 + r) * 64 + n0, _mm512_mul_ps(acc[2 * r], sc));
    _mm512_storeu_ps(w.sc + (r0 + r) * 64 + n0 + 16, _mm512_mul_ps(acc[2 * r + 1], sc));
  }
}

// Which of the nk keys of block kb position i may see.
inline __mmask64 visible(const PrefillItem* it, int64_t i, int64_t kb, int64_t nk) {
  const __mmask64 live = nk >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << nk) - 1);
  if (i >= it->s) return 0;
  if (it->mask) {
    const __m512i m = _mm512_maskz_loadu_epi8(live, it->mask + i * it->mask_row + kb * 64);
    return _mm512_test_epi8_mask(m, m);
  }
  if (!it->causal) return live;
  const int64_t seen = i + it->t - it->s - kb * 64 + 1;
  return seen <= 0 ? 0 : seen >= nk ? live : (((__mmask64)1 << seen) - 1);
}

// One row's online-softmax step over block kb: probabilities (bf16) into w.pb, the state rescaled.
void softmax_row(const PrefillItem* it, const PrefillWork& w, int64_t r, int64_t i, int64_t kb, int64_t nk) {
  const __mmask64 vis = visible(it, i, kb, nk);
  float* s = w.sc + r * 64;
  const __m512 neg = _mm512_set1_ps(-INFINITY);
  __m512 x[4];
  __m512 mx = neg;
  for (int c = 0; c < 4; ++c) {
    x[c] = _mm512_mask_blend_ps((__mmask16)(vis >> (16 * c)), neg, _mm512_loadu_ps(s + 16 * c));
    mx = _mm512_max_ps(mx, x[c]);
  }
  const float m_new = fmaxf(w.m[r], _mm512_reduce_max_ps(mx));
  uint16_t* pb = w.pb + r * 64;
  if (m_new == -INFINITY) {
    memset(pb, 0, 128);
    return;
  }
  const float alpha = expf(w.m[r] - m_new);
  const __m512 mv = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int c = 0; c < 4; ++c) {
    const __m512 p = _mm512_maskz_mov_ps((__mmask16)(vis >> (16 * c)), exp_ps(_mm512_sub_ps(x[c], mv)));
    sum = _mm512_add_ps(sum, p);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + 16 * c), (__m256i)_mm512_cvtneps_pbh(p));
  }
  w.m[r] = m_new;
  w.l[r] = w.l[r] * alpha + _mm512_reduce_add_ps(sum);
  if (alpha != 1.0f) {
    float* o = w.ob + r * it->d;
    for (int64_t c = 0; c < it->d; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), _mm512_set1_ps(alpha)));
  }
}

// o[r][c0 .. c0 + 16 CV) += p . V over the key pairs of block kb, rows [r0, r0 + 4).
template <int CV>
void pv_4rows(const PrefillItem* it, const PrefillWork& w, int64_t kb, int64_t r0, int64_t c0, int64_t pairs) {
  const int64_t D = it->d;
  __m512 acc[4][CV];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < CV; ++c) acc[r][c] = _mm512_loadu_ps(w.ob + (r0 + r) * D + c0 + 16 * c);
  const uint32_t* vp = w.vp + kb * 32 * D + c0;
  const uint16_t* pb = w.pb + r0 * 64;
  for (int64_t i = 0; i < pairs; ++i) {
    __m512i pr[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) pr[r] = _mm512_broadcastd_epi32(_mm_loadu_si32(pb + r * 64 + 2 * i));
#pragma GCC unroll 4
    for (int c = 0; c < CV; ++c) {
      const __m512i v = _mm512_loadu_si512(vp + i * D + 16 * c);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) acc[r][c] = dot_bf16(acc[r][c], pr[r], v);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < CV; ++c) _mm512_storeu_ps(w.ob + (r0 + r) * D + c0 + 16 * c, acc[r][c]);
}

void pv_block(const PrefillItem* it, const PrefillWork& w, int64_t kb, int64_t nk) {
  const int64_t pairs = (nk + 1) / 2;
  for (int64_t r0 = 0; r0 < w.rows; r0 += 4)
    for (int64_t c0 = 0; c0 < it->d; c0 += 64) {
      switch ((it->d - c0) / 16 < 4 ? (it->d - c0) / 16 : 4) {
        case 1: pv_4rows<1>(it, w, kb, r0, c0, pairs); break;
        case 2: pv_4rows<2>(it, w, kb, r0, c0, pairs); break;
        case 3: pv_4rows<3>(it, w, kb, r0, c0, pairs); break;
        default: pv_4rows<4>(it, w, kb, r0, c0, pairs); break;
      }
    }
}

// The block's rows: row r is head r % g of position s0 + r / g (zero past s).
void load_queries(const PrefillItem* it, const PrefillWork& w, int64_t s0, int64_t positions) {
  const int64_t D = it->d;
  memset(w.qb, 0, 2 * w.rows * D);
  memset(w.ob, 0, 4 * w.rows * D);
  for (int64_t r = 0; r < w.rows; ++r) {
    w.m[r] = -INFINITY;
    w.l[r] = 0.0f;
  }
  for (int64_t i = s0; i < s0 + positions && i < it->s; ++i)
    for (int64_t j = 0; j < it->g; ++j) {
      const int64_t r = (i - s0) * it->g + j;
      memcpy(w.qb + r * D, it->q + j * it->q_head + i * it->q_pos, 2 * D);
      if (!it->m0) continue;
      w.m[r] = it->m0[j * it->s + i];
      w.l[r] = it->l0[j * it->s + i];
      memcpy(w.ob + r * D, it->o0 + (j * it->s + i) * D, 4 * D);
    }
}

void store_outputs(const PrefillItem* it, const PrefillWork& w, int64_t s0, int64_t positions) {
  for (int64_t i = s0; i < s0 + positions && i < it->s; ++i)
    for (int64_t j = 0; j < it->g; ++j) {
      const int64_t r = (i - s0) * it->g + j;
      const __m512 inv = _mm512_set1_ps(1.0f / w.l[r]);
      uint16_t* out = it->out + j * it->o_head + i * it->o_pos;
      for (int64_t c = 0; c < it->d; c += 16) {
        const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(w.ob + r * it->d + c), inv);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), (__m256i)_mm512_cvtneps_pbh(y));
      }
    }
}

void prefill_bf16(const PrefillItem* it) {
  const PrefillWork w = carve_prefill(it);
  pack_kv(it, w);
  const int64_t positions = it->g > 64 ? 1 : 64 / it->g, blocks = (it->t + 63) / 64;
  for (int64_t s0 = 0; s0 < it->s; s0 += positions) {
    load_queries(it, w, s0, positions);
    const int64_t last = (s0 + positions < it->s ? s0 + positions : it->s) - 1;
    int64_t nkb = blocks;
    if (!it->mask && it->causal) {  // blocks wholly above the diagonal are skipped
      const int64_t reach = (last + it->t - it->s) / 64 + 1;
      nkb = reach < nkb ? reach : nkb;
    }
    for (int64_t kb = 0; kb < nkb; ++kb) {
      const int64_t nk = it->t - kb * 64 < 64 ? it->t - kb * 64 : 64;
      for (int64_t r0 = 0; r0 < w.rows; r0 += 8)
        for (int64_t n0 = 0; n0 < nk; n0 += 32) qk_8x32(it, w, kb, r0, n0);
      for (int64_t r = 0; r < w.rows; ++r) softmax_row(it, w, r, s0 + r / it->g, kb, nk);
      pv_block(it, w, kb, nk);
    }
    store_outputs(it, w, s0, positions);
  }
}

const AttnKernels table = {"avx512", decode_plain, decode_int4, prefill_bf16};

}  // namespace

const AttnKernels* avx512_attn() { return &table; }

}  // namespace flexbatch
