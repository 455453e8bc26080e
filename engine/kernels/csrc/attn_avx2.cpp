// Decode attention on AVX2 + FMA: scores of 8 slots at a time (one accumulator per slot, summed across lanes by
// one transposing reduction), bf16 caches widened to float32 as they are read, the 4-bit cache by attn_int4.h's
// passes over 8 slots at a time (Slots8).
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
inline const void* row(const PlainKv* kv, const void* base, int64_t stride, int64_t t) {
  return static_cast<const char*>(base) + t * stride * (BF16 ? 2 : 4);
}

// ---- plain caches ----

template <bool BF16>
void scores_plain(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  const __m256 sc = _mm256_set1_ps(a->scale);
  for (int64_t t0 = 0; t0 < a->t; t0 += 8) {
    const unsigned allow = Slots8::allowed(a->mask, t0, a->t);
    const void* rows[8];
    for (int j = 0; j < 8; ++j) rows[j] = t0 + j < a->t ? row<BF16>(kv, kv->k, kv->k_stride, t0 + j) : w.zero;
    for (int64_t h = 0; h < a->n; ++h) {
      float* out = w.s + h * w.tp + t0;
      if (!allow) {
        _mm256_storeu_ps(out, _mm256_set1_ps(-INFINITY));
        continue;
      }
      const float* q = a->q + h * a->dp;
      __m256 acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t c = 0; c < a->d; c += 8) {
        const __m256 qc = _mm256_loadu_ps(q + c);
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qc, load8(rows[j], BF16, c), acc[j]);
      }
      Slots8::store_scores(out, _mm256_mul_ps(reduce8(acc), sc), allow);
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

// o[h] += sum_t p[h][t] v_t, the outputs in memory (one row of values is read once for every query row)
template <bool BF16>
void pv_plain(const AttnQuery* a, const PlainKv* kv, const Scratch& w) {
  for (int64_t t = 0; t < a->t; ++t) {
    bool any = false;
    for (int64_t h = 0; h < a->n; ++h) any |= w.s[h * w.tp + t] != 0.0f;
    if (!any) continue;  // masked for every row: the slot's values are not read
    const void* vr = row<BF16>(kv, kv->v, kv->v_stride, t);
    for (int64_t c = 0; c < a->d; c += 8) {
      const __m256 v = load8(vr, BF16, c);
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
