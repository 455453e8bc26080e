// Tensor entry points of decode attention (engine/kernels/own_attention.py): one work item per (row, KV head),
// spread over torch's threads; each folds its slots into the online-softmax state (m, l, o) in place.
#include <torch/extension.h>

#include <vector>

#include "attn.h"
#include "bind_args.h"
#include "parallel.h"

namespace flexbatch {
namespace {

const AttnKernels& kernels() { return required(by_isa(avx512_attn, avx2_attn)); }

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Everything a work item needs but its cache: q padded to dp, the mask as bytes, the state's checks.
struct Prepared {
  at::Tensor q, mask;
  int64_t B, KVH, n, D, T, dp;
};

Prepared prepare(const at::Tensor& q, const at::Tensor& mask, int64_t T, int64_t dp_min, const at::Tensor& m,
                 const at::Tensor& l, const at::Tensor& o) {
  TORCH_CHECK(q.dim() == 4, "attn: q must be [B, KVH, n, D]");
  Prepared p{at::Tensor(), at::Tensor(), q.size(0), q.size(1), q.size(2), q.size(3), T, 0};
  TORCH_CHECK(p.D % 16 == 0 && p.D <= 256, "attn: the head size must be a multiple of 16 up to 256, got ", p.D);
  p.dp = std::max(round_up(p.D, 32), dp_min);
  p.q = at::zeros({p.B, p.KVH, p.n, p.dp}, q.options().dtype(at::kFloat));
  p.q.narrow(3, 0, p.D).copy_(q);
  if (mask.numel()) {
    TORCH_CHECK(mask.dim() == 2 && mask.size(0) == p.B && mask.size(1) == T, "attn: mask must be [B, T]");
    p.mask = mask.to(at::kByte).contiguous();
  }
  for (const auto* s : {&m, &l, &o})
    TORCH_CHECK(s->scalar_type() == at::kFloat && s->is_contiguous(), "attn: the state must be contiguous float32");
  TORCH_CHECK(m.numel() == p.B * p.KVH * p.n && l.numel() == m.numel() && o.numel() == m.numel() * p.D,
              "attn: the state must be m, l [B, KVH, n] and o [B, KVH, n, D]");
  return p;
}

// Run fn(query, item) for every (row, KV head) item, each with its own scratch.
template <typename F>
void for_items(const Prepared& p, float scale, int precise, at::Tensor& m, at::Tensor& l, at::Tensor& o, F fn) {
  const int64_t items = p.B * p.KVH, bytes = attn_scratch_bytes(p.n, p.T, p.dp);
  const uint8_t* mask = p.mask.defined() ? p.mask.data_ptr<uint8_t>() : nullptr;
  float *mp = m.data_ptr<float>(), *lp = l.data_ptr<float>(), *op = o.data_ptr<float>();
  const float* qp = p.q.data_ptr<float>();
  flexbatch::parallel_for(0, items, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scratch(bytes / 4 + 16);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / p.KVH, h = i % p.KVH;
      AttnQuery a{qp + i * p.n * p.dp, p.n, p.D, p.dp, scale, mask ? mask + b * p.T : nullptr, p.T, precise,
                  mp + i * p.n, lp + i * p.n, op + i * p.n * p.D, scratch.data()};
      fn(a, b, h);
    }
  });
}

// Fold K, V [B, KVH, T, D] (float32 or bfloat16, rows contiguous, any other strides) into the state of queries
// q [B, KVH, n, D]; mask [B, T] (empty: every slot).
void attn_fold(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale,
               at::Tensor m, at::Tensor l, at::Tensor o) {
  TORCH_CHECK(k.dim() == 4 && v.sizes() == k.sizes() && k.scalar_type() == v.scalar_type(),
              "attn_fold: k and v must be [B, KVH, T, D] of one dtype");
  TORCH_CHECK(k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16, "attn_fold: float32 or bfloat16");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "attn_fold: k and v rows must be contiguous");
  auto p = prepare(q, mask, k.size(2), 0, m, l, o);
  TORCH_CHECK(k.size(0) == p.B && k.size(1) == p.KVH && k.size(3) == p.D, "attn_fold: q and k do not match");
  const int bf16 = k.scalar_type() == at::kBFloat16;
  const int64_t es = k.element_size();
  const char *kb = static_cast<const char*>(k.data_ptr()), *vb = static_cast<const char*>(v.data_ptr());
  const auto& kern = kernels();
  const int precise = bf16 && q.scalar_type() == at::kFloat;
  for_items(p, (float)scale, precise, m, l, o, [&](const AttnQuery& a, int64_t b, int64_t h) {
    PlainKv kv{kb + (b * k.stride(0) + h * k.stride(1)) * es, vb + (b * v.stride(0) + h * v.stride(1)) * es,
               k.stride(2), v.stride(2), bf16};
    kern.decode_plain(&a, &kv);
  });
}

Int4Kv int4_part(const at::Tensor& data, const at::Tensor& mins, const at::Tensor& scales, int64_t b, int64_t h,
                 int64_t group) {
  const auto* mp = reinterpret_cast<const uint16_t*>(mins.data_ptr<at::Half>());
  const auto* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const int64_t poff = b * mins.stride(0) + h * mins.stride(1);
  return Int4Kv{data.data_ptr<uint8_t>() + b * data.stride(0) + h * data.stride(1), mp + poff,
                sp + b * scales.stride(0) + h * scales.stride(1), data.stride(3), data.stride(2), mins.stride(2),
                data.size(2), group};
}

void check_int4(const at::Tensor& data, const at::Tensor& mins, const at::Tensor& scales, int64_t group) {
  TORCH_CHECK(data.dim() == 5 && data.scalar_type() == at::kByte && data.stride(4) == 1 && data.size(3) * 2 == group,
              "attn_fold_int4: data must be uint8 [B, KVH, groups, group / 2, T] with slots contiguous");
  TORCH_CHECK(mins.dim() == 4 && mins.sizes() == scales.sizes() && mins.strides() == scales.strides() &&
                  mins.scalar_type() == at::kHalf && scales.scalar_type() == at::kHalf && mins.stride(3) == 1,
              "attn_fold_int4: mins and scales must be float16 [B, KVH, groups, T] with slots contiguous");
  TORCH_CHECK(mins.size(2) == data.size(2) && mins.size(3) == data.size(4), "attn_fold_int4: parts do not match");
}

// The same over a 4-bit cache (engine/compression/int4.py, grouped along D): each of K and V as its data,
// mins and scales.
void attn_fold_int4(const at::Tensor& q, const at::Tensor& kd, const at::Tensor& kmin, const at::Tensor& ksc,
                    const at::Tensor& vd, const at::Tensor& vmin, const at::Tensor& vsc, int64_t group,
                    const at::Tensor& mask, double scale, at::Tensor m, at::Tensor l, at::Tensor o) {
  check_int4(kd, kmin, ksc, group);
  check_int4(vd, vmin, vsc, group);
  TORCH_CHECK(kd.sizes() == vd.sizes(), "attn_fold_int4: k and v must have one shape");
  auto p = prepare(q, mask, kd.size(4), kd.size(2) * group, m, l, o);
  TORCH_CHECK(kd.size(0) == p.B && kd.size(1) == p.KVH && kd.size(2) * group >= p.D &&
                  (kd.size(2) - 1) * group < p.D,
              "attn_fold_int4: q and the cache do not match");
  const auto& kern = kernels();
  for_items(p, (float)scale, 0, m, l, o, [&](const AttnQuery& a, int64_t b, int64_t h) {
    const Int4Kv kk = int4_part(kd, kmin, ksc, b, h, group), vv = int4_part(vd, vmin, vsc, b, h, group);
    kern.decode_int4(&a, &kk, &vv);
  });
}

// Prefill attention, bf16: q [B, NH, S, D], k/v [B, KVH, T, D] (rows contiguous, any other strides), mask
// [B, S, T] bool (empty: none, then `causal` says whether key n is visible to position i for n <= i + T - S).
// state: empty, or the (m, l, o) [B, KVH, g S] / [B, KVH, g S, D] float32 each query row starts from (row j S + i:
// head j of the KV head's group at position i).
at::Tensor attn_prefill(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                        bool causal, double scale, const std::vector<at::Tensor>& state) {
  const auto& kern = kernels();
  TORCH_CHECK(kern.prefill_bf16 != nullptr, "attn_prefill: this instruction set has no bf16 dot product");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(), "attn_prefill: q [B, NH, S, D], k/v [B, KVH, T, D]");
  for (const auto* x : {&q, &k, &v})
    TORCH_CHECK(x->scalar_type() == at::kBFloat16 && x->stride(3) == 1, "attn_prefill: bf16 with contiguous rows");
  const int64_t B = q.size(0), NH = q.size(1), S = q.size(2), D = q.size(3), KVH = k.size(1), T = k.size(2);
  TORCH_CHECK(k.size(0) == B && k.size(3) == D && NH % KVH == 0 && D % 16 == 0 && D <= 256,
              "attn_prefill: shapes do not match, or the head size is no multiple of 16 up to 256");
  at::Tensor m8;
  if (mask.numel()) {
    TORCH_CHECK(mask.dim() == 3 && mask.size(0) == B && mask.size(1) == S && mask.size(2) == T,
                "attn_prefill: mask must be [B, S, T]");
    m8 = mask.to(at::kByte).contiguous();
  }
  auto out = at::empty({B, NH, S, D}, q.options());
  const int64_t g = NH / KVH, bytes = prefill_scratch_bytes(g, T, D);
  TORCH_CHECK(state.empty() || state.size() == 3, "attn_prefill: state must be (m, l, o) or empty");
  for (const auto& x : state)
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.numel() % (B * KVH * g * S) == 0,
                "attn_prefill: the state must be contiguous float32 [B, KVH, g S(, D)]");
  const float* m0 = state.empty() ? nullptr : state[0].data_ptr<float>();
  const float* l0 = state.empty() ? nullptr : state[1].data_ptr<float>();
  const float* o0 = state.empty() ? nullptr : state[2].data_ptr<float>();
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  const auto* kp = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
  const auto* vp = reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const uint8_t* mp = m8.defined() ? m8.data_ptr<uint8_t>() : nullptr;
  flexbatch::parallel_for(0, B * KVH, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scratch(bytes / 4 + 16);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / KVH, h = i % KVH;
      PrefillItem it{qp + b * q.stride(0) + h * g * q.stride(1), q.stride(1), q.stride(2),
                     kp + b * k.stride(0) + h * k.stride(1), vp + b * v.stride(0) + h * v.stride(1),
                     k.stride(2), v.stride(2), op + b * out.stride(0) + h * g * out.stride(1), out.stride(1),
                     out.stride(2), g, S, T, D, mp ? mp + b * S * T : nullptr, T, causal, (float)scale,
                     m0 ? m0 + i * g * S : nullptr, l0 ? l0 + i * g * S : nullptr,
                     o0 ? o0 + i * g * S * D : nullptr, scratch.data()};
      kern.prefill_bf16(&it);
    }
  });
  return out;
}

}  // namespace

void bind_attn(pybind11::module_& m) {
  m.def("attn_prefill", &attn_prefill, "prefill attention over bf16 q, k, v (blocked, online softmax)");
  m.def("has_prefill", [] { return kernels().prefill_bf16 != nullptr; }, "whether the chosen set has attn_prefill");
  m.def("attn_fold", &attn_fold, "fold a float32/bf16 K/V cache into decode attention's online-softmax state");
  m.def("attn_fold_int4", &attn_fold_int4, "fold a 4-bit K/V cache into decode attention's online-softmax state");
}

}  // namespace flexbatch
