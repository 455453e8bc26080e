// float32 vectors of W lanes as the kernels use them, written once for both instruction sets: the type and the
// operations whose intrinsics differ only by their prefix (_mm256_ or _mm512_), as one macro each set's Lanes
// struct expands (simd_avx2.h: Lanes8, simd_avx512.h: Lanes16, which add round and sum), and the arithmetic built
// on them. Holds no intrinsic itself, so a file sees only those its own set's header names; in an anonymous
// namespace, so that each instance stays in its own object file.
#pragma once

// Vector type F of W lanes, intrinsics prefix P: zero, set1, fmadd (a b + c), fnmadd (c - a b), mul, loadu, store.
#define FLEXBATCH_LANES(V, N, P)                                         \
  using F = V;                                                          \
  static constexpr int W = N;                                           \
  static F zero() { return P##_setzero_ps(); }                          \
  static F set1(float x) { return P##_set1_ps(x); }                     \
  static F fmadd(F a, F b, F c) { return P##_fmadd_ps(a, b, c); }       \
  static F fnmadd(F a, F b, F c) { return P##_fnmadd_ps(a, b, c); }     \
  static F mul(F a, F b) { return P##_mul_ps(a, b); }                   \
  static F loadu(const float* p) { return P##_loadu_ps(p); }            \
  static void store(float* p, F x) { P##_storeu_ps(p, x); }

namespace flexbatch {
namespace {

// Cephes' e^x, the steps every exponential here takes (each clamps x first and forms e^r ~ 1 + r + r^2 p its own
// way, which its callers' results are pinned to): n = x log2(e) rounded, r = x - n ln 2 (ln 2 in two parts), and
// the polynomial p(r) returned.
template <class V>
typename V::F exp_poly(typename V::F x, typename V::F* n, typename V::F* r) {
  *n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
  *r = V::fnmadd(*n, V::set1(0.693359375f), x);
  *r = V::fnmadd(*n, V::set1(-2.12194440e-4f), *r);
  typename V::F p = V::set1(1.9875691500e-4f);
  p = V::fmadd(p, *r, V::set1(1.3981999507e-3f));
  p = V::fmadd(p, *r, V::set1(8.3334519073e-3f));
  p = V::fmadd(p, *r, V::set1(4.1665795894e-2f));
  p = V::fmadd(p, *r, V::set1(1.6666665459e-1f));
  return V::fmadd(p, *r, V::set1(5.0000001201e-1f));
}

}  // namespace
}  // namespace flexbatch
