// Tensor entry points of the MXFP4 kernels (engine/kernels/mxfp4_linear.py, engine/kernels/mxfp4_experts.py): rows
// widened to float32 in block order once (mxfp4.h), then (weight, row block, column block) work items spread over
// torch's threads. One projection, or a mixture's routed experts in one call: every expert's gate_up GEMM + bias,
// gpt-oss's clamped SwiGLU and down GEMM + bias over its own rows, with float32 between the two GEMMs.
#include <torch/extension.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "bind_args.h"
#include "mxfp4.h"
#include "parallel.h"

namespace flexbatch {
namespace {

const Mxfp4Kernels& kernels() { return required(by_isa(avx512_mxfp4, avx2_mxfp4)); }

constexpr int64_t kItemRows = 64, kItemCols = 64;  // a work item: up to 64 rows x 64 columns of one weight

// One weight over some rows: w [N, blocks, 17], bias [N] float32 (or null), rows [r0, r1) of x and y.
struct Part {
  const uint8_t* w;
  const float* bias;
  int64_t r0, r1;
};

void check_weight(const at::Tensor& w, int64_t n, int64_t blocks, const char* what) {
  TORCH_CHECK(w.dim() == 3 && w.scalar_type() == at::kByte && w.is_contiguous() && w.size(0) == n &&
                  w.size(1) == blocks && w.size(2) == kMxBlockBytes,
              what, ": weights must be contiguous uint8 [", n, ", ", blocks, ", ", kMxBlockBytes, "], got ", w.sizes());
}

// A bias [n] as float32, kept alive in `held`.
const float* float_bias(const at::Tensor& b, int64_t n, std::vector<at::Tensor>& held, const char* what) {
  TORCH_CHECK(b.numel() == n, what, ": a bias of ", n, " values expected, got ", b.numel());
  held.push_back(b.to(at::kFloat).contiguous());
  return held.back().data_ptr<float>();
}

// Rows x [R, K] as the GEMM takes them: float32 in block order (mxfp4.h), each block of 32 inputs as its 16 evens,
// then its 16 odds.
at::Tensor block_order(const at::Tensor& x) {
  const int64_t R = x.size(0), K = x.size(1);
  TORCH_CHECK(K % kMxBlock == 0, "mxfp4: rows of ", K, " values are not whole blocks of ", kMxBlock);
  return x.to(at::kFloat).reshape({R, K / kMxBlock, kMxBlock / 2, 2}).transpose(2, 3).contiguous().view({R, K});
}

// y [R, n] float32: each part's rows of x (in block order) times its weight's transpose, plus its bias.
void gemm_parts(const std::vector<Part>& parts, int64_t n, int64_t blocks, const at::Tensor& x, at::Tensor& y) {
  const int64_t col_items = (n + kItemCols - 1) / kItemCols;
  std::vector<int64_t> items{0};  // items[j]: part j's first work item
  for (const Part& p : parts) items.push_back(items.back() + (p.r1 - p.r0 + kItemRows - 1) / kItemRows * col_items);
  const auto& k = kernels();
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ldx = x.size(1);
  flexbatch::parallel_for(0, items.back(), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t j = std::upper_bound(items.begin(), items.end(), i) - items.begin() - 1;
      const int64_t local = i - items[j], r0 = parts[j].r0 + local / col_items * kItemRows;
      const int64_t r1 = std::min(parts[j].r1, r0 + kItemRows), n0 = local % col_items * kItemCols;
      const int64_t n1 = std::min(n, n0 + kItemCols);
      k.gemm(parts[j].w, blocks, xp, ldx, r0, r1, n0, n1, parts[j].bias, yp, n);
    }
  });
}

// y = x W^T (+ bias): x [*, K] float32 or bfloat16, W [N, K / 32, 17] -> [*, N] in x's dtype.
at::Tensor mxfp4_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  out_kind_of(x.scalar_type());
  const auto rows = as_rows(x);
  const int64_t R = rows.size(0), n = w.size(0);
  const auto xp = block_order(rows);
  check_weight(w, n, rows.size(1) / kMxBlock, "mxfp4_linear");
  std::vector<at::Tensor> held;
  const float* b = bias ? float_bias(*bias, n, held, "mxfp4_linear") : nullptr;
  auto y = at::empty({R, n}, rows.options().dtype(at::kFloat));
  gemm_parts({Part{w.data_ptr<uint8_t>(), b, 0, R}}, n, rows.size(1) / kMxBlock, xp, y);
  return shaped_like(y.to(x.scalar_type()), x);
}

// rows [R, H] float32 or bfloat16, grouped by expert (`starts`: each expert's first row, then R); each expert's
// gate_up [2F, H / 32, 17] (gate rows, then up rows) and bias [2F], down [H, F / 32, 17] and bias [H]
// -> down(clamped SwiGLU(gate_up + bias)) + bias [R, H] in rows' dtype, float32 between the two GEMMs.
at::Tensor mxfp4_experts(const at::Tensor& rows, const std::vector<int64_t>& starts,
                         const std::vector<at::Tensor>& gate_up, const std::vector<at::Tensor>& gate_up_bias,
                         const std::vector<at::Tensor>& down, const std::vector<at::Tensor>& down_bias, double limit,
                         double alpha) {
  out_kind_of(rows.scalar_type());
  TORCH_CHECK(rows.dim() == 2 && rows.device().is_cpu(), "mxfp4_experts: rows must be a [R, H] CPU tensor");
  const size_t E = gate_up.size();
  TORCH_CHECK(E > 0 && starts.size() == E + 1 && starts.front() == 0 && starts.back() == rows.size(0) &&
                  std::is_sorted(starts.begin(), starts.end()),
              "mxfp4_experts: starts must be each expert's first row, ascending, then the row count");
  TORCH_CHECK(gate_up_bias.size() == E && down.size() == E && down_bias.size() == E,
              "mxfp4_experts: a gate_up bias, a down weight and a down bias per gate_up weight");
  const int64_t R = rows.size(0), h = rows.size(1), two_f = gate_up[0].size(0), f = two_f / 2;
  TORCH_CHECK(two_f % 2 == 0 && f % kMxBlock == 0, "mxfp4_experts: gate_up's 2F rows must be two whole blocks' worth");
  std::vector<at::Tensor> held;
  std::vector<Part> gu, dn;
  for (size_t e = 0; e < E; ++e) {
    check_weight(gate_up[e], two_f, h / kMxBlock, "mxfp4_experts (gate_up)");
    check_weight(down[e], h, f / kMxBlock, "mxfp4_experts (down)");
    gu.push_back({gate_up[e].data_ptr<uint8_t>(), float_bias(gate_up_bias[e], two_f, held, "mxfp4_experts (gate_up)"),
                  starts[e], starts[e + 1]});
    dn.push_back({down[e].data_ptr<uint8_t>(), float_bias(down_bias[e], h, held, "mxfp4_experts (down)"), starts[e],
                  starts[e + 1]});
  }
  const auto f32 = rows.options().dtype(at::kFloat);
  auto gate_up_out = at::empty({R, two_f}, f32), gated = at::empty({R, f}, f32), y = at::empty({R, h}, f32);
  gemm_parts(gu, two_f, h / kMxBlock, block_order(rows), gate_up_out);
  const auto& k = kernels();
  flexbatch::parallel_for(0, R, std::max<int64_t>(1, (1 << 14) / f), [&](int64_t r0, int64_t r1) {
    k.clamped_swiglu(gate_up_out.data_ptr<float>(), two_f, gated.data_ptr<float>(), f, f, (float)limit, (float)alpha,
                     r0, r1);
  });
  gemm_parts(dn, h, f / kMxBlock, block_order(gated), y);
  return y.to(rows.scalar_type());
}

}  // namespace

void bind_mxfp4(pybind11::module_& m) {
  m.def("mxfp4_linear", &mxfp4_linear, "x W^T (+ bias) with W MXFP4 as gpt-oss stores it",
        pybind11::arg("x"), pybind11::arg("w"), pybind11::arg("bias") = pybind11::none());
  m.def("mxfp4_experts", &mxfp4_experts, "each MXFP4 expert's gate_up, clamped SwiGLU and down over its rows");
}

}  // namespace flexbatch
