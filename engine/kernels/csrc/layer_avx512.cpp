// A layer's row-wise work on AVX-512 (16 float32 lanes; bfloat16 rounded to nearest even by vcvtneps2bf16, as
// PyTorch rounds): residual add + RMSNorm, SiLU * up, rotary positions in place, the greedy argmax. Tails are
// masked.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "layer.h"
#include "row_loops.h"
#include "simd_avx512.h"

namespace flexbatch {
namespace {

// v as a tensor of the dtype holds it: rounded to bfloat16 (and widened back), or in float32 kept from being fused
// with the next add into one FMA (the empty asm): one rounding per op, as the reference's separate ops round
inline __m512 round_to(__m512 v, int bf16) {
  if (bf16) return widen_bf16(to_bf16(v));
  __asm__("" : "+v"(v));
  return v;
}

void add_rms_norm(const float* h, const void* delta, int delta_bf16, float* h_out, const void* w, void* x, int bf16,
                  int64_t n, float eps) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const float* s = h;  // the summed row, read by the second pass
  for (int64_t i = 0, c = 0; i < n; i += 16, c = (c + 1) & 3) {
    const __mmask16 m = first16(n - i);
    __m512 v = _mm512_maskz_loadu_ps(m, h + i);
    if (delta) v = _mm512_add_ps(v, load16(delta, delta_bf16, i, m));
    if (h_out) _mm512_mask_storeu_ps(h_out + i, m, v);
    acc[c] = _mm512_fmadd_ps(v, v, acc[c]);
  }
  if (h_out) s = h_out;
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  const float mean = sum / (float)n;
  const __m512 r = _mm512_set1_ps(1.0f / sqrtf(mean + eps));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first16(n - i);
    __m512 v = _mm512_maskz_loadu_ps(m, s + i);
    if (delta && !h_out) v = _mm512_add_ps(v, load16(delta, delta_bf16, i, m));
    const __m512 normed = round_to(_mm512_mul_ps(v, r), bf16);
    store16(x, bf16, i, _mm512_mul_ps(normed, load16(w, bf16, i, m)), m);
  }
}

// exp(x) within 2 ulp (Cephes' polynomial on x - n ln 2, |x - n ln 2| <= ln 2 / 2, scaled by 2^n with vscalefps,
// which gives inf past float32's range and 0 under it)
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
  __m512 n, r;
  const __m512 p = exp_poly<Lanes16>(x, &n, &r);
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

void silu_mul(const void* g, void* out, int64_t f, int bf16) {
  const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
  for (int64_t j = 0; j < f; j += 16) {
    const __mmask16 m = first16(f - j);
    const __m512 x = load16(g, bf16, j, m), up = load16(g, bf16, f + j, m);
    const __m512 act = _mm512_div_ps(x, _mm512_add_ps(one, exp_ps(_mm512_xor_ps(x, sign))));
    store16(out, bf16, j, _mm512_mul_ps(round_to(act, bf16), up), m);
  }
}

void rope(void* row, int64_t heads, int64_t d, const void* c, const void* s, int bf16) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    void* p = static_cast<char*>(row) + h * d * (bf16 ? 2 : 4);
    for (int64_t j = 0; j < half; j += 16) {
      const __mmask16 m = first16(half - j);
      const __m512 cj = load16(c, bf16, j, m), sj = load16(s, bf16, j, m);
      const __m512 x1 = load16(p, bf16, j, m), x2 = load16(p, bf16, half + j, m);
      const __m512 o1 = _mm512_sub_ps(round_to(_mm512_mul_ps(x1, cj), bf16), round_to(_mm512_mul_ps(x2, sj), bf16));
      const __m512 o2 = _mm512_add_ps(round_to(_mm512_mul_ps(x2, cj), bf16), round_to(_mm512_mul_ps(x1, sj), bf16));
      store16(p, bf16, j, o1, m);
      store16(p, bf16, half + j, o2, m);
    }
  }
}

// Each lane keeps the largest value it has seen and the index where it first saw it (replaced only by a strictly
// larger one); the row's answer is the smallest index among the lanes holding the largest value: its first
// occurrence. NaNs are noted on the way and answered by the first of them.
int64_t argmax(const float* x, int64_t n) {
  if (n < 16) return argmax_scalar(x, n);
  __m512 best = _mm512_loadu_ps(x);
  __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), idx = at;
  __mmask16 nan = _mm512_cmp_ps_mask(best, best, _CMP_UNORD_Q);
  const __m512i step = _mm512_set1_epi32(16);
  for (int64_t i = 16; i < n; i += 16) {
    const __mmask16 m = first16(n - i);
    idx = _mm512_add_epi32(idx, step);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __mmask16 gt = _mm512_mask_cmp_ps_mask(m, v, best, _CMP_GT_OQ);
    nan |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
    best = _mm512_mask_mov_ps(best, gt, v);
    at = _mm512_mask_mov_epi32(at, gt, idx);
  }
  if (nan) return first_nan(x, n);
  const __mmask16 top = _mm512_cmp_ps_mask(best, _mm512_set1_ps(_mm512_reduce_max_ps(best)), _CMP_EQ_OQ);
  return _mm512_mask_reduce_min_epi32(top, at);
}

const LayerKernels table = {"avx512", add_rms_norm_rows<add_rms_norm>, silu_mul_rows<silu_mul>,
                            rope_rows<rope>, argmax_rows<argmax>};

}  // namespace

const LayerKernels* avx512_layer() { return &table; }

}  // namespace flexbatch
