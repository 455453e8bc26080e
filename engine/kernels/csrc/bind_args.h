// What the families' tensor entry points (*_bind.cpp) share: the chosen set's kernels or the error that none runs,
// the float32 / bfloat16 check, and [*, K] operands seen as rows.
#pragma once
#include <torch/extension.h>

#include "isa.h"
#include "out.h"

namespace flexbatch {

// The table by_isa chose, or an error where this CPU runs none of the sets.
template <class T>
const T& required(const T* table) {
  TORCH_CHECK(table != nullptr, "flexbatch kernels: no supported instruction set on this CPU (AVX2 at least)");
  return *table;
}

inline int out_kind_of(at::ScalarType t) {
  TORCH_CHECK(t == at::kFloat || t == at::kBFloat16, "flexbatch kernels: float32 or bfloat16 only, got ", t);
  return t == at::kFloat ? OUT_F32 : OUT_BF16;
}

// x [*, K] as [M, K] with contiguous rows (a view where it can be).
inline at::Tensor as_rows(const at::Tensor& x) {
  auto rows = x.reshape({-1, x.size(-1)});
  return rows.stride(-1) == 1 ? rows : rows.contiguous();
}

// y [M, N] computed from as_rows(x), viewed with x's leading dimensions: [*, N].
inline at::Tensor shaped_like(const at::Tensor& y, const at::Tensor& x) {
  auto shape = x.sizes().vec();
  shape.back() = y.size(1);
  return y.view(shape);
}

}  // namespace flexbatch
