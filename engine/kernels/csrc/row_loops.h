// The row loops of the kernels that work row by row (layer.h's, and the activations' quantization of int4.h and
// int8.h), written once: each set's file passes the kernel of one row as the template argument, inlined into the
// loop. For files compiled for one instruction set; in an anonymous namespace, so that each instance stays in its
// own object file.
#pragma once
#include <stdint.h>

namespace flexbatch {
namespace {

// Byte address of row r of storage p with row stride ld (elements of 2 or 4 bytes by bf16).
inline const void* row_of(const void* p, int64_t r, int64_t ld, int bf16) {
  return static_cast<const char*>(p) + r * ld * (bf16 ? 2 : 4);
}
inline void* row_of(void* p, int64_t r, int64_t ld, int bf16) {
  return static_cast<char*>(p) + r * ld * (bf16 ? 2 : 4);
}

template <void (*Row)(const void* x, int bf16, int64_t k, int8_t* codes, float* scale, float* scaled_sum, int64_t kp,
                      int64_t group)>
void quantize_groups_rows(const void* x, int bf16, int64_t ldx, int64_t k, int64_t r0, int64_t r1, int8_t* codes,
                          float* scale, float* scaled_sum, int64_t kp, int64_t group) {
  const int64_t ng = kp / group;
  for (int64_t r = r0; r < r1; ++r)
    Row(row_of(x, r, ldx, bf16), bf16, k, codes + r * kp, scale + r * ng, scaled_sum + r * ng, kp, group);
}

template <void (*Row)(const void* x, int bf16, int64_t k, uint8_t* codes, float* scale, int64_t kp)>
void quantize_rows(const void* x, int bf16, int64_t ldx, int64_t k, int64_t r0, int64_t r1, uint8_t* codes,
                   float* scale, int64_t kp) {
  for (int64_t r = r0; r < r1; ++r) Row(row_of(x, r, ldx, bf16), bf16, k, codes + r * kp, scale + r, kp);
}

template <void (*Row)(const float* h, const void* delta, int delta_bf16, float* h_out, const void* w, void* x,
                      int bf16, int64_t n, float eps)>
void add_rms_norm_rows(const float* h, int64_t ldh, const void* delta, int delta_bf16, int64_t ldd, float* h_out,
                       int64_t ldo, const void* w, void* x, int64_t ldx, int bf16, int64_t n, float eps, int64_t r0,
                       int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    Row(h + r * ldh, delta ? row_of(delta, r, ldd, delta_bf16) : nullptr, delta_bf16,
        h_out ? h_out + r * ldo : nullptr, w, row_of(x, r, ldx, bf16), bf16, n, eps);
}

template <void (*Row)(const void* gu, void* out, int64_t f, int bf16)>
void silu_mul_rows(const void* gu, int64_t ldg, void* out, int64_t ldo, int64_t f, int bf16, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) Row(row_of(gu, r, ldg, bf16), row_of(out, r, ldo, bf16), f, bf16);
}

template <void (*Row)(void* qkv, int64_t heads, int64_t d, const void* cos, const void* sin, int bf16)>
void rope_rows(void* qkv, int64_t ld, int64_t heads, int64_t d, const void* cos, const void* sin, int64_t ldt,
               int bf16, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    Row(row_of(qkv, r, ld, bf16), heads, d, row_of(cos, r, ldt, bf16), row_of(sin, r, ldt, bf16), bf16);
}

template <int64_t (*Row)(const float* x, int64_t n)>
void argmax_rows(const float* x, int64_t ld, int64_t n, int64_t* out, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) out[r] = Row(x + r * ld, n);
}

// The first NaN of x[0, n), or -1: the answer of an argmax over a row that holds one.
inline int64_t first_nan(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (x[i] != x[i]) return i;
  return -1;
}

// An argmax over x[0, n) one value at a time (rows too short for a vector).
inline int64_t argmax_scalar(const float* x, int64_t n) {
  const int64_t nan = first_nan(x, n);
  if (nan >= 0) return nan;
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace
}  // namespace flexbatch
