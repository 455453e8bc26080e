// Prefill attention on AVX2 + FMA, as flash attention runs: blocks of query rows (the g heads of a KV head at
// 64 / g positions) against blocks of 64 keys, both products in float32 by register-blocked FMA kernels (6 query
// rows x 16 keys for the scores, 6 rows x 16 dims for p . V), the online softmax in float32 between them; the item's
// K (transposed by blocks of 64 keys) and V are widened to float32 once.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn.h"
#include "attn_avx2.h"

namespace flexbatch {
namespace {

struct PrefillWork {
  float* kp;  // [tp / 64][d][64]: for 64 keys, element c of each
  float* vp;  // [tp][d] the values
  float* qb;  // [rows][d] the block's queries
  float* sc;  // [rows][64] scores, then probabilities
  float* ob;  // [rows][d] weighted values
  float* m;   // [rows] running max
  float* l;   // [rows] sum of exponentials
  int64_t rows;
};

PrefillWork carve_prefill(const PrefillItem* it) {
  PrefillWork w;
  const int64_t tp = (it->t + 63) / 64 * 64;
  w.rows = prefill_rows(it->g);
  float* p = static_cast<float*>(it->scratch);
  w.kp = p; p += tp * it->d;
  w.vp = p; p += tp * it->d;
  w.qb = p; p += w.rows * it->d;
  w.sc = p; p += w.rows * 64;
  w.ob = p; p += w.rows * it->d;
  w.m = p; p += w.rows;
  w.l = p;
  return w;
}

// K and V of the item widened to float32 (K zero past t in its last block), once per item.
void pack_kv(const PrefillItem* it, const PrefillWork& w) {
  const int64_t T = it->t, D = it->d, blocks = (T + 63) / 64;
  memset(w.kp + (blocks - 1) * D * 64, 0, 4 * D * 64);
  for (int64_t n = 0; n < T; ++n) {
    const uint16_t* k = it->k + n * it->k_stride;
    float* dst = w.kp + (n / 64) * D * 64 + n % 64;
    for (int64_t c = 0; c < D; ++c) dst[c * 64] = bf16_to_f32(k[c]);
    const uint16_t* v = it->v + n * it->v_stride;
    for (int64_t c = 0; c < D; c += 8)
      _mm256_storeu_ps(w.vp + n * D + c, widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + c))));
  }
}

// Scaled scores of rows [r0, r0 + R) against keys [0, seen) of key block kb, 16 at a time, into w.sc.
template <int R>
void qk_rows(const PrefillItem* it, const PrefillWork& w, int64_t kb, int64_t r0, int64_t seen) {
  const int64_t D = it->d;
  const __m256 sc = _mm256_set1_ps(it->scale);
  for (int64_t n0 = 0; n0 < seen; n0 += 16) {
    __m256 acc[R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const float* kp = w.kp + kb * D * 64 + n0;
    const float* q = w.qb + r0 * D;
    for (int64_t c = 0; c < D; ++c) {
      const __m256 k0 = _mm256_loadu_ps(kp + c * 64), k1 = _mm256_loadu_ps(kp + c * 64 + 8);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_broadcast_ss(q + r * D + c);
        acc[r][0] = _mm256_fmadd_ps(x, k0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(x, k1, acc[r][1]);
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(w.sc + (r0 + r) * 64 + n0, _mm256_mul_ps(acc[r][0], sc));
      _mm256_storeu_ps(w.sc + (r0 + r) * 64 + n0 + 8, _mm256_mul_ps(acc[r][1], sc));
    }
  }
}

// o[r] += p[r] . V over keys [0, keys) of key block kb, rows [r0, r0 + R), 16 dims at a time.
template <int R>
void pv_rows(const PrefillItem* it, const PrefillWork& w, int64_t kb, int64_t r0, int64_t keys) {
  const int64_t D = it->d;
  for (int64_t c0 = 0; c0 < D; c0 += 16) {
    __m256 acc[R][2];
    float* o = w.ob + r0 * D + c0;
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm256_loadu_ps(o + r * D);
      acc[r][1] = _mm256_loadu_ps(o + r * D + 8);
    }
    const float* vp = w.vp + kb * 64 * D + c0;
    const float* p = w.sc + r0 * 64;
    for (int64_t n = 0; n < keys; ++n) {
      const __m256 v0 = _mm256_loadu_ps(vp + n * D), v1 = _mm256_loadu_ps(vp + n * D + 8);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_broadcast_ss(p + r * 64 + n);
        acc[r][0] = _mm256_fmadd_ps(x, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(x, v1, acc[r][1]);
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(o + r * D, acc[r][0]);
      _mm256_storeu_ps(o + r * D + 8, acc[r][1]);
    }
  }
}

// Which of the nk keys of block kb position i may see (bit n: key kb * 64 + n).
inline uint64_t visible(const PrefillItem* it, int64_t i, int64_t kb, int64_t nk) {
  const uint64_t live = nk >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << nk) - 1);
  if (i >= it->s) return 0;
  if (it->mask) {
    const uint8_t* m = it->mask + i * it->mask_row + kb * 64;
    uint64_t bits = 0;
    if (nk == 64) {
      const __m256i zero = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + 32 * h));
        bits |= (uint64_t)(uint32_t)~_mm256_movemask_epi8(_mm256_cmpeq_epi8(x, zero)) << (32 * h);
      }
    } else {
      for (int64_t n = 0; n < nk; ++n) bits |= (uint64_t)(m[n] != 0) << n;
    }
    return bits;
  }
  if (!it->causal) return live;
  const int64_t seen = i + it->t - it->s - kb * 64 + 1;
  return seen <= 0 ? 0 : seen >= nk ? live : (((uint64_t)1 << seen) - 1);
}

// One row's online-softmax step over block kb: its scores become probabilities in place, the state rescaled.
void softmax_row(const PrefillItem* it, const PrefillWork& w, int64_t r, int64_t i, int64_t kb, int64_t nk) {
  const uint64_t vis = visible(it, i, kb, nk);
  float* s = w.sc + r * 64;
  const __m256 neg = _mm256_set1_ps(-INFINITY);
  __m256 x[8];
  __m256 mx = neg;
  for (int c = 0; c < 8; ++c) {
    x[c] = _mm256_blendv_ps(neg, _mm256_loadu_ps(s + 8 * c), lanes_of((unsigned)(vis >> (8 * c)) & 0xFF));
    mx = _mm256_max_ps(mx, x[c]);
  }
  const float m_new = fmaxf(w.m[r], hmax(mx));
  if (m_new == -INFINITY) {
    memset(s, 0, 4 * 64);
    return;
  }
  const float alpha = expf(w.m[r] - m_new);
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int c = 0; c < 8; ++c) {
    const __m256 p = exp_ps(_mm256_sub_ps(x[c], mv));  // 0 where not visible (-inf)
    sum = _mm256_add_ps(sum, p);
    _mm256_storeu_ps(s + 8 * c, p);
  }
  w.m[r] = m_new;
  w.l[r] = w.l[r] * alpha + hsum(sum);
  if (alpha != 1.0f) {
    float* o = w.ob + r * it->d;
    for (int64_t c = 0; c < it->d; c += 8) _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), _mm256_set1_ps(alpha)));
  }
}

// Keys of block kb (of the `used` first) that rows [.., r_last] of the query block at s0 may see: causal without
// a mask, none past the position of its last row (the diagonal block's upper triangle is not computed).
inline int64_t keys_seen(const PrefillItem* it, int64_t s0, int64_t kb, int64_t r_last, int64_t used) {
  if (it->mask || !it->causal) return used;
  const int64_t seen = s0 + r_last / it->g + it->t - it->s - kb * 64 + 1;
  return seen < 0 ? 0 : seen < used ? seen : used;
}

constexpr int ROWS = 6;  // query rows per register block

// Scores (pass 0) or p . V (pass 1) of the block's rows, ROWS at a time; keys a row group does not see are left
// out (their probabilities are zero, their scores unread).
template <int R>
void rows_pass(int pass, const PrefillItem* it, const PrefillWork& w, int64_t kb, int64_t r0, int64_t seen) {
  if (pass == 0) qk_rows<R>(it, w, kb, r0, seen);
  else pv_rows<R>(it, w, kb, r0, seen);
}

void block_pass(int pass, const PrefillItem* it, const PrefillWork& w, int64_t s0, int64_t kb, int64_t used) {
  for (int64_t r0 = 0; r0 < w.rows; r0 += ROWS) {
    const int64_t R = w.rows - r0 < ROWS ? w.rows - r0 : ROWS;
    const int64_t seen = keys_seen(it, s0, kb, r0 + R - 1, used);
    if (seen == 0) continue;
    switch (R) {
      case 1: rows_pass<1>(pass, it, w, kb, r0, seen); break;
      case 2: rows_pass<2>(pass, it, w, kb, r0, seen); break;
      case 3: rows_pass<3>(pass, it, w, kb, r0, seen); break;
      case 4: rows_pass<4>(pass, it, w, kb, r0, seen); break;
      case 5: rows_pass<5>(pass, it, w, kb, r0, seen); break;
      default: rows_pass<ROWS>(pass, it, w, kb, r0, seen); break;
    }
  }
}

// The block's rows: row r is head r % g of position s0 + r / g (zero past s), widened to float32.
void load_queries(const PrefillItem* it, const PrefillWork& w, int64_t s0, int64_t positions) {
  const int64_t D = it->d;
  memset(w.qb, 0, 4 * w.rows * D);
  memset(w.ob, 0, 4 * w.rows * D);
  for (int64_t r = 0; r < w.rows; ++r) {
    w.m[r] = -INFINITY;
    w.l[r] = 0.0f;
  }
  for (int64_t i = s0; i < s0 + positions && i < it->s; ++i)
    for (int64_t j = 0; j < it->g; ++j) {
      const int64_t r = (i - s0) * it->g + j;
      const uint16_t* q = it->q + j * it->q_head + i * it->q_pos;
      for (int64_t c = 0; c < D; c += 8)
        _mm256_storeu_ps(w.qb + r * D + c, widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c))));
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
      const __m256 inv = _mm256_set1_ps(1.0f / w.l[r]);
      uint16_t* out = it->out + j * it->o_head + i * it->o_pos;
      for (int64_t c = 0; c < it->d; c += 8) {
        const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(w.ob + r * it->d + c), inv);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), to_bf16(y));
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
      // causal: keys past the block's last position are seen by none of its rows (the diagonal block's tail)
      const int64_t seen = !it->mask && it->causal ? last + it->t - it->s - kb * 64 + 1 : nk;
      const int64_t used = seen < nk ? seen : nk;
      block_pass(0, it, w, s0, kb, used);
      for (int64_t r = 0; r < w.rows; ++r) softmax_row(it, w, r, s0 + r / it->g, kb, nk);
      block_pass(1, it, w, s0, kb, used);
    }
    store_outputs(it, w, s0, positions);
  }
}

}  // namespace

void avx2_prefill_bf16(const PrefillItem* it) { prefill_bf16(it); }

}  // namespace flexbatch
