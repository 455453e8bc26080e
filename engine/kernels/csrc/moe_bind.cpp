// A mixture's routed experts in one call (engine/kernels/int4_experts.py): for rows grouped by expert, each
// expert's 4-bit gate_up GEMM, SiLU(gate) * up and 4-bit down GEMM over its own rows, every expert's work items
// spread over torch's threads at once. Each row's arithmetic is the one int4_linear and silu_mul give it one
// expert at a time: activations quantized per row and group, the same tile kernel over the same rows.
#include <torch/extension.h>

#include <algorithm>
#include <vector>

#include "bind_args.h"
#include "int4.h"
#include "layer.h"
#include "parallel.h"

namespace flexbatch {
namespace {

const Int4Kernels& int4() { return required(by_isa(avx512_int4, avx2_int4)); }
const LayerKernels& layer() { return required(by_isa(avx512_layer, avx2_layer)); }

// The 4-bit weights of one projection of every expert, as int4_linear takes one: codes [Np/16, Kp/8, 16, 4]
// uint8, scales and mins [Np/16, Kp/group, 16] float16; all of one shape.
struct Projection {
  std::vector<const uint8_t*> codes;
  std::vector<const uint16_t*> scales, mins;
  int64_t n, kp, ng, tiles, group;
};

Projection projection(const std::vector<at::Tensor>& codes, const std::vector<at::Tensor>& scales,
                      const std::vector<at::Tensor>& mins, int64_t n, int64_t group, const char* what) {
  Projection p{{}, {}, {}, n, codes.at(0).size(1) * 8, 0, codes.at(0).size(0), group};
  p.ng = p.kp / group;
  TORCH_CHECK(codes.size() == scales.size() && codes.size() == mins.size(), "int4_experts: ", what,
              ": as many scales and mins as codes");
  TORCH_CHECK(n <= p.tiles * 16 && n > (p.tiles - 1) * 16 && p.kp % group == 0, "int4_experts: ", what,
              ": n and group do not match the tiles");
  for (size_t e = 0; e < codes.size(); ++e) {
    TORCH_CHECK(codes[e].dim() == 4 && codes[e].size(0) == p.tiles && codes[e].size(1) * 8 == p.kp &&
                    codes[e].is_contiguous() && codes[e].scalar_type() == at::kByte,
                "int4_experts: ", what, ": every expert's codes must be contiguous uint8 of one shape");
    TORCH_CHECK(scales[e].is_contiguous() && mins[e].is_contiguous() && scales[e].scalar_type() == at::kHalf &&
                    mins[e].scalar_type() == at::kHalf && scales[e].numel() == p.tiles * p.ng * 16 &&
                    mins[e].numel() == p.tiles * p.ng * 16,
                "int4_experts: ", what, ": scales and mins must be contiguous float16 [Np/16, Kp/group, 16]");
    p.codes.push_back(codes[e].data_ptr<uint8_t>());
    p.scales.push_back(reinterpret_cast<const uint16_t*>(scales[e].data_ptr<at::Half>()));
    p.mins.push_back(reinterpret_cast<const uint16_t*>(mins[e].data_ptr<at::Half>()));
  }
  return p;
}

// x [R, K] (rows grouped by expert: expert e's are [starts[e], starts[e + 1])) -> y [R, n] = x W_e^T per expert,
// in x's dtype: work items (expert, row block of 64, pair of tiles), as int4_linear makes them for one expert.
at::Tensor experts_linear(const at::Tensor& x, const Projection& p, const std::vector<int64_t>& starts) {
  TORCH_CHECK(x.size(1) <= p.kp, "int4_experts: rows have more inputs than the weights");
  const int64_t R = x.size(0), rb = 64, pairs = (p.tiles + 1) / 2;
  auto codes = at::empty({R, p.kp}, x.options().dtype(at::kChar));
  auto scale = at::empty({R, p.ng}, x.options().dtype(at::kFloat));
  auto scaled_sum = at::empty({R, p.ng}, x.options().dtype(at::kFloat));
  const auto& k = int4();
  const int bf16 = out_kind_of(x.scalar_type()) == OUT_BF16;
  flexbatch::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    k.quantize_groups(x.data_ptr(), bf16, x.stride(0), x.size(1), r0, r1, codes.data_ptr<int8_t>(),
                      scale.data_ptr<float>(), scaled_sum.data_ptr<float>(), p.kp, p.group);
  });
  QuantRows rows{codes.data_ptr<int8_t>(), scale.data_ptr<float>(), scaled_sum.data_ptr<float>(), R, p.kp, p.group};
  std::vector<int64_t> items{0};  // items[e]: expert e's first work item
  for (size_t e = 0; e + 1 < starts.size(); ++e)
    items.push_back(items.back() + (starts[e + 1] - starts[e] + rb - 1) / rb * pairs);
  auto y = at::empty({R, p.n}, x.options());
  const int out_kind = out_kind_of(y.scalar_type());
  const int64_t esize = y.element_size();
  char* ybase = static_cast<char*>(y.data_ptr());
  flexbatch::parallel_for(0, items.back(), 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t e = std::upper_bound(items.begin(), items.end(), w) - items.begin() - 1;
      const int64_t local = w - items[e], b = local / pairs, t = 2 * (local % pairs);
      const int64_t r0 = starts[e] + b * rb, r1 = std::min(starts[e + 1], r0 + rb);
      const int ntiles = (int)std::min<int64_t>(2, p.tiles - t);
      Int4Tile pair[2];
      for (int j = 0; j < ntiles; ++j)
        pair[j] = Int4Tile{p.codes[e] + (t + j) * p.kp * 8, p.scales[e] + (t + j) * p.ng * 16,
                           p.mins[e] + (t + j) * p.ng * 16};
      const int cols = (int)std::min<int64_t>(16, p.n - (t + ntiles - 1) * 16);
      k.int4_tile_gemm(pair, ntiles, &rows, r0, r1, ybase + t * 16 * esize, p.n, cols, out_kind);
    }
  });
  return y;
}

// rows [R, H] float32 or bfloat16, grouped by expert (`starts`: each expert's first row, then R); each expert's
// gate_up [2F, H] and down [H, F] in the 4-bit tile layout -> down(SiLU(gate) * up) [R, H] in rows' dtype.
at::Tensor int4_experts(const at::Tensor& rows, const std::vector<int64_t>& starts,
                        const std::vector<at::Tensor>& gu_codes, const std::vector<at::Tensor>& gu_scales,
                        const std::vector<at::Tensor>& gu_mins, const std::vector<at::Tensor>& dn_codes,
                        const std::vector<at::Tensor>& dn_scales, const std::vector<at::Tensor>& dn_mins,
                        int64_t two_f, int64_t h, int64_t gu_group, int64_t dn_group) {
  TORCH_CHECK(rows.dim() == 2 && rows.is_contiguous() && rows.device().is_cpu(),
              "int4_experts: rows must be a contiguous [R, H] CPU tensor");
  TORCH_CHECK(starts.size() == gu_codes.size() + 1 && !gu_codes.empty() && starts.front() == 0 &&
                  starts.back() == rows.size(0) && std::is_sorted(starts.begin(), starts.end()) && two_f % 2 == 0,
              "int4_experts: starts must be each expert's first row, ascending, then the row count");
  const auto gu = projection(gu_codes, gu_scales, gu_mins, two_f, gu_group, "gate_up");
  const auto dn = projection(dn_codes, dn_scales, dn_mins, h, dn_group, "down");
  TORCH_CHECK(dn_codes.size() == gu_codes.size(), "int4_experts: as many down projections as gate_up ones");
  const auto gate_up = experts_linear(rows, gu, starts);
  const int64_t f = two_f / 2, R = rows.size(0);
  auto gated = at::empty({R, f}, rows.options());
  const auto& l = layer();
  const int bf16 = rows.scalar_type() == at::kBFloat16;
  flexbatch::parallel_for(0, R, std::max<int64_t>(1, (1 << 15) / two_f), [&](int64_t r0, int64_t r1) {
    l.silu_mul(gate_up.data_ptr(), two_f, gated.data_ptr(), f, f, bf16, r0, r1);
  });
  return experts_linear(gated, dn, starts);
}

}  // namespace

void bind_moe(pybind11::module_& m) {
  m.def("int4_experts", &int4_experts, "each expert's 4-bit gate_up, SiLU * up and down over its rows, in one call");
}

}  // namespace flexbatch
