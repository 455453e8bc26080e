// A Llama layer's row-wise work each instruction set provides, over raw pointers (no torch types): RMSNorm with
// the residual add before it, SiLU(gate) * up, rotary positions applied in place, and the greedy choice over the
// logits' rows. layer_avx512.cpp and layer_avx2.cpp define them, compiled with their own -m flags; layer_bind.cpp
// chooses a table at run time.
//
// Values are float32 or bfloat16 (stored as uint16_t), by a flag per operand. The arithmetic is float32 and
// rounds to bfloat16 exactly where the PyTorch reference (engine/kernels/layer_ops.py) rounds: each of its ops
// on bfloat16 tensors computes in float32 and rounds its result once.
#pragma once
#include <stdint.h>

namespace flexbatch {

struct LayerKernels {
  const char* name;
  // Rows [r0, r1) of n values: s = h + delta (delta float32 or bfloat16; none when delta is null), stored in
  // h_out when it is not null (it may be h), then x = (s * (1 / sqrt(mean(s^2) + eps))) rounded to w's dtype,
  // times w (rounded again for bfloat16). `bf16`: w and x are bfloat16, else float32. Row strides ld*.
  void (*add_rms_norm)(const float* h, int64_t ldh, const void* delta, int delta_bf16, int64_t ldd, float* h_out,
                       int64_t ldo, const void* w, void* x, int64_t ldx, int bf16, int64_t n, float eps, int64_t r0,
                       int64_t r1);
  // Rows [r0, r1): out[j] = silu(gu[j]) * gu[f + j] for j < f, silu(g) = g / (1 + exp(-g)) rounded to the
  // dtype before the product (as F.silu(gate).mul_(up) does).
  void (*silu_mul)(const void* gu, int64_t ldg, void* out, int64_t ldo, int64_t f, int bf16, int64_t r0, int64_t r1);
  // Rows [r0, r1) of qkv (row stride ld): its first `heads` heads of d values rotated in place by the row's
  // cos and sin (row stride ldt, the first d / 2 values read): with halves (x1, x2),
  // (x1 c - x2 s, x2 c + x1 s), each product rounded to the dtype before the sum.
  void (*rope)(void* qkv, int64_t ld, int64_t heads, int64_t d, const void* cos, const void* sin, int64_t ldt,
               int bf16, int64_t r0, int64_t r1);
  // Rows [r0, r1) of n float32 values (row stride ld): out[r] = the first index of the row's largest value, a NaN
  // counting as larger than any number (its first NaN), as torch.argmax chooses.
  void (*argmax)(const float* x, int64_t ld, int64_t n, int64_t* out, int64_t r0, int64_t r1);
};

const LayerKernels* avx512_layer();
const LayerKernels* avx2_layer();

}  // namespace flexbatch
