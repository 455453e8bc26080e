// Prefill attention on AVX512-BF16, as flash attention runs: blocks of query rows (the g heads of a KV head at
// 64 / g positions) against blocks of 64 keys, both products by vdpbf16ps on operands packed in pairs, the online
// softmax in float32 between them; the item's K and V are packed once.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn.h"
#include "attn_avx512.h"

namespace flexbatch {
namespace {

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
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + 16 * c), to_bf16(p));
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

// Keys of block kb (of the `used` first) that rows [.., r_last] of the query block at s0 may see: causal without
// a mask, none past the position of its last row (the diagonal block's upper triangle is not computed).
inline int64_t keys_seen(const PrefillItem* it, int64_t s0, int64_t kb, int64_t r_last, int64_t used) {
  if (it->mask || !it->causal) return used;
  const int64_t seen = s0 + r_last / it->g + it->t - it->s - kb * 64 + 1;
  return seen < 0 ? 0 : seen < used ? seen : used;
}

// Rows past the keys they see have probability zero there: their products are left out, not added as zeros.
void pv_block(const PrefillItem* it, const PrefillWork& w, int64_t s0, int64_t kb, int64_t used) {
  for (int64_t r0 = 0; r0 < w.rows; r0 += 4) {
    const int64_t pairs = (keys_seen(it, s0, kb, r0 + 3, used) + 1) / 2;
    if (pairs == 0) continue;
    for (int64_t c0 = 0; c0 < it->d; c0 += 64) {
      switch ((it->d - c0) / 16 < 4 ? (it->d - c0) / 16 : 4) {
        case 1: pv_4rows<1>(it, w, kb, r0, c0, pairs); break;
        case 2: pv_4rows<2>(it, w, kb, r0, c0, pairs); break;
        case 3: pv_4rows<3>(it, w, kb, r0, c0, pairs); break;
        default: pv_4rows<4>(it, w, kb, r0, c0, pairs); break;
      }
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
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), to_bf16(y));
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
      // scores a row does not see are left unwritten: softmax_row reads only the visible ones
      for (int64_t r0 = 0; r0 < w.rows; r0 += 8) {
        const int64_t seen8 = keys_seen(it, s0, kb, r0 + 7, used);
        for (int64_t n0 = 0; n0 < seen8; n0 += 32) qk_8x32(it, w, kb, r0, n0);
      }
      for (int64_t r = 0; r < w.rows; ++r) softmax_row(it, w, r, s0 + r / it->g, kb, nk);
      pv_block(it, w, s0, kb, used);
    }
    store_outputs(it, w, s0, positions);
  }
}

}  // namespace

void avx512_prefill_bf16(const PrefillItem* it) { prefill_bf16(it); }

}  // namespace flexbatch
