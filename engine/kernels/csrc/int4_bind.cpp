// Tensor entry points of the 4-bit x int8 GEMM (engine/kernels/int4_tiles.py): the activations quantized per row
// and group, then (row block, tile) work items spread over torch's threads.
#include <torch/extension.h>

#include <algorithm>

#include "bind_args.h"
#include "int4.h"
#include "parallel.h"

namespace flexbatch {
namespace {

const Int4Kernels& kernels() { return required(by_isa(avx512_int4, avx2_int4)); }

// x [M, K] (float32 or bfloat16, rows contiguous) -> int8 codes [M, Kp], scales and scaled sums [M, Kp / group].
std::vector<at::Tensor> quantize_groups(const at::Tensor& x, int64_t kp, int64_t group) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "quantize_groups: x must be [M, K] with contiguous rows");
  TORCH_CHECK(group % 16 == 0 && kp % group == 0 && kp >= x.size(1) && group <= 1024,
              "quantize_groups: group must be a multiple of 16 up to 1024 dividing kp >= K");
  const int64_t M = x.size(0), ng = kp / group;
  const int bf16 = out_kind_of(x.scalar_type()) == OUT_BF16;
  auto codes = at::empty({M, kp}, x.options().dtype(at::kChar));
  auto scale = at::empty({M, ng}, x.options().dtype(at::kFloat));
  auto scaled_sum = at::empty({M, ng}, x.options().dtype(at::kFloat));
  const auto& k = kernels();
  flexbatch::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    k.quantize_groups(x.data_ptr(), bf16, x.stride(0), x.size(1), r0, r1, codes.data_ptr<int8_t>(),
                      scale.data_ptr<float>(), scaled_sum.data_ptr<float>(), kp, group);
  });
  return {codes, scale, scaled_sum};
}

// y = x W^T for 4-bit W in the tile layout: x [*, K] -> y [*, N] in x's dtype.
// codes [Np/16, Kp/8, 16, 4] uint8; scales, mins [Np/16, ng, 16] float16.
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& mins, int64_t n, int64_t group) {
  TORCH_CHECK(codes.dim() == 4 && codes.size(2) == 16 && codes.size(3) == 4 && codes.is_contiguous(),
              "int4_linear: codes must be [Np/16, Kp/8, 16, 4] contiguous");
  TORCH_CHECK(scales.is_contiguous() && mins.is_contiguous() && scales.scalar_type() == at::kHalf &&
                  mins.scalar_type() == at::kHalf,
              "int4_linear: scales and mins must be contiguous float16");
  const int64_t tiles = codes.size(0), kp = codes.size(1) * 8, ng = kp / group;
  TORCH_CHECK(n <= tiles * 16 && n > (tiles - 1) * 16, "int4_linear: n does not match the tiles");
  TORCH_CHECK(scales.numel() == tiles * ng * 16 && mins.numel() == tiles * ng * 16,
              "int4_linear: scales and mins must be [Np/16, Kp/group, 16]");
  const auto x2 = as_rows(x);
  TORCH_CHECK(x2.size(1) <= kp, "int4_linear: x has more inputs than the weight");
  const int64_t M = x2.size(0);
  auto q = quantize_groups(x2, kp, group);
  QuantRows rows{q[0].data_ptr<int8_t>(), q[1].data_ptr<float>(), q[2].data_ptr<float>(), M, kp, group};
  auto y = at::empty({M, n}, x.options());
  const int out_kind = out_kind_of(y.scalar_type());
  const int64_t esize = y.element_size();
  const auto& k = kernels();
  // work items: (row block, pair of tiles); rows in blocks of 64 so that a block's codes stay in cache across
  // tiles
  const int64_t rb = 64, row_blocks = (M + rb - 1) / rb, pairs = (tiles + 1) / 2;
  const auto* cbase = codes.data_ptr<uint8_t>();
  const auto* sbase = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const auto* mbase = reinterpret_cast<const uint16_t*>(mins.data_ptr<at::Half>());
  char* ybase = static_cast<char*>(y.data_ptr());
  flexbatch::parallel_for(0, row_blocks * pairs, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / pairs, t = 2 * (w % pairs);
      const int ntiles = (int)std::min<int64_t>(2, tiles - t);
      Int4Tile pair[2];
      for (int j = 0; j < ntiles; ++j)
        pair[j] = Int4Tile{cbase + (t + j) * kp * 8, sbase + (t + j) * ng * 16, mbase + (t + j) * ng * 16};
      const int cols = (int)std::min<int64_t>(16, n - (t + ntiles - 1) * 16);
      k.int4_tile_gemm(pair, ntiles, &rows, b * rb, std::min(M, (b + 1) * rb), ybase + t * 16 * esize, n, cols,
                       out_kind);
    }
  });
  return shaped_like(y, x);
}

// The stored codes of a 4-bit weight [n, k] grouped along k (engine/compression/int4.py: data [ng, G/2, n], byte
// (g, j, c) = q[c, gG + j] | q[c, gG + G/2 + j] << 4) -> the tile layout's codes [Np/16, Kp/8, 16, 4] (int4.h), in
// one pass over octets of inputs: each reads eight rows of `data` along the columns and writes a 64-byte line
// per tile; columns past n are zero.
at::Tensor int4_tile_codes(const at::Tensor& data, int64_t n, int64_t group) {
  TORCH_CHECK(data.dim() == 3 && data.scalar_type() == at::kByte && data.is_contiguous() && data.size(2) == n &&
                  data.size(1) * 2 == group && group % 8 == 0,
              "int4_tile_codes: data must be contiguous uint8 [ng, group / 2, n], group a multiple of 8");
  const int64_t ng = data.size(0), half = group / 2, octets = ng * group / 8, tiles = (n + 15) / 16;
  auto codes = at::zeros({tiles, octets, 16, 4}, data.options());
  const uint8_t* src = data.data_ptr<uint8_t>();
  uint8_t* dst = codes.data_ptr<uint8_t>();
  flexbatch::parallel_for(0, octets, 16, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const int64_t g = o * 8 / group, w0 = o * 8 % group;  // an octet lies within one group
      const uint8_t* rows[8];
      int shift[8];
      for (int j = 0; j < 8; ++j) {
        const int64_t w = w0 + j;
        rows[j] = src + (g * half + (w < half ? w : w - half)) * n;
        shift[j] = w < half ? 0 : 4;
      }
      for (int64_t c = 0; c < n; ++c) {
        uint8_t* out = dst + (((c / 16) * octets + o) * 16 + c % 16) * 4;
        for (int j = 0; j < 4; ++j)
          out[j] = (uint8_t)(((rows[j][c] >> shift[j]) & 15) | (((rows[j + 4][c] >> shift[j + 4]) & 15) << 4));
      }
    }
  });
  return codes;
}

}  // namespace

void bind_int4(pybind11::module_& m) {
  m.def("int4_tile_codes", &int4_tile_codes, "stored 4-bit codes -> the tile layout's codes");
  m.def("quantize_groups", &quantize_groups, "int8 codes, scales, scaled sums per row and group");
  m.def("int4_linear", &int4_linear, "x W^T with W 4-bit in the tile layout");
}

}  // namespace flexbatch
