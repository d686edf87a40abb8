// Elementwise math for the CPU scan, written so that loops calling it vectorise.
//
// libm's expf / log1pf are opaque calls (and set errno), which keeps every loop using them scalar.
// For float the kernel uses the approximations below instead: plain arithmetic and bit operations
// the compiler turns into SIMD code, accurate to about 1 ulp (relative error < 2e-7). double keeps
// libm, so float64 results (and gradchecks) are exact to double precision.
//
// Like scan_2d_kernel.h, compiled once per instruction set inside namespace VMAMBA2D_ISA.
#ifndef VMAMBA2D_ISA
#error "define VMAMBA2D_ISA (the instruction-set namespace) before including scan_2d_math.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "scan_2d_types.h"

namespace vmamba2d {
namespace cpu {
namespace VMAMBA2D_ISA {

#ifndef VMAMBA2D_VECTOR_BYTES
#define VMAMBA2D_VECTOR_BYTES 16  // SSE2
#endif

// The channel-lane kernel's vectors (scan_2d_lanes_kernel.h): one register of the build,
// kVectorFloats floats, one channel per lane, as GCC vector types. Loads and stores go through
// memcpy: the maps give no alignment beyond a float's.
constexpr int64_t kVectorFloats = VMAMBA2D_VECTOR_BYTES / sizeof(float);
typedef float LaneFloats __attribute__((vector_size(VMAMBA2D_VECTOR_BYTES), aligned(sizeof(float)), may_alias));
typedef int32_t LaneInts __attribute__((vector_size(VMAMBA2D_VECTOR_BYTES), aligned(sizeof(int32_t)), may_alias));

// Lane-wise operations written once for a float and for LaneFloats, so that the approximations
// below give the channel-lane kernel the same values as the per-channel kernels.
template <typename F>
inline F lane_min(F a, F b) {
  return b < a ? b : a;  // std::min's comparison
}
template <typename F>
inline F lane_max(F a, F b) {
  return a < b ? b : a;  // std::max's comparison
}
inline float lane_abs(float x) { return std::fabs(x); }
inline LaneFloats lane_abs(LaneFloats x) { return x < 0.0f ? -x : x; }
inline int32_t lane_int(float x) { return static_cast<int32_t>(x); }
inline LaneInts lane_int(LaneFloats x) { return __builtin_convertvector(x, LaneInts); }
inline float lane_bits_as_float(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline LaneFloats lane_bits_as_float(LaneInts bits) {
  LaneFloats f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// exp(x): x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite split of ln2), exp(r) by its degree-7
// Taylor polynomial, 2^n built in the exponent bits. x is clamped to [-87, 88], where 2^n stays a
// normal float; below -87 the result is exp(-87) = 1.6e-38 instead of a smaller denormal.
template <typename F>
inline F exp_approx(F x) {
  x = lane_min(lane_max(x, F{} - 87.0f), F{} + 88.0f);
  const float round_magic = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const F n = (x * 1.44269504088896341f + round_magic) - round_magic;
  const F r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  F p = F{} + 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * lane_bits_as_float((lane_int(n) + 127) << 23);
}

// log(1 + t) for t in [0, 1]: 2 atanh(s) with s = t / (2 + t) <= 1/3, by its odd series to s^13.
template <typename F>
inline F log1p_unit_approx(F t) {
  const F s = t / (2.0f + t);
  const F s2 = s * s;
  F q = F{} + 1.0f / 13.0f;
  q = q * s2 + 1.0f / 11.0f;
  q = q * s2 + 1.0f / 9.0f;
  q = q * s2 + 1.0f / 7.0f;
  q = q * s2 + 1.0f / 5.0f;
  q = q * s2 + 1.0f / 3.0f;
  q = q * s2 + 1.0f;
  return 2.0f * s * q;
}

// softplus(z) = max(z, 0) + log(1 + exp(-|z|)), exact rearrangement valid for every z.
template <typename F>
inline F softplus_approx(F z) {
  return lane_max(z, F{}) + log1p_unit_approx(exp_approx(-lane_abs(z)));
}

template <typename T>
struct Math;

template <>
struct Math<float> {
  static float exp(float x) { return exp_approx(x); }
  static float softplus(float z) { return softplus_approx(z); }
  static float sigmoid(float z) { return 1.0f / (1.0f + exp_approx(-z)); }
};

template <>
struct Math<double> {
  static double exp(double x) { return std::exp(x); }
  // Same threshold as torch.nn.functional.softplus (beta 1, threshold 20).
  static double softplus(double z) { return z > 20.0 ? z : std::log1p(std::exp(z)); }
  static double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }
};

// Sum of values[0 .. length) with eight interleaved partial sums (vectorisable, fixed order).
template <typename T>
T sum_values(const T* values, int64_t length) {
  constexpr int64_t kLanes = 8;
  T partial[kLanes] = {};
  int64_t p = 0;
  for (; p + kLanes <= length; p += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) partial[k] += values[p + k];
  }
  T total = T(0);
  for (; p < length; ++p) total += values[p];
  for (int64_t k = 0; k < kLanes; ++k) total += partial[k];
  return total;
}

}  // namespace VMAMBA2D_ISA
}  // namespace cpu
}  // namespace vmamba2d
