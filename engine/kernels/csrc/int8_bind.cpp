// Tensor entry points of the int8 x int8 GEMMs (engine/kernels/int8_rows.py over the weight as stored,
// engine/kernels/int8_tiles.py over the tile layout): the activations quantized per row, then (row block, column
// block) work items spread over torch's threads.
#include <torch/extension.h>

#include <algorithm>

#include "bind_args.h"
#include "int8.h"
#include "parallel.h"

namespace flexbatch {
namespace {

const Int8Kernels& kernels() { return required(by_isa(avx512_int8, avx2_int8)); }

// One call's operands: x [*, K] as rows [M, K], quantized per row in the form the chosen set's GEMMs read (codes
// [M, kp], kp >= K zero-padded, and one scale per row), and the output y [M, n] in x's dtype.
struct Call {
  at::Tensor x2, codes, scale, y;
  int64_t m;
  int out_kind;
};

Call prepare(const at::Tensor& x, int64_t k, int64_t kp, int64_t n) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "int8 kernels: x must be float32 or bfloat16");
  TORCH_CHECK(x.size(-1) == k, "int8 kernels: x has ", x.size(-1), " inputs, the weight ", k);
  Call c;
  c.x2 = as_rows(x);
  c.m = c.x2.size(0);
  const int bf16 = x.scalar_type() == at::kBFloat16;
  c.codes = at::empty({c.m, kp}, x.options().dtype(at::kByte));
  c.scale = at::empty({c.m}, x.options().dtype(at::kFloat));
  const auto& kern = kernels();
  flexbatch::parallel_for(0, c.m, 16, [&](int64_t r0, int64_t r1) {
    kern.quantize_rows(c.x2.data_ptr(), bf16, c.x2.stride(0), k, r0, r1, c.codes.data_ptr<uint8_t>(),
                       c.scale.data_ptr<float>(), kp);
  });
  c.y = at::empty({c.m, n}, x.options());
  c.out_kind = out_kind_of(c.y.scalar_type());
  return c;
}

// y = (x quantized per row) W^T with W as stored: x [*, K] float32 or bfloat16 -> y [*, N] in x's dtype;
// codes [N, K] int8, scales [N] float32, code_sums [N] int32 (sum of each row's codes).
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& code_sums) {
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.scalar_type() == at::kChar,
              "int8_linear: codes must be [N, K] int8 contiguous");
  const int64_t n = codes.size(0), k = codes.size(1), kp = (k + 63) / 64 * 64;
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kFloat && scales.numel() == n &&
                  code_sums.is_contiguous() && code_sums.scalar_type() == at::kInt && code_sums.numel() == n,
              "int8_linear: scales [N] float32 and code_sums [N] int32 expected");
  const Call q = prepare(x, k, kp, n);
  const int64_t M = q.m;
  const Int8Weight w{codes.data_ptr<int8_t>(), scales.data_ptr<float>(), code_sums.data_ptr<int32_t>(), n, k};
  const auto& kern = kernels();
  const int64_t rb = 64, cb = 64, row_blocks = (M + rb - 1) / rb, col_blocks = (n + cb - 1) / cb;
  flexbatch::parallel_for(0, row_blocks * col_blocks, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t i = w0; i < w1; ++i) {
      const int64_t b = i / col_blocks, c = i % col_blocks;
      kern.gemm(&w, q.codes.data_ptr<uint8_t>(), q.scale.data_ptr<float>(), kp, b * rb, std::min(M, (b + 1) * rb),
                c * cb, std::min(n, (c + 1) * cb), q.y.data_ptr(), n, q.out_kind);
    }
  });
  return shaped_like(q.y, x);
}

// y = (x quantized per row) W^T with W in the tile layout (int8.h): x [*, K] float32 or bfloat16 -> y [*, n] in
// x's dtype; codes [Np/16, kp/4, 16, 4] int8, scales [Np] float32, code_sums [Np] int32, k the weight's inputs.
at::Tensor int8_tile_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                            const at::Tensor& code_sums, int64_t n, int64_t k) {
  TORCH_CHECK(codes.dim() == 4 && codes.size(2) == 16 && codes.size(3) == 4 && codes.is_contiguous() &&
                  codes.scalar_type() == at::kChar,
              "int8_tile_linear: codes must be [Np/16, kp/4, 16, 4] int8 contiguous");
  const int64_t tiles = codes.size(0), kp = codes.size(1) * 4;
  TORCH_CHECK(kp % 64 == 0 && kp >= k && kp < k + 64, "int8_tile_linear: inputs must be padded to a multiple of 64");
  TORCH_CHECK(n <= tiles * 16 && n > (tiles - 1) * 16, "int8_tile_linear: n does not match the tiles");
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kFloat && scales.numel() == tiles * 16 &&
                  code_sums.is_contiguous() && code_sums.scalar_type() == at::kInt && code_sums.numel() == tiles * 16,
              "int8_tile_linear: scales [Np] float32 and code_sums [Np] int32 expected");
  const Call q = prepare(x, k, kp, n);
  const int64_t M = q.m;
  const Int8Tiles w{codes.data_ptr<int8_t>(), scales.data_ptr<float>(), code_sums.data_ptr<int32_t>(), kp};
  const int64_t esize = q.y.element_size();
  const auto& kern = kernels();
  // work items: (four tiles, row block), the row blocks of four tiles in turn, so that their weights are read from
  // memory once and stay in cache across the row blocks
  const int64_t rb = 64, row_blocks = (M + rb - 1) / rb, quads = (tiles + 3) / 4;
  char* ybase = static_cast<char*>(q.y.data_ptr());
  flexbatch::parallel_for(0, row_blocks * quads, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t i = w0; i < w1; ++i) {
      const int64_t t = 4 * (i / row_blocks), b = i % row_blocks;
      const int ntiles = (int)std::min<int64_t>(4, tiles - t);
      const int cols = (int)std::min<int64_t>(16, n - (t + ntiles - 1) * 16);
      kern.tile_gemm(&w, q.codes.data_ptr<uint8_t>(), q.scale.data_ptr<float>(), b * rb, std::min(M, (b + 1) * rb),
                     t, ntiles, ybase + t * 16 * esize, n, cols, q.out_kind);
    }
  });
  return shaped_like(q.y, x);
}

}  // namespace

void bind_int8(pybind11::module_& m) {
  m.def("int8_linear", &int8_linear, "x W^T with W int8 per output row, x quantized to int8 per row");
  m.def("int8_tile_linear", &int8_tile_linear, "x W^T with W int8 per output row in the tile layout");
}

}  // namespace flexbatch
