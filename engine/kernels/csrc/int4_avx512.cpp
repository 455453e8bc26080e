// 4-bit weights x int8 activations on AVX-512 VNNI (vpdpbusd: unsigned codes 0..15 times signed activation
// codes, four products summed into each int32 lane), and the per-group activation quantization it takes.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "int4.h"
#include "row_loops.h"
#include "simd_avx512.h"

namespace flexbatch {
namespace {

// Each group: int8 codes (round to nearest even, |code| <= 127), its scale max|x| / 127 and scale * sum(codes).
void quantize_row(const void* x, int bf16, int64_t k, int8_t* codes, float* scale, float* scaled_sum,
                  int64_t kp, int64_t group) {
  const int64_t ng = kp / group;
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t g0 = g * group, g1 = g0 + group < k ? g0 + group : k;
    const float m = absmax(x, bf16, g0, g1);
    const float s = m / 127.0f;
    const __m512 inv = _mm512_set1_ps(s > 0 ? 127.0f / m : 0.0f);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t i = g0; i < g0 + group; i += 16) {
      const __m512i q = quantize16(load_upto16(x, bf16, i, g1 - i), inv);
      sum = _mm512_add_epi32(sum, q);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(q));
    }
    scale[g] = s;
    scaled_sum[g] = s * (float)_mm512_reduce_add_epi32(sum);
  }
}

// R rows (1..4) of T tiles (1 or 2) side by side: each activation broadcast serves both tiles, and one int32
// accumulator per row and tile takes the low- and the high-nibble products (2 R T vpdpbusd chains in flight);
// each group's sums are scaled into float32 once. The last tile has `cols` (<= 16) columns.
template <int R, int T>
void tile_rows(const Int4Tile* t, const QuantRows* x, int64_t r0, void* y, int64_t ldy, int cols, int out_kind) {
  const int64_t ng = x->kp / x->group, octets = x->group / 8;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[T][R];
  for (int j = 0; j < T; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
  const int8_t* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = x->codes + (r0 + r) * x->kp;
  const uint8_t* cp[T];
  for (int j = 0; j < T; ++j) cp[j] = t[j].codes;
  for (int64_t g = 0; g < ng; ++g) {
    __m512i dots[T][R];
    for (int j = 0; j < T; ++j)
      for (int r = 0; r < R; ++r) dots[j][r] = _mm512_setzero_si512();
    for (int64_t o = 0; o < octets; ++o) {
      __m512i lo[T], hi[T];
      for (int j = 0; j < T; ++j) {
        const __m512i v = _mm512_loadu_si512(cp[j]);
        cp[j] += 64;
        lo[j] = _mm512_and_si512(v, low4);
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      }
      const int64_t i = g * x->group + o * 8;
      for (int r = 0; r < R; ++r) {
        int32_t a, b;
        memcpy(&a, xr[r] + i, 4);
        memcpy(&b, xr[r] + i + 4, 4);
        const __m512i xa = _mm512_set1_epi32(a), xb = _mm512_set1_epi32(b);
        for (int j = 0; j < T; ++j) {
          dots[j][r] = _mm512_dpbusd_epi32(dots[j][r], lo[j], xa);
          dots[j][r] = _mm512_dpbusd_epi32(dots[j][r], hi[j], xb);
        }
      }
    }
    for (int j = 0; j < T; ++j) {
      const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t[j].scales + g * 16)));
      const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t[j].mins + g * 16)));
      for (int r = 0; r < R; ++r) {
        const int64_t m = r0 + r;
        const __m512 dot = _mm512_cvtepi32_ps(dots[j][r]);
        acc[j][r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(s, _mm512_set1_ps(x->scale[m * ng + g])), acc[j][r]);
        acc[j][r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(x->scaled_sum[m * ng + g]), acc[j][r]);
      }
    }
  }
  for (int j = 0; j < T; ++j)
    for (int r = 0; r < R; ++r)
      store16(y, out_kind == OUT_BF16, (r0 + r) * ldy + 16 * j, acc[j][r], first16(j == T - 1 ? cols : 16));
}

template <int T>
void tiles_rows(const Int4Tile* t, const QuantRows* x, int64_t r0, int64_t r1, void* y, int64_t ldy, int cols,
                int out_kind) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) tile_rows<4, T>(t, x, r, y, ldy, cols, out_kind);
  switch (r1 - r) {
    case 3: tile_rows<3, T>(t, x, r, y, ldy, cols, out_kind); break;
    case 2: tile_rows<2, T>(t, x, r, y, ldy, cols, out_kind); break;
    case 1: tile_rows<1, T>(t, x, r, y, ldy, cols, out_kind); break;
    default: break;
  }
}

void int4_tile_gemm(const Int4Tile* tiles, int ntiles, const QuantRows* x, int64_t r0, int64_t r1, void* y,
                    int64_t ldy, int cols, int out_kind) {
  if (ntiles == 2)
    tiles_rows<2>(tiles, x, r0, r1, y, ldy, cols, out_kind);
  else
    tiles_rows<1>(tiles, x, r0, r1, y, ldy, cols, out_kind);
}

const Int4Kernels table = {"avx512", quantize_groups_rows<quantize_row>, int4_tile_gemm};

}  // namespace

const Int4Kernels* avx512_int4() { return &table; }

}  // namespace flexbatch
