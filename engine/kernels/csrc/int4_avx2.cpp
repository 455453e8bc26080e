// 4-bit weights x int8 activations on AVX2 (no VNNI: vpmaddubsw multiplies the unsigned codes 0..15 by the signed
// activation codes into int16 pairs, at most 2 * 15 * 127 each, and vpmaddwd sums those into int32 lanes), and
// the per-group activation quantization it takes. Same layouts and results as int4_avx512.cpp.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "int4.h"
#include "row_loops.h"
#include "simd_avx2.h"

namespace flexbatch {
namespace {

constexpr int kMaxGroup = 1024;

void quantize_row(const void* x, int bf16, int64_t k, int8_t* codes, float* scale, float* scaled_sum,
                  int64_t kp, int64_t group) {
  const int64_t ng = kp / group;
  float tmp[kMaxGroup];
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t g0 = g * group;
    for (int64_t j = 0; j < group; j += 8) {
      if (g0 + j + 8 <= k) _mm256_storeu_ps(tmp + j, load8(x, bf16, g0 + j));
      else
        for (int64_t i = g0 + j; i < g0 + j + 8; ++i) tmp[i - g0] = i >= k ? 0.0f : load1(x, bf16, i);
    }
    __m256 amax = _mm256_setzero_ps();
    for (int64_t j = 0; j < group; j += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(tmp + j)));
    const float m = hmax(amax);
    const float s = m / 127.0f;
    const __m256 inv = _mm256_set1_ps(s > 0 ? 127.0f / m : 0.0f);
    __m256i sum = _mm256_setzero_si256();
    for (int64_t j = 0; j < group; j += 16) {
      const __m256i a = quantize8(_mm256_loadu_ps(tmp + j), inv), b = quantize8(_mm256_loadu_ps(tmp + j + 8), inv);
      sum = _mm256_add_epi32(sum, _mm256_add_epi32(a, b));
      const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);  // a0..a7 b0..b7 as int16
      const __m128i q = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + g0 + j), q);
    }
    scale[g] = s;
    scaled_sum[g] = s * (float)hsum(sum);
  }
}

inline void store_row(void* y, int64_t off, __m256 v0, __m256 v1, int cols, int out_kind) {
  float tmp[16];
  _mm256_storeu_ps(tmp, v0);
  _mm256_storeu_ps(tmp + 8, v1);
  if (out_kind == OUT_F32) {
    memcpy(static_cast<float*>(y) + off, tmp, cols * sizeof(float));
  } else {
    uint16_t* out = static_cast<uint16_t*>(y) + off;
    for (int c = 0; c < cols; ++c) out[c] = f32_to_bf16(tmp[c]);
  }
}

// R rows (1 or 2) of the tile, 16 columns as two halves of 8 int32 lanes.
template <int R>
void tile_rows(const Int4Tile* t, const QuantRows* x, int64_t r0, void* y, int64_t ldy, int cols, int out_kind) {
  const int64_t ng = x->kp / x->group, octets = x->group / 8;
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const uint8_t* cp = t->codes;
  for (int64_t g = 0; g < ng; ++g) {
    __m256i iacc[R][2];
    for (int r = 0; r < R; ++r) iacc[r][0] = iacc[r][1] = _mm256_setzero_si256();
    for (int64_t o = 0; o < octets; ++o, cp += 64) {
      const int64_t i = g * x->group + o * 8;
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cp + 32 * h));
        const __m256i lo = _mm256_and_si256(v, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        for (int r = 0; r < R; ++r) {
          int32_t a, b;
          memcpy(&a, x->codes + (r0 + r) * x->kp + i, 4);
          memcpy(&b, x->codes + (r0 + r) * x->kp + i + 4, 4);
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)),
                                             _mm256_maddubs_epi16(hi, _mm256_set1_epi32(b)));
          iacc[r][h] = _mm256_add_epi32(iacc[r][h], _mm256_madd_epi16(p, ones));
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t->scales + g * 16 + 8 * h)));
      const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t->mins + g * 16 + 8 * h)));
      for (int r = 0; r < R; ++r) {
        const int64_t m = r0 + r;
        const __m256 dot = _mm256_cvtepi32_ps(iacc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(dot, _mm256_mul_ps(s, _mm256_set1_ps(x->scale[m * ng + g])), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(mn, _mm256_set1_ps(x->scaled_sum[m * ng + g]), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) store_row(y, (r0 + r) * ldy, acc[r][0], acc[r][1], cols, out_kind);
}

void int4_tile_gemm(const Int4Tile* tiles, int ntiles, const QuantRows* x, int64_t r0, int64_t r1, void* y,
                    int64_t ldy, int cols, int out_kind) {
  const int64_t esize = out_kind == OUT_F32 ? 4 : 2;
  for (int j = 0; j < ntiles; ++j) {
    void* yj = static_cast<char*>(y) + 16 * j * esize;
    const int cj = j == ntiles - 1 ? cols : 16;
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) tile_rows<2>(tiles + j, x, r, yj, ldy, cj, out_kind);
    if (r < r1) tile_rows<1>(tiles + j, x, r, yj, ldy, cj, out_kind);
  }
}

const Int4Kernels table = {"avx2", quantize_groups_rows<quantize_row>, int4_tile_gemm};

}  // namespace

const Int4Kernels* avx2_int4() { return &table; }

}  // namespace flexbatch
