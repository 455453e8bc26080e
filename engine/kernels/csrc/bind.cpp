// The Python module: which instruction set runs (chosen from what the CPU reports, or pinned lower), and each
// family's entry points (its *_bind.cpp), which split their work over torch's threads and call the chosen set's
// kernels on raw pointers.
#include <torch/extension.h>

#include <stdexcept>
#include <string>

#include "isa.h"

namespace flexbatch {

void bind_int4(pybind11::module_& m);
void bind_int8(pybind11::module_& m);
void bind_layer(pybind11::module_& m);
void bind_attn(pybind11::module_& m);
void bind_moe(pybind11::module_& m);
void bind_mxfp4(pybind11::module_& m);
void bind_bf16w(pybind11::module_& m);

namespace {

Isa chosen = Isa::none;

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

const char* name(Isa isa) { return isa == Isa::avx512 ? "avx512" : isa == Isa::avx2 ? "avx2" : "none"; }

// The best set this CPU runs, no higher than `pin` ("" for no pin; "avx2"; "scalar": none of them).
std::string select_isa(const std::string& pin) {
  if (pin != "" && pin != "avx2" && pin != "avx512" && pin != "scalar")
    throw std::invalid_argument("FLEXBATCH_ISA='" + pin + "' is invalid: use avx512, avx2 or scalar");
  chosen = Isa::none;
  if ((pin == "" || pin == "avx512") && cpu_has_avx512()) chosen = Isa::avx512;
  else if (pin != "scalar" && cpu_has_avx2()) chosen = Isa::avx2;
  return name(chosen);
}

}  // namespace

Isa current_isa() { return chosen; }

}  // namespace flexbatch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "flexbatch's own CPU kernels (engine/kernels/compiled.py)";
  m.def("select_isa", &flexbatch::select_isa, "choose the instruction set ('' = the best this CPU runs)");
  m.def("isa", [] { return std::string(flexbatch::name(flexbatch::current_isa())); }, "the instruction set chosen");
  flexbatch::bind_int4(m);
  flexbatch::bind_int8(m);
  flexbatch::bind_layer(m);
  flexbatch::bind_attn(m);
  flexbatch::bind_moe(m);
  flexbatch::bind_mxfp4(m);
  flexbatch::bind_bf16w(m);
}
