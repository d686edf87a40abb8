// Scalar math shared by the CUDA scan kernels (v3 tiles and v4 rows): the softplus of the step
// size and the special-function exp2 / log2 forms they use. Plain device / host code, no includes
// beyond the qualifiers (NVRTC compiles it as is; math functions are its builtins there).
#pragma once

#ifndef __CUDACC_RTC__
#include <math.h>
#endif

#include "scan2d_macros.h"

namespace vmamba2d {
namespace scan2d {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// log2(x) for x in [1, 2]: on the GPU one special-function instruction (lg2.approx.f32, absolute
// error <= 2^-22.6 there, PTX ISA) where log2f adds a range reduction around it; libm's log2f on
// the host. (exp2f already compiles to the special-function ex2 with a subnormal fix-up.)
SS2D_HD SS2D_INLINE float log2_1_to_2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return log2f(x);
#endif
}

// 2^x on the GPU in one special-function instruction (ex2.approx.ftz.f32: results below 2^-126,
// x < -126, flush to 0 where exp2f adds a subnormal fix-up around the same instruction); libm's
// exp2f on the host.
SS2D_HD SS2D_INLINE float exp2_flush(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// torch.nn.functional.softplus with its default threshold 20, in about half the instructions of
// log1pf(expf(z)): softplus(z) = max(z, 0) + log1p(t) with t = exp(-|z|) in (0, 1]. log1p(t) is
// log2(1 + t) * ln 2 where 1 + t keeps enough of t (t >= 2^-5: rounding 1 + t costs <= 2^-24 /
// 0.0308 = 2e-6 relative, lg2.approx <= 2^-22.6 / 0.044 = 4e-6), else the series t - t^2/2 + c t^3
// with c = 0.3265 (1/3 lowered so the truncation error changes sign inside [0, 2^-5]: <= 8e-7
// relative there, where t^3/3 alone leaves t^3/4 = 7.6e-6; one multiply-add fewer than the t^4
// term). The rounding of |z| * log2(e) before exp2f adds <= |z| * 2^-24 relative in t, 5e-6 at
// z = -87 (series side). The relative error stays below
// 1e-5 wherever softplus(z) is a normal float (z >= -87); tests/ops/compiled/test_scan_cuda.py checks the
// bound on the host build (libm's log2f), the GPU tests the kernel's results. Above the threshold
// (z > 20) no test is needed: t < 2.1e-9 is below half an ulp of z, so z + log1p(t) rounds to z.
// Both sides work in log2 units (the series' coefficients times log2(e)), so one fused
// multiply-add turns the chosen one into nats and adds max(z, 0).
SS2D_HD SS2D_INLINE float softplus(float z) {
  const float t = exp2_flush(-fabsf(z) * kLog2e);
  const float series = t * (kLog2e - t * (kLog2e / 2 - t * (kLog2e * 0.3265f)));
  const float log2_1p_t = t < 0.03125f ? series : log2_1_to_2(1.f + t);
  return fmaf(log2_1p_t, kLn2, fmaxf(z, 0.f));
}

}  // namespace scan2d
}  // namespace vmamba2d
