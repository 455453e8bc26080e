// Tensor entry point of the int8 x int8 GEMM (engine/kernels/int8_rows.py): the activations quantized per row,
// then (row block, column block) work items spread over torch's threads.
#include <torch/extension.h>

#include <algorithm>

#include "bind_args.h"
#include "int8.h"
#include "parallel.h"

namespace flexbatch {
namespace {

const Int8Kernels& kernels() { return required(by_isa(avx512_int8, avx2_int8)); }

// y = (x quantized per row) W^T with W as stored: x [*, K] float32 or bfloat16 -> y [*, N] in x's dtype;
// codes [N, K] int8, scales [N] float32, code_sums [N] int32 (sum of each row's codes).
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& code_sums) {
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.scalar_type() == at::kChar,
              "int8_linear: codes must be [N, K] int8 contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "int8_linear: x must be float32 or bfloat16");
  const int64_t n = codes.size(0), k = codes.size(1), kp = (k + 63) / 64 * 64;
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kFloat && scales.numel() == n &&
                  code_sums.is_contiguous() && code_sums.scalar_type() == at::kInt && code_sums.numel() == n,
              "int8_linear: scales [N] float32 and code_sums [N] int32 expected");
  TORCH_CHECK(x.size(-1) == k, "int8_linear: x has ", x.size(-1), " inputs, the weight ", k);
  const auto x2 = as_rows(x);
  const int64_t M = x2.size(0);
  const int bf16 = x.scalar_type() == at::kBFloat16;
  const auto& kern = kernels();
  auto act = at::empty({M, kp}, x.options().dtype(at::kByte));
  auto act_scale = at::empty({M}, x.options().dtype(at::kFloat));
  flexbatch::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    kern.quantize_rows(x2.data_ptr(), bf16, x2.stride(0), k, r0, r1, act.data_ptr<uint8_t>(),
                       act_scale.data_ptr<float>(), kp);
  });
  auto y = at::empty({M, n}, x.options());
  const Int8Weight w{codes.data_ptr<int8_t>(), scales.data_ptr<float>(), code_sums.data_ptr<int32_t>(), n, k};
  const int out_kind = bf16 ? OUT_BF16 : OUT_F32;
  const int64_t rb = 64, cb = 64, row_blocks = (M + rb - 1) / rb, col_blocks = (n + cb - 1) / cb;
  flexbatch::parallel_for(0, row_blocks * col_blocks, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t i = w0; i < w1; ++i) {
      const int64_t b = i / col_blocks, c = i % col_blocks;
      kern.gemm(&w, act.data_ptr<uint8_t>(), act_scale.data_ptr<float>(), kp, b * rb, std::min(M, (b + 1) * rb),
                c * cb, std::min(n, (c + 1) * cb), y.data_ptr(), n, out_kind);
    }
  });
  return shaped_like(y, x);
}

}  // namespace

void bind_int8(pybind11::module_& m) {
  m.def("int8_linear", &int8_linear, "x W^T with W int8 per output row, x quantized to int8 per row");
}

}  // namespace flexbatch
