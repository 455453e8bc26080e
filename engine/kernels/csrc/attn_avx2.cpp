// Decode attention on AVX2 + FMA: scores of 8 slots for one query row, 4 for two or 2 for four at a time (one
// accumulator per slot and row, summed across lanes by one transposing reduction), p . V split by dims (blocks of
// slots, 16 dims at a time, 4 query rows' sums in registers); bf16 caches widened to float32 as they are read (evens
// and odds, one shift or one and each), the 4-bit cache by attn_int4.h's passes over 8 slots at a time (Slots8).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn.h"
#include "attn_avx2.h"
#include "attn_int4.h"

namespace flexbatch {
namespace {

struct Scratch {
  float* s;      // [n][tp] scores, then probabilities
  float* pw;     // [n][tp] 4-bit: probabilities times the slots' scales (and q's group sums in the first pass)
  uint8_t* any;  // [tp / 8] plain caches, in pw's room: whether a group of 8 slots has a nonzero probability
  float* zero;   // [dp] zeros: the row read in place of a slot past the end
  float* qp;     // [n][dp] plain caches: q in the order load16 reads keys
  int64_t tp;
};

Scratch carve(const AttnQuery* a) {
  Scratch w;
  w.tp = attn_padded_slots(a->t);
  char* p = static_cast<char*>(a->scratch);
  w.s = reinterpret_cast<float*>(p);
  w.pw = w.s + a->n * w.tp;
  w.any = reinterpret_cast<uint8_t*>(w.pw);
  w.zero = w.pw + a->n * w.tp;
  w.qp = w.zero + a->dp;
  memset(w.zero, 0, 4 * a->dp);
  return w;
}

// 8 slots at a time, for the 4-bit passes of attn_int4.h and the plain cache's scores: slots past the end read as
// zero through copies, the allowed slots as a bit mask.
struct Slots8 : Lanes8 {
  static constexpr int ROWS = 4;
  static int64_t live(int64_t t0, int64_t t) { return t - t0; }  // slots left (at least 1)
  static unsigned allowed(const uint8_t* mask, int64_t t0, int64_t t) {
    unsigned bits = 0;
    for (int j = 0; j < 8 && t0 + j < t; ++j) bits |= (unsigned)(!mask || mask[t0 + j]) << j;
    return bits;
  }
  static F load(const float* p, int64_t) { return _mm256_loadu_ps(p); }  // the scratch rows are zero past t
  static F codes(const uint8_t* p, int64_t live, F* hi) {
    int64_t bits = 0;
    memcpy(&bits, p, live < 8 ? live : 8);
    const __m256i x = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bits));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4));
    return _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(15)));
  }
  static F half(const uint16_t* p, int64_t live) {
    uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    memcpy(h, p, 2 * (live < 8 ? live : 8));
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
  }
  static void store_scores(float* out, F s, unsigned allow) {
    _mm256_storeu_ps(out, s);
    for (int j = 0; j < 8; ++j)
      if (!(allow >> j & 1)) out[j] = -INFINITY;
  }
};

// r[j] = sum of the lanes of a[j], j < 8
inline __m256 reduce8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

template <bool BF16>
inline const void* row(const void* base, int64_t stride, int64_t t) {
  return static_cast<const char*>(base) + t * stride * (BF16 ? 2 : 4);
}

// ---- plain caches ----

// 16 elements of a row from element c as two float32 vectors: float32 storage as elements [c, c + 8) and
// [c + 8, c + 16); bfloat16 as the even and the odd ones (one load, one shift, one and: no widening shuffle), which
// the permuted queries (qp) and the values' accumulators (pv_rows) follow.
template <bool BF16>
inline void load16(const void* r, int64_t c, __m256* a, __m256* b) {
  if constexpr (BF16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(r) + c));
    *a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    *b = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u)));
  } else {
    *a = _mm256_loadu_ps(static_cast<const float*>(r) + c);
    *b = _mm256_loadu_ps(static_cast<const float*>(r) + c + 8);
  }
}

// q in load16's order, into w.qp: each 16 elements as they are (float32) or evens then odds (bfloat16).
template <bool BF16>
void permute_q(const AttnQuery* a, const Scratch& w) {
  for (int64_t h = 0; h < a->n; ++h)
    for (int64_t c = 0; c < a->d; c += 16)
      for (int i = 0; i < 16; ++i)
        w.qp[h * a->dp + c + i] = a->q[h * a->dp + c + (BF16 ? (i < 8 ? 2 * i : 2 * (i - 8) + 1) : i)];
}

// Scores of query rows [h0, h0 + H) (H = 1, 2 or 4) against every slot, 8 / H slots per step: each key chunk is
// loaded (and widened) once for the H rows, the 8 accumulators summed across lanes by one reduce8 (lane hh * (8 / H) + j: row
// h0 + hh, slot j); -inf where a slot may not be attended.
template <bool BF16, int H>
void scores_rows(const AttnQuery* a, const PlainKv* kv, const Scratch& w, int64_t h0) {
  constexpr int SL = 8 / H;
  const __m256 sc = _mm256_set1_ps(a->scale);
  for (int64_t t0 = 0; t0 < a->t; t0 += 8) {
    const unsigned allow = Slots8::allowed(a->mask, t0, a->t);
    if (!allow) {
      for (int hh = 0; hh < H; ++hh) _mm256_storeu_ps(w.s + (h0 + hh) * w.tp + t0, _mm256_set1_ps(-INFINITY));
      continue;
    }
    const void* rows[8];
    for (int j = 0; j < 8; ++j) rows[j] = t0 + j < a->t ? row<BF16>(kv->k, kv->k_stride, t0 + j) : w.zero;
    for (int half = 0; half < 8; half += SL) {
      __m256 acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t c = 0; c < a->d; c += 16) {
        __m256 qa[H], qb[H];
        for (int hh = 0; hh < H; ++hh) {
          qa[hh] = _mm256_loadu_ps(w.qp + (h0 + hh) * a->dp + c);
          qb[hh] = _mm256_loadu_ps(w.qp + (h0 + hh) * a->dp + c + 8);
        }
#pragma GCC unroll 8
        for (int j = 0; j < SL; ++j) {
          __m256 ka, kb;
          load16<BF16>(rows[half + j], c, &ka, &kb);
          for (int hh = 0; hh < H; ++hh) {
            acc[hh * SL + j] = _mm256_fmadd_ps(qa[hh], ka, acc[hh * SL + j]);
            acc[hh * SL + j] = _mm256_fmadd_ps(qb[hh], kb, acc[hh * SL + j]);
          }
        }
      }
      const __m256 r = _mm256_mul_ps(reduce8(acc), sc);
      if constexpr (H == 1) {
        _mm256_storeu_ps(w.s + h0 * w.tp + t0, r);
      } else if constexpr (H == 2) {
        _mm_storeu_ps(w.s + h0 * w.tp + t0 + half, _mm256_castps256_ps128(r));
        _mm_storeu_ps(w.s + (h0 + 1) * w.tp + t0 + half, _mm256_extractf128_ps(r, 1));
      } else {
        const __m128 lo = _mm256_castps256_ps128(r), hi = _mm256_extractf128_ps(r, 1);
        _mm_storel_pi(reinterpret_cast<__m64*>(w.s + h0 * w.tp + t0 + half), lo);
        _mm_storeh_pi(reinterpret_cast<__m64*>(w.s + (h0 + 1) * w.tp + t0 + half), lo);
        _mm_storel_pi(reinterpret_cast<__m64*>(w.s + (h0 + 2) * w.tp + t0 + half), hi);
        _mm_storeh_pi(reinterpret_cast<__m64*>(w.s + (h0 + 3) * w.tp + t0 + half), hi);
      }
    }
    for (int hh = 0; hh < H; ++hh)
      for (int j = 0; j < 8; ++j)
        if (!(allow >> j & 1)) w.s[(h0 + hh) * w.tp + t0 + j] = -INFINITY;
  }
}

template <bool BF16>
void scores_plain(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  permute_q<BF16>(a, w);
  int64_t h = 0;
  for (; h + 4 <= a->n; h += 4) scores_rows<BF16, 4>(a, kv, w, h);
  for (; h + 2 <= a->n; h += 2) scores_rows<BF16, 2>(a, kv, w, h);
  if (h < a->n) scores_rows<BF16, 1>(a, kv, w, h);
}

// Scores -> probabilities relative to the new running max (zero past t), the state rescaled to it.
void softmax(const AttnQuery* a, const Scratch& w) {
  const int64_t T = a->t;
  for (int64_t h = 0; h < a->n; ++h) {
    float* s = w.s + h * w.tp;
    float mx = -INFINITY;
    for (int64_t t = 0; t < T; ++t) mx = fmaxf(mx, s[t]);
    fold_step(a, h, mx, s, w.tp, [&](float m_new) {
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
      return hsum(acc);
    });
  }
}

// Which groups of 8 slots some query row gives a nonzero probability (masked for every row: their values are not
// read), one byte each into w.any.
void live_groups(const AttnQuery* a, const Scratch& w) {
  for (int64_t t0 = 0; t0 < a->t; t0 += 8) {
    __m256 x = _mm256_setzero_ps();
    for (int64_t h = 0; h < a->n; ++h) x = _mm256_or_ps(x, _mm256_loadu_ps(w.s + h * w.tp + t0));
    w.any[t0 / 8] = !_mm256_testz_si256(_mm256_castps_si256(x), _mm256_castps_si256(x));
  }
}

constexpr int PV_ROWS = 4;    // query rows whose accumulators stay in registers in the values' pass
constexpr int PV_SLOTS = 32;  // slots per block: a block's values stay in L1 while its dims are walked
constexpr int PV_AHEAD = 64;  // slots ahead whose values are prefetched (the walk by dims hides the rows' order
                              // from the hardware's prefetchers: +10 % at T 2,048 on one core, float32)

// Bring rows [t0, min(t1, T)) of a cache into L1 ahead of their use.
template <bool BF16>
inline void prefetch_rows(const void* base, int64_t stride, int64_t t0, int64_t t1, int64_t T, int64_t d) {
  for (int64_t t = t0; t < t1 && t < T; ++t) {
    const char* r = static_cast<const char*>(row<BF16>(base, stride, t));
    for (int64_t b = 0; b < d * (BF16 ? 2 : 4); b += 64) _mm_prefetch(r + b, _MM_HINT_T0);
  }
}

// o[h] += sum_t p[h][t] v_t for query rows [h0, h0 + HB), split by dims: for each block of slots, 16 dims at a
// time, the HB rows' sums for them in registers over the block's slots (each value loaded once for the HB rows).
template <bool BF16, int HB>
void pv_rows(const AttnQuery* a, const PlainKv* kv, const Scratch& w, int64_t h0) {
  const int64_t T = a->t, D = a->d, step = kv->v_stride * (BF16 ? 2 : 4);
  const float* p[HB];
  for (int hb = 0; hb < HB; ++hb) p[hb] = w.s + (h0 + hb) * w.tp;
  for (int64_t tb = 0; tb < T; tb += PV_SLOTS) {
    const int64_t te = tb + PV_SLOTS < T ? tb + PV_SLOTS : T;
    if (h0 == 0) prefetch_rows<BF16>(kv->v, kv->v_stride, tb + PV_AHEAD, tb + PV_AHEAD + PV_SLOTS, T, D);
    for (int64_t c = 0; c < D; c += 16) {
      __m256 acc[HB][2];
      for (int hb = 0; hb < HB; ++hb) acc[hb][0] = acc[hb][1] = _mm256_setzero_ps();
      for (int64_t t0 = tb; t0 < te; t0 += 8) {
        if (!w.any[t0 / 8]) continue;
        const int64_t t1 = t0 + 8 < te ? t0 + 8 : te;
        const char* vr = static_cast<const char*>(row<BF16>(kv->v, kv->v_stride, t0));
        for (int64_t t = t0; t < t1; ++t, vr += step) {
          __m256 va, vb;
          load16<BF16>(vr, c, &va, &vb);
#pragma GCC unroll 4
          for (int hb = 0; hb < HB; ++hb) {
            const __m256 x = _mm256_broadcast_ss(p[hb] + t);
            acc[hb][0] = _mm256_fmadd_ps(x, va, acc[hb][0]);
            acc[hb][1] = _mm256_fmadd_ps(x, vb, acc[hb][1]);
          }
        }
      }
      for (int hb = 0; hb < HB; ++hb) {
        float* o = a->o + (h0 + hb) * D + c;
        __m256 y0 = acc[hb][0], y1 = acc[hb][1];
        if constexpr (BF16) {  // evens and odds back in order
          const __m256 lo = _mm256_unpacklo_ps(y0, y1), hi = _mm256_unpackhi_ps(y0, y1);
          y0 = _mm256_permute2f128_ps(lo, hi, 0x20);
          y1 = _mm256_permute2f128_ps(lo, hi, 0x31);
        }
        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), y0));
        _mm256_storeu_ps(o + 8, _mm256_add_ps(_mm256_loadu_ps(o + 8), y1));
      }
    }
  }
}

template <bool BF16>
void pv_plain(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  live_groups(a, w);
  for (int64_t h0 = 0; h0 < a->n; h0 += PV_ROWS) {
    switch (a->n - h0 < PV_ROWS ? a->n - h0 : PV_ROWS) {
      case 1: pv_rows<BF16, 1>(a, kv, w, h0); break;
      case 2: pv_rows<BF16, 2>(a, kv, w, h0); break;
      case 3: pv_rows<BF16, 3>(a, kv, w, h0); break;
      default: pv_rows<BF16, PV_ROWS>(a, kv, w, h0); break;
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

void decode_int4(const AttnQuery* a, const Int4Kv* k, const Int4Kv* v) {
  const Scratch w = carve(a);
  int4_scores<Slots8>(a, k, w);
  softmax(a, w);
  int4_values<Slots8>(a, v, w);
}

const AttnKernels table = {"avx2", decode_plain, decode_int4, avx2_prefill_bf16};

}  // namespace

const AttnKernels* avx2_attn() { return &table; }

}  // namespace flexbatch
