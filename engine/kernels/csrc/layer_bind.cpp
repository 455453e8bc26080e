// Tensor entry points of a layer's row-wise work (engine/kernels/layer_ops.py): rows spread over torch's threads,
// in blocks big enough that a decode step's few rows stay on one thread.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "isa.h"
#include "layer.h"

namespace flexbatch {
namespace {

const LayerKernels& kernels() {
  switch (current_isa()) {
    case Isa::avx512: return *avx512_layer();
    case Isa::avx2: return *avx2_layer();
    default: TORCH_CHECK(false, "flexbatch kernels: no supported instruction set on this CPU (AVX2 at least)");
  }
}

constexpr int64_t kValuesPerTask = 1 << 15;  // below this a thread's share costs more to hand out than to run

int64_t grain(int64_t width) { return std::max<int64_t>(1, kValuesPerTask / std::max<int64_t>(1, width)); }

int is_bf16(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, what,
              ": float32 or bfloat16 only, got ", t.scalar_type());
  return t.scalar_type() == at::kBFloat16;
}

void check_rows(const at::Tensor& t, int64_t rows, int64_t width, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == width && t.stride(1) == 1, what, " must be [",
              rows, ", ", width, "] with contiguous rows");
}

// h [R, n] float32 (+ delta [R, n]) -> (h_out, x): h_out = h + delta (h itself, updated, when in_place; a new
// tensor otherwise; h when there is no delta), x = rmsnorm(h_out) * w in w's dtype.
std::vector<at::Tensor> add_rms_norm(const at::Tensor& h, const c10::optional<at::Tensor>& delta,
                                     const at::Tensor& w, double eps, bool in_place) {
  TORCH_CHECK(h.scalar_type() == at::kFloat, "add_rms_norm: h must be float32");
  const int64_t R = h.size(0), n = h.size(-1);
  check_rows(h, R, n, "add_rms_norm: h");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == n && w.is_contiguous(), "add_rms_norm: w must be [n] contiguous");
  const int bf16 = is_bf16(w, "add_rms_norm: w");
  int delta_bf16 = 0;
  const void* dptr = nullptr;
  int64_t ldd = 0;
  at::Tensor h_out = h;
  if (delta.has_value()) {
    check_rows(*delta, R, n, "add_rms_norm: delta");
    delta_bf16 = is_bf16(*delta, "add_rms_norm: delta");
    dptr = delta->data_ptr();
    ldd = delta->stride(0);
    if (!in_place) h_out = at::empty({R, n}, h.options());
  }
  auto x = at::empty({R, n}, w.options());
  float* optr = delta.has_value() ? h_out.data_ptr<float>() : nullptr;
  const auto& k = kernels();
  at::parallel_for(0, R, grain(n), [&](int64_t r0, int64_t r1) {
    k.add_rms_norm(h.data_ptr<float>(), h.stride(0), dptr, delta_bf16, ldd, optr, h_out.stride(0), w.data_ptr(),
                   x.data_ptr(), n, bf16, n, (float)eps, r0, r1);
  });
  return {h_out, x};
}

// gate_up [R, 2F] -> silu(gate) * up [R, F] in gate_up's dtype.
at::Tensor silu_mul(const at::Tensor& gate_up) {
  const int64_t R = gate_up.size(0), f = gate_up.size(-1) / 2;
  check_rows(gate_up, R, 2 * f, "silu_mul: gate_up");
  const int bf16 = is_bf16(gate_up, "silu_mul: gate_up");
  auto out = at::empty({R, f}, gate_up.options());
  const auto& k = kernels();
  at::parallel_for(0, R, grain(2 * f), [&](int64_t r0, int64_t r1) {
    k.silu_mul(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), f, f, bf16, r0, r1);
  });
  return out;
}

// qkv [R, W]: its first `heads` heads of d values rotated in place by cos, sin [R, d] (one row per row of qkv,
// in qkv's dtype).
void rope_(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t heads, int64_t d) {
  const int64_t R = qkv.size(0);
  TORCH_CHECK(d % 2 == 0 && heads * d <= qkv.size(-1), "rope: heads x d must fit in a row, d even");
  check_rows(qkv, R, qkv.size(-1), "rope: qkv");
  check_rows(cos, R, d, "rope: cos");
  check_rows(sin, R, d, "rope: sin");
  TORCH_CHECK(cos.stride(0) == sin.stride(0), "rope: cos and sin must have the same row stride");
  const int bf16 = is_bf16(qkv, "rope: qkv");
  TORCH_CHECK(cos.scalar_type() == qkv.scalar_type() && sin.scalar_type() == qkv.scalar_type(),
              "rope: cos and sin must be in qkv's dtype");
  const auto& k = kernels();
  at::parallel_for(0, R, grain(heads * d), [&](int64_t r0, int64_t r1) {
    k.rope(qkv.data_ptr(), qkv.stride(0), heads, d, cos.data_ptr(), sin.data_ptr(), cos.stride(0), bf16, r0, r1);
  });
}

}  // namespace

void bind_layer(pybind11::module_& m) {
  m.def("add_rms_norm", &add_rms_norm, "h (+ delta) and RMSNorm of it times w, one pass over each row",
        pybind11::arg("h"), pybind11::arg("delta"), pybind11::arg("w"), pybind11::arg("eps"),
        pybind11::arg("in_place"));
  m.def("silu_mul", &silu_mul, "silu(gate) * up from gate_up [R, 2F], one pass");
  m.def("rope_", &rope_, "rotary positions applied in place to the first heads of each row of qkv");
}

}  // namespace flexbatch
