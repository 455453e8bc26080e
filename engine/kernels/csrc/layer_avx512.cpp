// A layer's row-wise work on AVX-512 (16 float32 lanes; bfloat16 rounded to nearest even by vcvtneps2bf16, as
// PyTorch rounds): residual add + RMSNorm, SiLU * up, rotary positions in place. Tails are masked.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "layer.h"

namespace flexbatch {
namespace {

inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// 16 values (fewer under mask m; the others read as 0) from float32 or bfloat16 storage at element i.
inline __m512 load(const void* p, int bf16, int64_t i, __mmask16 m) {
  if (!bf16) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  return widen_bf16(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
}

inline void store(void* p, int bf16, int64_t i, __m512 v, __mmask16 m) {
  if (!bf16) return _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, (__m256i)_mm512_cvtneps_pbh(v));
}

// v rounded to bfloat16 and widened back: the value a bfloat16 tensor holds between two PyTorch ops
inline __m512 round_bf16(__m512 v) { return widen_bf16((__m256i)_mm512_cvtneps_pbh(v)); }

// v as a tensor of the dtype holds it: rounded to bfloat16, or in float32 kept from being fused with the next
// add into one FMA (the empty asm): one rounding per op, as the reference's separate ops round
inline __m512 round_to(__m512 v, int bf16) {
  if (bf16) return round_bf16(v);
  __asm__("" : "+v"(v));
  return v;
}

void add_rms_norm_row(const float* h, const void* delta, int delta_bf16, float* h_out, const void* w, void* x,
                      int bf16, int64_t n, float eps) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const float* s = h;  // the summed row, read by the second pass
  for (int64_t i = 0, c = 0; i < n; i += 16, c = (c + 1) & 3) {
    const __mmask16 m = tail_mask(n - i);
    __m512 v = _mm512_maskz_loadu_ps(m, h + i);
    if (delta) v = _mm512_add_ps(v, load(delta, delta_bf16, i, m));
    if (h_out) _mm512_mask_storeu_ps(h_out + i, m, v);
    acc[c] = _mm512_fmadd_ps(v, v, acc[c]);
  }
  if (h_out) s = h_out;
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  const float mean = sum / (float)n;
  const __m512 r = _mm512_set1_ps(1.0f / sqrtf(mean + eps));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    __m512 v = _mm512_maskz_loadu_ps(m, s + i);
    if (delta && !h_out) v = _mm512_add_ps(v, load(delta, delta_bf16, i, m));
    const __m512 normed = round_to(_mm512_mul_ps(v, r), bf16);
    store(x, bf16, i, _mm512_mul_ps(normed, load(w, bf16, i, m)), m);
  }
}

void add_rms_norm(const float* h, int64_t ldh, const void* delta, int delta_bf16, int64_t ldd, float* h_out,
                  int64_t ldo, const void* w, void* x, int64_t ldx, int bf16, int64_t n, float eps, int64_t r0,
                  int64_t r1) {
  const int64_t dsize = delta_bf16 ? 2 : 4, xsize = bf16 ? 2 : 4;
  for (int64_t r = r0; r < r1; ++r)
    add_rms_norm_row(h + r * ldh, delta ? static_cast<const char*>(delta) + r * ldd * dsize : nullptr, delta_bf16,
                     h_out ? h_out + r * ldo : nullptr, w, static_cast<char*>(x) + r * ldx * xsize, bf16, n, eps);
}

// exp(x) within 2 ulp (Cephes' polynomial on x - n ln 2, |x - n ln 2| <= ln 2 / 2, scaled by 2^n with vscalefps,
// which gives inf past float32's range and 0 under it)
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
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
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

void silu_mul(const void* gu, int64_t ldg, void* out, int64_t ldo, int64_t f, int bf16, int64_t r0, int64_t r1) {
  const int64_t esize = bf16 ? 2 : 4;
  const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const char* g = static_cast<const char*>(gu) + r * ldg * esize;
    char* o = static_cast<char*>(out) + r * ldo * esize;
    for (int64_t j = 0; j < f; j += 16) {
      const __mmask16 m = tail_mask(f - j);
      const __m512 x = load(g, bf16, j, m), up = load(g, bf16, f + j, m);
      const __m512 act = _mm512_div_ps(x, _mm512_add_ps(one, exp_ps(_mm512_xor_ps(x, sign))));
      store(o, bf16, j, _mm512_mul_ps(round_to(act, bf16), up), m);
    }
  }
}

void rope(void* qkv, int64_t ld, int64_t heads, int64_t d, const void* cos, const void* sin, int64_t ldt, int bf16,
          int64_t r0, int64_t r1) {
  const int64_t esize = bf16 ? 2 : 4, half = d / 2;
  for (int64_t r = r0; r < r1; ++r) {
    char* row = static_cast<char*>(qkv) + r * ld * esize;
    const char* c = static_cast<const char*>(cos) + r * ldt * esize;
    const char* s = static_cast<const char*>(sin) + r * ldt * esize;
    for (int64_t h = 0; h < heads; ++h) {
      char* p = row + h * d * esize;
      for (int64_t j = 0; j < half; j += 16) {
        const __mmask16 m = tail_mask(half - j);
        const __m512 cj = load(c, bf16, j, m), sj = load(s, bf16, j, m);
        const __m512 x1 = load(p, bf16, j, m), x2 = load(p, bf16, half + j, m);
        const __m512 o1 = _mm512_sub_ps(round_to(_mm512_mul_ps(x1, cj), bf16), round_to(_mm512_mul_ps(x2, sj), bf16));
        const __m512 o2 = _mm512_add_ps(round_to(_mm512_mul_ps(x2, cj), bf16), round_to(_mm512_mul_ps(x1, sj), bf16));
        store(p, bf16, j, o1, m);
        store(p, bf16, half + j, o2, m);
      }
    }
  }
}

const LayerKernels table = {"avx512", add_rms_norm, silu_mul, rope};

}  // namespace

const LayerKernels* avx512_layer() { return &table; }

}  // namespace flexbatch
