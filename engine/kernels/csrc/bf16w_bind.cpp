// Tensor entry point of the bfloat16-weight x float32 GEMM (engine/kernels/bf16_tiles.py): (four tiles, row block)
// work items spread over torch's threads. One kernel for both instruction sets: an AVX-512 CPU runs the AVX2 one
// (which machine classes take it at all is engine/kernels/gemm_choice.py's rule).
#include <torch/extension.h>

#include <algorithm>

#include "bf16w.h"
#include "bind_args.h"
#include "parallel.h"

namespace flexbatch {
namespace {

const Bf16wKernels& kernels() { return required(by_isa(avx2_bf16w, avx2_bf16w)); }

// y = x W^T: x [*, K] float32 -> y [*, n] float32; tiles [Np/16, K, 16] bfloat16 in the tile layout (bf16w.h).
at::Tensor bf16_tile_linear(const at::Tensor& x, const at::Tensor& tiles, int64_t n) {
  TORCH_CHECK(tiles.dim() == 3 && tiles.size(2) == 16 && tiles.is_contiguous() &&
                  tiles.scalar_type() == at::kBFloat16,
              "bf16_tile_linear: tiles must be [Np/16, K, 16] bfloat16 contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "bf16_tile_linear: x must be float32");
  const int64_t ntiles = tiles.size(0), k = tiles.size(1);
  TORCH_CHECK(x.size(-1) == k, "bf16_tile_linear: x has ", x.size(-1), " inputs, the weight ", k);
  TORCH_CHECK(n <= ntiles * 16 && n > (ntiles - 1) * 16, "bf16_tile_linear: n does not match the tiles");
  const auto x2 = as_rows(x);
  const int64_t M = x2.size(0), ldx = x2.stride(0);
  auto y = at::empty({M, n}, x.options());
  const auto& kern = kernels();
  const auto* w = reinterpret_cast<const uint16_t*>(tiles.data_ptr<at::BFloat16>());
  const float* xp = x2.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // the row blocks of four tiles in turn, so that their weights are read from memory once and stay in cache
  // across the row blocks
  const int64_t rb = 64, row_blocks = (M + rb - 1) / rb, quads = (ntiles + 3) / 4;
  flexbatch::parallel_for(0, row_blocks * quads, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t i = w0; i < w1; ++i) {
      const int64_t t = 4 * (i / row_blocks), b = i % row_blocks;
      const int nt = (int)std::min<int64_t>(4, ntiles - t);
      const int cols = (int)std::min<int64_t>(16, n - (t + nt - 1) * 16);
      const bool same_tiles_next = b + 1 < row_blocks, more = t + 4 < ntiles && i + 1 < w1;
      const uint16_t* next = !same_tiles_next && more ? w + (t + 4) * k * 16 : nullptr;
      kern.tile_gemm(w, k, xp, ldx, b * rb, std::min(M, (b + 1) * rb), t, nt, yp + t * 16, n, cols, next);
    }
  });
  return shaped_like(y, x);
}

}  // namespace

void bind_bf16w(pybind11::module_& m) {
  m.def("bf16_tile_linear", &bf16_tile_linear, "x W^T with W bfloat16 in the tile layout, x and y float32");
}

}  // namespace flexbatch
