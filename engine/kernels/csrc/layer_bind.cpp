// Tensor entry points of a layer's row-wise work (engine/kernels/layer_ops.py): rows spread over torch's threads,
// in blocks big enough that a decode step's few rows stay on one thread. Each entry point checks its operands
// itself and returns None for those it does not take (no instruction set, off the CPU, a dtype other than
// float32 / bfloat16, rows that are not evenly strided): one call from Python, which then runs PyTorch.
#include <torch/extension.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "isa.h"
#include "layer.h"
#include "parallel.h"

namespace flexbatch {
namespace {

const LayerKernels* kernels() { return by_isa(avx512_layer, avx2_layer); }

constexpr int64_t kValuesPerTask = 1 << 15;  // below this a thread's share costs more to hand out than to run

int64_t grain(int64_t width) { return std::max<int64_t>(1, kValuesPerTask / std::max<int64_t>(1, width)); }

bool cpu_f32_or_bf16(const at::Tensor& t) {
  return t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

// The row stride of t seen as [rows, t.size(-1)] without a copy (its last dimension contiguous, the others
// collapsing into one with rows at least a row apart), or -1 where it cannot be.
int64_t row_stride(const at::Tensor& t) {
  const int64_t n = t.dim() ? t.size(-1) : 0;
  if (t.dim() == 0 || (n > 1 && t.stride(-1) != 1)) return -1;
  int64_t ld = -1, next = 0;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (ld == -1) ld = t.stride(d), next = ld * t.size(d);
    else if (t.stride(d) != next) return -1;
    else next *= t.size(d);
  }
  if (ld == -1) return n;
  return ld >= n ? ld : -1;
}

int64_t rows_of(const at::Tensor& t) { return t.size(-1) ? t.numel() / t.size(-1) : 0; }

// h [*, n] float32 (+ delta [*, n]) -> (h_out, x): h_out = h + delta (h itself, updated, when in_place; a new
// tensor otherwise; h when there is no delta), x = rmsnorm(h_out) * w in w's dtype. None where the kernel does
// not take the operands (the caller runs PyTorch).
std::optional<std::tuple<at::Tensor, at::Tensor>> add_rms_norm(const at::Tensor& h,
                                                               const std::optional<at::Tensor>& delta,
                                                               const at::Tensor& w, double eps, bool in_place) {
  const LayerKernels* k = kernels();
  const int64_t ldh = row_stride(h), ldd = delta ? row_stride(*delta) : 0;
  if (!k || ldh < 0 || !h.device().is_cpu() || h.scalar_type() != at::kFloat || !cpu_f32_or_bf16(w) ||
      w.dim() != 1 || w.size(0) != h.size(-1) || !w.is_contiguous())
    return std::nullopt;
  if (delta && (ldd < 0 || !cpu_f32_or_bf16(*delta) || delta->sizes() != h.sizes())) return std::nullopt;
  const int64_t R = rows_of(h), n = h.size(-1);
  const int bf16 = w.scalar_type() == at::kBFloat16, delta_bf16 = delta && delta->scalar_type() == at::kBFloat16;
  at::Tensor h_out = delta && !in_place ? at::empty(h.sizes(), h.options()) : h;
  const int64_t ldo = h_out.is_same(h) ? ldh : n;
  auto x = at::empty(h.sizes(), w.options());
  const float* hp = h.data_ptr<float>();
  float* op = delta ? h_out.data_ptr<float>() : nullptr;
  const void* dp = delta ? delta->data_ptr() : nullptr;
  flexbatch::parallel_for(0, R, grain(n), [&](int64_t r0, int64_t r1) {
    k->add_rms_norm(hp, ldh, dp, delta_bf16, ldd, op, ldo, w.data_ptr(), x.data_ptr(), n, bf16, n, (float)eps, r0,
                    r1);
  });
  return std::make_tuple(h_out, x);
}

// gate_up [*, 2F] -> silu(gate) * up [*, F] in gate_up's dtype; None where the kernel does not take it.
std::optional<at::Tensor> silu_mul(const at::Tensor& gate_up) {
  const LayerKernels* k = kernels();
  const int64_t ld = row_stride(gate_up);
  if (!k || ld < 0 || !cpu_f32_or_bf16(gate_up) || gate_up.size(-1) % 2) return std::nullopt;
  const int64_t R = rows_of(gate_up), f = gate_up.size(-1) / 2;
  auto shape = gate_up.sizes().vec();
  shape.back() = f;
  auto out = at::empty(shape, gate_up.options());
  const int bf16 = gate_up.scalar_type() == at::kBFloat16;
  flexbatch::parallel_for(0, R, grain(2 * f), [&](int64_t r0, int64_t r1) {
    k->silu_mul(gate_up.data_ptr(), ld, out.data_ptr(), f, f, bf16, r0, r1);
  });
  return out;
}

// logits [*, V] float32 -> the first index of each row's largest value [*] int64, as torch.argmax(-1) gives it;
// None where the kernel does not take the operand.
std::optional<at::Tensor> argmax_rows(const at::Tensor& logits) {
  const LayerKernels* k = kernels();
  const int64_t ld = row_stride(logits);
  if (!k || ld < 0 || !logits.device().is_cpu() || logits.scalar_type() != at::kFloat || logits.size(-1) == 0)
    return std::nullopt;
  const int64_t R = rows_of(logits), n = logits.size(-1);
  auto shape = logits.sizes().vec();
  shape.pop_back();
  auto out = at::empty(shape, logits.options().dtype(at::kLong));
  const float* x = logits.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  flexbatch::parallel_for(0, R, grain(n), [&](int64_t r0, int64_t r1) { k->argmax(x, ld, n, o, r0, r1); });
  return out;
}

// qkv [B, S, (NH + 2 KVH) D]: q and k rotated in place by cos, sin [B, 1, S, D] (contiguous, qkv's dtype), and
// returned with v as views q [B, NH, S, D], k, v [B, KVH, S, D]. None (nothing done) where the kernel does not
// take the operands.
std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> rope_qkv(at::Tensor& qkv, const at::Tensor& cos,
                                                                       const at::Tensor& sin, int64_t nh,
                                                                       int64_t kvh, int64_t d) {
  const LayerKernels* k = kernels();
  if (!k || qkv.dim() != 3 || !cpu_f32_or_bf16(qkv) || d % 2 || qkv.size(2) != (nh + 2 * kvh) * d) return std::nullopt;
  const int64_t B = qkv.size(0), S = qkv.size(1), W = qkv.size(2), ld = row_stride(qkv);
  for (const auto* t : {&cos, &sin})
    if (t->dim() != 4 || t->size(0) != B || t->size(1) != 1 || t->size(2) != S || t->size(3) != d ||
        !t->is_contiguous() || t->scalar_type() != qkv.scalar_type() || !t->device().is_cpu())
      return std::nullopt;
  if (ld < 0) return std::nullopt;
  const int bf16 = qkv.scalar_type() == at::kBFloat16;
  flexbatch::parallel_for(0, B * S, grain((nh + kvh) * d), [&](int64_t r0, int64_t r1) {
    k->rope(qkv.data_ptr(), ld, nh + kvh, d, cos.data_ptr(), sin.data_ptr(), d, bf16, r0, r1);
  });
  // rows (b, s) are ld apart whatever B and S, so batch b starts S * ld in
  const int64_t off = qkv.storage_offset();
  auto heads = [&](int64_t n, int64_t first) {
    return qkv.as_strided({B, n, S, d}, {S * ld, d, ld, 1}, off + first * d);
  };
  return std::make_tuple(heads(nh, 0), heads(kvh, nh), heads(kvh, nh + kvh));
}

}  // namespace

void bind_layer(pybind11::module_& m) {
  m.def("add_rms_norm", &add_rms_norm, "(h + delta, RMSNorm of it times w), one pass over each row; None where not taken",
        pybind11::arg("h"), pybind11::arg("delta"), pybind11::arg("w"), pybind11::arg("eps"),
        pybind11::arg("in_place"));
  m.def("silu_mul", &silu_mul, "silu(gate) * up from gate_up [*, 2F], one pass; None where not taken");
  m.def("argmax_rows", &argmax_rows, "the first index of each row's largest value (NaN largest); None where not taken");
  m.def("rope_qkv", &rope_qkv, "q and k of qkv [B, S, W] rotated in place, and q, k, v as head views; None where not taken");
}

}  // namespace flexbatch
