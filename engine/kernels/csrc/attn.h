// Decode attention (a few query rows against one K/V head) each instruction set provides, over raw pointers (no
// torch types): attn_avx2.cpp and attn_avx512.cpp define them, compiled with their own -m flags; attn_bind.cpp
// chooses a table at run time and spreads the (row, KV head) work items over torch's threads.
//
// One work item folds every slot of its cache into an online-softmax state (max m, denominator l, unnormalized
// output o) in two passes that each read the cache once: the scores of all slots (K), then the exponentials'
// weighted sum of the values (V). The state may start from another source's (a shared prefix's) and is left
// unnormalized, so that sources fold one after the other: out = o / l at the end.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

namespace flexbatch {

struct AttnQuery {
  const float* q;        // [n][dp] float32, zero past d
  int64_t n;             // query rows (the g query heads of a KV head)
  int64_t d;             // head size, a multiple of 16
  int64_t dp;            // q's row stride: d rounded up to 32 (and to the 4-bit groups' padded size)
  float scale;           // applied to q . k
  const uint8_t* mask;   // [t] (nonzero: may attend), or null: every slot
  int64_t t;             // slots
  int precise;           // bf16 cache on AVX-512: also fold in the bf16 remainders of q and p (float32 queries)
  float* m;              // [n] running max of the scaled scores (-inf: nothing seen yet)
  float* l;              // [n] sum of exponentials, relative to m
  float* o;              // [n][d] weighted values, relative to m
  void* scratch;         // attn_scratch_bytes(n, t, dp) bytes, 64-byte aligned
};

// K and V [t][d] of one (row, KV head): slot s at k + s * k_stride elements, float32 or bfloat16.
struct PlainKv {
  const void* k;
  const void* v;
  int64_t k_stride, v_stride;
  int bf16;
};

// A 4-bit cache of one (row, KV head) (engine/compression/int4.py, grouped along d, slots innermost): the code
// byte of (group g, pair j, slot s) at data + g * group_stride + j * row_stride + s holds d = g G + j in its low
// nibble and d = g G + G/2 + j in its high one; min and scale (float16) at mins/scales + g * param_stride + s.
struct Int4Kv {
  const uint8_t* data;
  const uint16_t* mins;
  const uint16_t* scales;
  int64_t row_stride, group_stride, param_stride;
  int64_t groups, group;
};

// Prefill attention of one (row, KV head), bf16 in and out, float32 accumulation: its g query heads at s positions
// (element (head j, position i, d) at q + j * q_head + i * q_pos + d; out alike) against t keys (k, v: slot
// stride k_stride, v_stride). Key n is visible to position i where mask[i * mask_row + n] is nonzero, or, with no
// mask, where n <= i + t - s when causal (blocks above the diagonal skipped), always when not.
struct PrefillItem {
  const uint16_t* q;
  int64_t q_head, q_pos;
  const uint16_t* k;
  const uint16_t* v;
  int64_t k_stride, v_stride;
  uint16_t* out;
  int64_t o_head, o_pos;
  int64_t g, s, t, d;
  const uint8_t* mask;
  int64_t mask_row;
  int causal;
  float scale;
  // the online-softmax state each query row starts from (another source's, e.g. a shared prefix), or null: none;
  // row j * s + i is head j at position i: max m0, sum l0, weighted values o0 [d]
  const float* m0;
  const float* l0;
  const float* o0;
  void* scratch;  // prefill_scratch_bytes(g, t, d)
};

struct AttnKernels {
  const char* name;
  void (*decode_plain)(const AttnQuery* a, const PlainKv* kv);
  void (*decode_int4)(const AttnQuery* a, const Int4Kv* k, const Int4Kv* v);
  void (*prefill_bf16)(const PrefillItem* p);  // null where the instruction set has no prefill kernel
};

// Prefill blocks: query rows (position-major, the g heads of a position together) and keys.
static inline int64_t prefill_rows(int64_t g) { return ((g > 64 ? g : 64 / g * g) + 7) / 8 * 8; }
static const int64_t PREFILL_KEYS = 64;

// Packed K and V of the whole item [t rounded up to 64][d] each, the block's queries [rows][d], scores [rows][64]
// float32, probabilities [rows][64] bf16, output [rows][d] float32, max and sum [rows] float32: room for K, V and
// the queries in float32 (the AVX2 kernel widens them; the AVX-512 one keeps bf16 and uses half of it).
static inline int64_t prefill_scratch_bytes(int64_t g, int64_t t, int64_t d) {
  const int64_t tp = (t + 63) / 64 * 64 + 64, rows = prefill_rows(g);
  return 4 * 2 * tp * d + 4 * rows * d + 4 * rows * 64 + 2 * rows * 64 + 4 * rows * d + 8 * rows + 256;
}

const AttnKernels* avx512_attn();
const AttnKernels* avx2_attn();
void avx512_prefill_bf16(const PrefillItem* p);  // attn_prefill_avx512.cpp
void avx2_prefill_bf16(const PrefillItem* p);    // attn_prefill_avx2.cpp
void avx512_decode_int4(const AttnQuery* a, const Int4Kv* k, const Int4Kv* v);  // attn_int4_avx512.cpp

// Slots rounded up for the scratch rows (static: each object file keeps its own copy, no shared weak symbol).
static inline int64_t attn_padded_slots(int64_t t) { return (t + 31) / 32 * 32 + 32; }

// Scratch of one work item: scores/probabilities and 4-bit weights [n][tp] float32, probabilities as bf16 halves
// [2][n][tp], q as bf16 halves [2][n][dp], a zero row [dp] float32.
static inline int64_t attn_scratch_bytes(int64_t n, int64_t t, int64_t dp) {
  const int64_t tp = attn_padded_slots(t);
  return 4 * n * tp * 2 + 2 * 2 * n * tp + 2 * 2 * n * dp + 4 * dp + 256;
}

// One head's online-softmax step between the passes, written once for every instruction set (an anonymous
// namespace: each set's file compiles its own copy): the state (m, l, o) of query row h moved to the new running
// max max(m, mx), and the scores s[0, tp) made probabilities relative to it by `exp_pass(m_new)`, which returns
// their sum (zero past t), or all zero while nothing has been seen.
namespace {
template <class ExpPass>
inline void fold_step(const AttnQuery* a, int64_t h, float mx, float* s, int64_t tp, ExpPass exp_pass) {
  const float m_new = fmaxf(a->m[h], mx);
  float alpha = 1.0f, sum = 0.0f;
  if (m_new == -INFINITY) {
    memset(s, 0, 4 * tp);
  } else {
    alpha = expf(a->m[h] - m_new);
    sum = exp_pass(m_new);
  }
  a->m[h] = m_new;
  a->l[h] = a->l[h] * alpha + sum;
  float* o = a->o + h * a->d;
  for (int64_t i = 0; i < a->d; ++i) o[i] *= alpha;
}
}  // namespace

}  // namespace flexbatch
