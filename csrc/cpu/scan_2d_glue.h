// Tensor-level helpers shared by the CPU scan's entry points (scan_2d_cpu.cpp, scan_2d_cross_cpu.cpp):
// input checks, dtype conversion, per-thread workspaces, denormal flushing, backward work split.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "scan_2d_types.h"

namespace vmamba2d {
namespace cpu {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Channel chunks per unit of shared dB / dC (a (batch, group) or a batch) in the backward: enough
// tasks to occupy a many-core machine when there are few units. Depends on shapes only, so results
// do not depend on the thread count.
constexpr int64_t kTargetBackwardTasks = 16;

// About kTargetBackwardTasks tasks in all: at least one chunk per unit (also for empty batches or
// channels, where no task runs and nothing divides by the zero task count) and at most one chunk
// per channel.
inline int64_t backward_chunks_per_unit(int64_t units, int64_t channels_per_unit) {
  const int64_t occupied = std::max<int64_t>(1, units);
  const int64_t wanted = (kTargetBackwardTasks + occupied - 1) / occupied;
  return std::max<int64_t>(1, std::min(channels_per_unit, wanted));
}

// Whether a 4-D map is channels-last and not also contiguous (the layout the four-route kernel
// reads through CrossShape::channels_last).
inline bool is_channels_last_map(const Tensor& t) {
  return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast);
}

// The memory format of a map in u's layout (y, dy, du of the four-route scan).
inline at::MemoryFormat map_format(bool channels_last) {
  return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

inline void check_float_contiguous(const Tensor& t, const char* name, bool channels_last_ok = false) {
  TORCH_CHECK(t.device().is_cpu(), "vmamba2d CPU scan: ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.is_contiguous() || (channels_last_ok && is_channels_last_map(t)), "vmamba2d CPU scan: ", name,
              channels_last_ok ? " must be contiguous or channels-last" : " must be contiguous");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble,
              "vmamba2d CPU scan: ", name, " must be float32 or float64, got ", t.scalar_type());
}

// u, delta, A, B, C: CPU, contiguous (u also channels-last when u_channels_last_ok), fp32 / fp64;
// u, delta, B, C of one dtype.
inline void check_scan_tensors(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                               const Tensor& C, bool u_channels_last_ok = false) {
  check_float_contiguous(u, "u", u_channels_last_ok);
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{delta, "delta"}, {A, "A"}, {B, "B"},
                                {C, "C"}}) {
    check_float_contiguous(t, name);
  }
  TORCH_CHECK(delta.scalar_type() == u.scalar_type() && B.scalar_type() == u.scalar_type() &&
                  C.scalar_type() == u.scalar_type(),
              "vmamba2d CPU scan: u, delta, B and C must share a dtype");
}

// D and delta_bias, when given: CPU, contiguous, fp32 / fp64, `rows` values (`shape` names them).
inline void check_channel_vectors(const OptTensor& D, const OptTensor& delta_bias, int64_t rows, const char* shape) {
  for (const auto& [t, name] : {std::pair<const OptTensor&, const char*>{D, "D"}, {delta_bias, "delta_bias"}}) {
    if (t.has_value()) {
      check_float_contiguous(*t, name);
      TORCH_CHECK(t->dim() == 1 && t->size(0) == rows, "vmamba2d CPU scan: ", name, " must be ", shape, ", got ",
                  t->sizes());
    }
  }
}

// Flushes float denormals to zero (FTZ and DAZ in MXCSR) on x86 while alive, restoring the
// previous mode after. Denormal operands make x86 vector arithmetic take microcode assists that
// slowed the backward pass several-fold; values that small do not change float results.
class FlushDenormals {
 public:
  explicit FlushDenormals(bool enable) {
#if defined(__SSE__) || defined(__x86_64__)
    saved_ = _mm_getcsr();
    if (enable) _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero);
#else
    (void)enable;
#endif
  }
  ~FlushDenormals() {
#if defined(__SSE__) || defined(__x86_64__)
    _mm_setcsr(saved_);
#endif
  }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  static constexpr unsigned kFlushToZero = 0x8000;
  static constexpr unsigned kDenormalsAreZero = 0x0040;
  unsigned saved_ = 0;
};

// A tensor in the compute dtype (no copy when it already is).
inline Tensor as_compute(const Tensor& t, at::ScalarType dtype) { return t.to(dtype).contiguous(); }
inline OptTensor as_compute(const OptTensor& t, at::ScalarType dtype) {
  return t.has_value() ? OptTensor(as_compute(*t, dtype)) : std::nullopt;
}

// A scan's inputs with A, D and delta_bias converted to the compute dtype (u's).
struct ComputeInputs {
  Tensor u;
  Tensor delta;
  Tensor A;
  Tensor B;
  Tensor C;
  OptTensor D;
  OptTensor delta_bias;
  bool delta_softplus;

  ComputeInputs(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                const OptTensor& D, const OptTensor& delta_bias, bool delta_softplus)
      : u(u),
        delta(delta),
        A(as_compute(A, u.scalar_type())),
        B(B),
        C(C),
        D(as_compute(D, u.scalar_type())),
        delta_bias(as_compute(delta_bias, u.scalar_type())),
        delta_softplus(delta_softplus) {}

  template <typename T>
  ScanInputs<T> pointers() const {
    return ScanInputs<T>{u.data_ptr<T>(),
                         delta.data_ptr<T>(),
                         A.data_ptr<T>(),
                         B.data_ptr<T>(),
                         C.data_ptr<T>(),
                         D.has_value() ? D->data_ptr<T>() : nullptr,
                         delta_bias.has_value() ? delta_bias->data_ptr<T>() : nullptr,
                         delta_softplus};
  }
};

// Per-thread scratch arrays (allocated here, on the calling thread, as one ATen tensor so that
// memory profilers see it): (threads, arrays, length).
inline Tensor thread_workspaces(int64_t length, int64_t arrays, const Tensor& like) {
  return at::empty({at::get_num_threads(), arrays, length}, like.options());
}

template <typename T>
Workspace<T> this_thread_workspace(T* workspaces, int64_t arrays, int64_t length) {
  return Workspace<T>(workspaces + at::get_thread_num() * arrays * length, length);
}

// Runs body(task, workspace) for task in [0, count) with at::parallel_for, each thread on its own
// workspace of `arrays` arrays of `length` values, with float denormals flushed.
template <typename T, typename Body>
void parallel_tasks(int64_t count, const Tensor& workspaces, int64_t arrays, int64_t length, const Body& body) {
  T* scratch = workspaces.data_ptr<T>();
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    const FlushDenormals flush(std::is_same_v<T, float>);
    Workspace<T> ws = this_thread_workspace(scratch, arrays, length);
    for (int64_t task = begin; task < end; ++task) body(task, ws);
  });
}

// The backward's outputs before its fixed-order reductions: du, ddelta final; dB / dC partial
// sums with an axis of chunks (`chunk_axis`), each chunk written by one task; dA (batch, rows, N)
// and dD, ddelta_bias (batch, rows) per batch element.
struct BackwardParts {
  Tensor du;
  Tensor ddelta;
  Tensor dB;
  Tensor dC;
  Tensor dA;
  Tensor dD;
  Tensor ddelta_bias;
  int64_t chunk_axis;

  BackwardParts(const Tensor& u, at::IntArrayRef ddelta_sizes, const std::vector<int64_t>& bc_parts_shape,
                int64_t chunk_axis, int64_t rows, int64_t nstate)
      : du(at::empty(u.sizes(), u.options().memory_format(map_format(is_channels_last_map(u))))),
        ddelta(at::empty(ddelta_sizes, u.options())),
        dB(at::zeros(bc_parts_shape, u.options())),
        dC(at::zeros(bc_parts_shape, u.options())),
        dA(at::empty({u.size(0), rows, nstate}, u.options())),
        dD(at::empty({u.size(0), rows}, u.options())),
        ddelta_bias(at::empty({u.size(0), rows}, u.options())),
        chunk_axis(chunk_axis) {}

  // Where the tasks write: the start of each buffer.
  template <typename T>
  ChannelGrads<T> buffers() const {
    return {du.data_ptr<T>(), ddelta.data_ptr<T>(), dB.data_ptr<T>(), dC.data_ptr<T>(),
            dA.data_ptr<T>(), dD.data_ptr<T>(), ddelta_bias.data_ptr<T>()};
  }

  // [du, ddelta, dA, dB, dC, dD or None, ddelta_bias or None], each in its input's dtype: the sums
  // over chunks (dB, dC) and over the batch (dA, dD, ddelta_bias), in a fixed order.
  std::vector<OptTensor> reduce(const Tensor& A, const Tensor& B, const Tensor& C, const OptTensor& D,
                                const OptTensor& delta_bias) const {
    // With one chunk the partial buffers already are dB / dC.
    const bool one_chunk = dB.size(chunk_axis) == 1;
    Tensor dB_sum = (one_chunk ? dB : dB.sum(chunk_axis)).view(B.sizes()).to(B.scalar_type());
    Tensor dC_sum = (one_chunk ? dC : dC.sum(chunk_axis)).view(C.sizes()).to(C.scalar_type());
    Tensor dA_sum = dA.sum(0).to(A.scalar_type());
    OptTensor dD_sum;
    if (D.has_value()) dD_sum = dD.sum(0).to(D->scalar_type());
    OptTensor dbias_sum;
    if (delta_bias.has_value()) dbias_sum = ddelta_bias.sum(0).to(delta_bias->scalar_type());
    return {du, ddelta, dA_sum, dB_sum, dC_sum, dD_sum, dbias_sum};
  }
};

}  // namespace cpu
}  // namespace vmamba2d
