// Which instruction set the kernels run with: chosen once from what the CPU reports (or pinned lower by
// FLEXBATCH_ISA), read by every family's bindings to pick its table of kernels.
#pragma once

namespace flexbatch {

enum class Isa { none = 0, avx2 = 1, avx512 = 2 };

Isa current_isa();

}  // namespace flexbatch
