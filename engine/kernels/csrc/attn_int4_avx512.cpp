// Decode attention over the 4-bit cache on AVX-512: attn_int4.h's passes over 16 slots at a time (Slots16), 8
// query rows at a time.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "attn.h"
#include "attn_avx512.h"
#include "attn_int4.h"

namespace flexbatch {
namespace {

// 16 slots at a time, those past the end and those not allowed as lane masks.
struct Slots16 : Lanes16 {
  static constexpr int ROWS = 8;
  static __mmask16 live(int64_t t0, int64_t t) { return live16(t0, t); }
  static __mmask16 allowed(const uint8_t* mask, int64_t t0, int64_t t) { return allowed16(mask, t0, t); }
  static F load(const float* p, __mmask16 live) { return _mm512_maskz_loadu_ps(live, p); }
  static F codes(const uint8_t* p, __mmask16 live, F* hi) {
    const __m512i x = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, p));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4));
    return _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(15)));
  }
  static F half(const uint16_t* p, __mmask16 live) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, p)); }
  static void store_scores(float* out, F s, __mmask16 allow) {
    _mm512_storeu_ps(out, _mm512_mask_blend_ps(allow, _mm512_set1_ps(-INFINITY), s));
  }
};

}  // namespace

void avx512_decode_int4(const AttnQuery* a, const Int4Kv* k, const Int4Kv* v) {
  const Scratch w = carve(a);
  int4_scores<Slots16>(a, k, w);
  softmax(a, w, false);
  int4_values<Slots16>(a, v, w);
}

}  // namespace flexbatch
