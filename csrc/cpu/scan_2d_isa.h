// The CPU kernel is compiled once per instruction set (scan_2d_isa_*.cpp) and the best one the
// running CPU supports is picked at run time, so the extension needs no -march flag: on x86-64
// with GCC there are AVX-512, AVX2 + FMA and baseline (SSE2) builds; elsewhere only the baseline.
// Set VMAMBA2D_CPU_ISA=baseline|avx2|avx512 to cap the choice (read at every call; for tests).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "scan_2d_types.h"

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define VMAMBA2D_X86_ISA_BUILDS 1
#else
#define VMAMBA2D_X86_ISA_BUILDS 0
#endif

// Declares the entry points of the build for namespace `isa`.
#define VMAMBA2D_DECLARE_ISA_KERNELS(isa)                                                          \
  namespace vmamba2d {                                                                             \
  namespace cpu {                                                                                  \
  namespace isa {                                                                                  \
  template <typename T>                                                                            \
  void forward_channel(const ScanInputs<T>& in, const ScanShape& s, int64_t b, int64_t d, T* y,     \
                       Workspace<T>& ws);                                                          \
  template <typename T>                                                                            \
  void backward_channel(const ScanInputs<T>& in, const ScanShape& s, int64_t b, int64_t d,         \
                        const T* dy, const ChannelGrads<T>& out, Workspace<T>& ws);                \
  template <typename T>                                                                            \
  void cross_forward_channels(const ScanInputs<T>& in, const CrossShape& s, const int64_t* routes, \
                              int64_t b, int64_t d_begin, int64_t d_end, T* y, Workspace<T>& ws);  \
  template <typename T>                                                                            \
  void cross_backward_channels(const ScanInputs<T>& in, const CrossShape& s, const int64_t* routes, \
                               int64_t b, int64_t d_begin, int64_t d_end, const T* dy, T* du,      \
                               ChannelGrads<T>* route_grads, Workspace<T>& ws);                    \
  }                                                                                                \
  }                                                                                                \
  }

// Instantiates the entry points for float and double (in the translation unit of `isa`'s build).
#define VMAMBA2D_INSTANTIATE_ISA_KERNELS_FOR(T)                                                    \
  template void forward_channel<T>(const ScanInputs<T>&, const ScanShape&, int64_t, int64_t, T*,   \
                                   Workspace<T>&);                                                 \
  template void backward_channel<T>(const ScanInputs<T>&, const ScanShape&, int64_t, int64_t,      \
                                    const T*, const ChannelGrads<T>&, Workspace<T>&);              \
  template void cross_forward_channels<T>(const ScanInputs<T>&, const CrossShape&, const int64_t*, \
                                          int64_t, int64_t, int64_t, T*, Workspace<T>&);           \
  template void cross_backward_channels<T>(const ScanInputs<T>&, const CrossShape&, const int64_t*, \
                                           int64_t, int64_t, int64_t, const T*, T*, ChannelGrads<T>*, \
                                           Workspace<T>&);

#define VMAMBA2D_INSTANTIATE_ISA_KERNELS(isa)                                                      \
  namespace vmamba2d {                                                                             \
  namespace cpu {                                                                                  \
  namespace isa {                                                                                  \
  VMAMBA2D_INSTANTIATE_ISA_KERNELS_FOR(float)                                                      \
  VMAMBA2D_INSTANTIATE_ISA_KERNELS_FOR(double)                                                     \
  }                                                                                                \
  }                                                                                                \
  }

VMAMBA2D_DECLARE_ISA_KERNELS(baseline)
#if VMAMBA2D_X86_ISA_BUILDS
VMAMBA2D_DECLARE_ISA_KERNELS(avx2)
VMAMBA2D_DECLARE_ISA_KERNELS(avx512)
// The channel-lane forward and backward (scan_2d_lanes_kernel.h), built for AVX-512 only: with 16
// vector registers (AVX2, SSE) GCC's code for the forward ran 1.5-2x slower than the per-channel kernel.
namespace vmamba2d {
namespace cpu {
namespace avx512 {
void cross_forward_lanes(const ScanInputs<float>& in, const CrossShape& s, const float* weights, const int64_t* routes,
                         int64_t b, int64_t d_begin, int64_t d_end, float* y, Workspace<float>& ws);
void cross_backward_lanes(const ScanInputs<float>& in, const CrossShape& s, const float* weights,
                          const int64_t* routes, int64_t b, int64_t d_begin, int64_t d_end, const float* dy,
                          float* du, const LaneGrads& out, Workspace<float>& ws);
}
}  // namespace cpu
}  // namespace vmamba2d
#endif

namespace vmamba2d {
namespace cpu {

// The per-channel kernels of one instruction-set build.
template <typename T>
struct ChannelKernels {
  decltype(&baseline::forward_channel<T>) forward;
  decltype(&baseline::backward_channel<T>) backward;
  decltype(&baseline::cross_forward_channels<T>) cross_forward;
  decltype(&baseline::cross_backward_channels<T>) cross_backward;
  // The channel-lane forward and backward for float maps (lane_forward, lane_backward), or null
  // where the build has none.
  void (*cross_forward_lanes)(const ScanInputs<float>&, const CrossShape&, const float*, const int64_t*, int64_t,
                              int64_t, int64_t, float*, Workspace<float>&);
  void (*cross_backward_lanes)(const ScanInputs<float>&, const CrossShape&, const float*, const int64_t*, int64_t,
                               int64_t, int64_t, const float*, float*, const LaneGrads&, Workspace<float>&);
  const char* isa;
};

// Instruction-set levels, lowest first; VMAMBA2D_CPU_ISA (one of these names) caps the choice.
enum class IsaLevel { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

inline IsaLevel isa_cap_from_env() {
  const char* value = std::getenv("VMAMBA2D_CPU_ISA");
  if (value == nullptr || *value == '\0') return IsaLevel::kAvx512;
  const std::string name(value);
  if (name == "baseline") return IsaLevel::kBaseline;
  if (name == "avx2") return IsaLevel::kAvx2;
  if (name == "avx512") return IsaLevel::kAvx512;
  throw std::invalid_argument("VMAMBA2D_CPU_ISA must be 'baseline', 'avx2' or 'avx512', got '" + name + "'");
}

// VMAMBA2D_CPU_LANES=0 turns the channel-lane kernels off (the per-channel kernel runs instead; for
// A/B measurements and tests); unset or 1: on where the build has it. Read at every call.
inline bool channel_lanes_from_env() {
  const char* value = std::getenv("VMAMBA2D_CPU_LANES");
  if (value == nullptr || *value == '\0') return true;
  const std::string name(value);
  if (name == "0" || name == "1") return name == "1";
  throw std::invalid_argument("VMAMBA2D_CPU_LANES must be '0' or '1', got '" + name + "'");
}

// The fastest build this CPU can run (at most the level VMAMBA2D_CPU_ISA allows).
template <typename T>
ChannelKernels<T> best_channel_kernels() {
  const IsaLevel cap = isa_cap_from_env();
#if VMAMBA2D_X86_ISA_BUILDS
  const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (cap >= IsaLevel::kAvx512 && has_avx2 && __builtin_cpu_supports("avx512f")) {
    const bool lanes = channel_lanes_from_env();
    return {&avx512::forward_channel<T>, &avx512::backward_channel<T>, &avx512::cross_forward_channels<T>,
            &avx512::cross_backward_channels<T>, lanes ? &avx512::cross_forward_lanes : nullptr,
            lanes ? &avx512::cross_backward_lanes : nullptr, "avx512"};
  }
  if (cap >= IsaLevel::kAvx2 && has_avx2) {
    return {&avx2::forward_channel<T>, &avx2::backward_channel<T>, &avx2::cross_forward_channels<T>,
            &avx2::cross_backward_channels<T>, nullptr, nullptr, "avx2"};
  }
#endif
  (void)cap;
  return {&baseline::forward_channel<T>, &baseline::backward_channel<T>, &baseline::cross_forward_channels<T>,
          &baseline::cross_backward_channels<T>, nullptr, nullptr, "baseline"};
}

}  // namespace cpu
}  // namespace vmamba2d
