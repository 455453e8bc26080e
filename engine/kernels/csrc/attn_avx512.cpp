// Decode attention on AVX-512: scores of 16 slots at a time (one accumulator per slot, summed across lanes by one
// transposing reduction), bf16 caches through AVX512-BF16 (vdpbf16ps: pairs of bf16 products summed into float32
// lanes) for q . k and for p . v (two slots' values interleaved), float32 caches through FMA; the 4-bit cache
// vectorized over slots, as it is stored (slots innermost).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn.h"
#include "attn_avx512.h"

namespace flexbatch {
namespace {

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

// Scores of every slot for every query row, 16 slots at a time: two query rows share each load of a key
// (Keys::pair), a last odd row goes alone (Keys::one); -inf where a slot may not be attended. Keys: the cache's
// element type T and its dot products into acc (the q . k of key j in lane sums of acc[j]; for a pair, of row h + 1
// in acc[8 + j]).
template <class Keys>
void scores_plain(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  using T = typename Keys::T;
  const T* K = static_cast<const T*>(kv->k);
  const __m512 neg = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(a->scale);
  for (int64_t t0 = 0; t0 < a->t; t0 += 16) {
    const __mmask16 allow = allowed16(a->mask, t0, a->t);
    const T* rows[16];
    for (int j = 0; j < 16; ++j)
      rows[j] = t0 + j < a->t ? K + (t0 + j) * kv->k_stride : reinterpret_cast<const T*>(w.zero);
    int64_t h = 0;
    for (; h + 2 <= a->n && allow; h += 2)
      for (int half = 0; half < 16; half += 8) {
        __m512 acc[16];
        for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
        Keys::pair(a, w, rows + half, h, acc);
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
      Keys::one(a, w, rows, h, acc);
      _mm512_storeu_ps(out, _mm512_mask_blend_ps(allow, neg, _mm512_mul_ps(reduce16(acc), sc)));
    }
  }
}

// Keys' dot products go inline into scores_plain, so that its accumulators stay in registers.
#define FLEXBATCH_ALWAYS_INLINE inline __attribute__((always_inline))

template <int NC>  // NC = d / 16
struct F32Keys {
  using T = float;
  static FLEXBATCH_ALWAYS_INLINE void pair(const AttnQuery* a, const Scratch&, const float* const* rows, int64_t h,
                                           __m512* acc) {
    for (int c = 0; c < NC; ++c) {
      const __m512 q0 = _mm512_loadu_ps(a->q + h * a->dp + 16 * c);
      const __m512 q1 = _mm512_loadu_ps(a->q + (h + 1) * a->dp + 16 * c);
      for (int j = 0; j < 8; ++j) {
        const __m512 k = _mm512_loadu_ps(rows[j] + 16 * c);
        acc[j] = _mm512_fmadd_ps(q0, k, acc[j]);
        acc[8 + j] = _mm512_fmadd_ps(q1, k, acc[8 + j]);
      }
    }
  }
  static FLEXBATCH_ALWAYS_INLINE void one(const AttnQuery* a, const Scratch&, const float* const* rows, int64_t h,
                                          __m512* acc) {
    const float* q = a->q + h * a->dp;
    for (int c = 0; c < NC; ++c) {
      const __m512 qc = _mm512_loadu_ps(q + 16 * c);
      for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(rows[j] + 16 * c), acc[j]);
    }
  }
};

// q in bf16 (and, for float32 queries, its bf16 remainder: q ~ qh + ql to 2^-16)
void split_q(const AttnQuery* a, const Scratch& w) {
  for (int64_t i = 0; i < a->n * a->dp; i += 16) {
    const __m512 x = _mm512_loadu_ps(a->q + i);
    const __m256i h = to_bf16(x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.qh + i), h);
    const __m256i l = to_bf16(_mm512_sub_ps(x, widen_bf16(h)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.ql + i), l);
  }
}

inline __mmask32 chunk_mask(int c, int nb, int64_t d) {
  return c < nb - 1 || d % 32 == 0 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (d % 32)) - 1);
}

// q (split_q's halves; LO: the remainder too) against bf16 keys by vdpbf16ps
template <int NB, bool LO>  // NB = d / 32 rounded up
struct Bf16Keys {
  using T = uint16_t;
  static FLEXBATCH_ALWAYS_INLINE void pair(const AttnQuery* a, const Scratch& w, const uint16_t* const* rows,
                                           int64_t h, __m512* acc) {
    for (int c = 0; c < NB; ++c) {
      const __mmask32 m = chunk_mask(c, NB, a->d);
      const __m512i q0 = _mm512_loadu_si512(w.qh + h * a->dp + 32 * c);
      const __m512i q1 = _mm512_loadu_si512(w.qh + (h + 1) * a->dp + 32 * c);
      for (int j = 0; j < 8; ++j) {
        const __m512i k = _mm512_maskz_loadu_epi16(m, rows[j] + 32 * c);
        acc[j] = dot_bf16(acc[j], q0, k);
        acc[8 + j] = dot_bf16(acc[8 + j], q1, k);
        if constexpr (LO) {
          acc[j] = dot_bf16(acc[j], _mm512_loadu_si512(w.ql + h * a->dp + 32 * c), k);
          acc[8 + j] = dot_bf16(acc[8 + j], _mm512_loadu_si512(w.ql + (h + 1) * a->dp + 32 * c), k);
        }
      }
    }
  }
  static FLEXBATCH_ALWAYS_INLINE void one(const AttnQuery* a, const Scratch& w, const uint16_t* const* rows,
                                          int64_t h, __m512* acc) {
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
  }
};

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
  scores_plain<F32Keys<NC>>(a, kv, w);
  softmax(a, w, false);
  int64_t h = 0;
  for (; h + HB <= a->n; h += HB) pv_f32_rows<NC, HB>(a, kv, w, h);
  for (; h < a->n; ++h) pv_f32_rows<NC, 1>(a, kv, w, h);
}

template <int NB, bool LO>
void decode_bf16(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  constexpr int HB = NB <= 2 ? 4 : NB <= 4 ? 2 : 1;
  split_q(a, w);
  scores_plain<Bf16Keys<NB, LO>>(a, kv, w);
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

const AttnKernels table = {"avx512", decode_plain, avx512_decode_int4, avx512_prefill_bf16};

}  // namespace

const AttnKernels* avx512_attn() { return &table; }

}  // namespace flexbatch
