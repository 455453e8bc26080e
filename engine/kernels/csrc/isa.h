// Which instruction set the kernels run with: chosen once from what the CPU reports (or pinned lower by
// FLEXBATCH_ISA), read by every family's bindings to pick its table of kernels.
#pragma once

namespace flexbatch {

enum class Isa { none = 0, avx2 = 1, avx512 = 2 };

Isa current_isa();

// A family's table of kernels for the chosen set (e.g. by_isa(avx512_attn, avx2_attn)), or null where none runs.
template <class T>
const T* by_isa(const T* (*avx512)(), const T* (*avx2)()) {
  switch (current_isa()) {
    case Isa::avx512: return avx512();
    case Isa::avx2: return avx2();
    default: return nullptr;
  }
}

}  // namespace flexbatch
