// Tensor-level entry points of the CPU 2D selective scan and their pybind11 bindings.
//
//   forward(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_fp32) -> y
//   backward(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy)
//       -> [du, ddelta, dA, dB, dC, dD or None, ddelta_bias or None]
//
// u, delta, B, C are fp32 or fp64 (one dtype, the compute dtype); A, D, delta_bias may be fp32 and
// are converted to it. Gradients come back in each input's dtype. Work is split over
// (batch, channel) in the forward and over (batch, group, channel chunk) in the backward, so that
// dB / dC, shared by the channels of a group, are accumulated without races; chunks of one group
// write to their own partial buffers, summed in a fixed order afterwards (deterministic results).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "scan_2d_isa.h"

namespace vmamba2d {
namespace cpu {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Channel chunks per (batch, group) in the backward: enough tasks to occupy a many-core machine
// when batch * groups is small. Depends on shapes only, so results do not depend on thread count.
constexpr int64_t kTargetBackwardTasks = 16;

// Channel chunks per (batch, group) in the backward: about kTargetBackwardTasks tasks in all, at
// least one chunk (also for empty batches or channels, where no task runs and nothing divides by
// the zero task count) and at most one chunk per channel.
int64_t backward_chunks_per_group(const ScanShape& s) {
  const int64_t groups_in_batch = std::max<int64_t>(1, s.batch * s.groups);
  const int64_t wanted = (kTargetBackwardTasks + groups_in_batch - 1) / groups_in_batch;
  return std::max<int64_t>(1, std::min(s.channels_per_group(), wanted));
}

void check_float_contiguous(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "vmamba2d CPU scan: ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), "vmamba2d CPU scan: ", name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble,
              "vmamba2d CPU scan: ", name, " must be float32 or float64, got ", t.scalar_type());
}

ScanShape check_inputs(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                       const OptTensor& D, const OptTensor& delta_bias, int64_t height, int64_t width) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{u, "u"}, {delta, "delta"}, {A, "A"},
                                {B, "B"}, {C, "C"}}) {
    check_float_contiguous(t, name);
  }
  TORCH_CHECK(u.dim() == 3, "vmamba2d CPU scan: u must be (batch, dim, L)");
  TORCH_CHECK(B.dim() == 4, "vmamba2d CPU scan: B must be (batch, groups, N, L)");
  ScanShape s{u.size(0), u.size(1), B.size(1), A.size(1), height, width};
  TORCH_CHECK(height > 0 && width > 0 && u.size(2) == s.length(), "vmamba2d CPU scan: L != height * width");
  TORCH_CHECK(s.groups > 0 && s.dim % s.groups == 0, "vmamba2d CPU scan: dim must be divisible by groups");
  TORCH_CHECK(delta.sizes() == u.sizes(), "vmamba2d CPU scan: delta must match u's shape");
  TORCH_CHECK(A.dim() == 2 && A.size(0) == s.dim, "vmamba2d CPU scan: A must be (dim, N)");
  const std::vector<int64_t> bc_shape{s.batch, s.groups, s.nstate, s.length()};
  TORCH_CHECK(B.sizes() == at::IntArrayRef(bc_shape) && C.sizes() == at::IntArrayRef(bc_shape),
              "vmamba2d CPU scan: B and C must be (batch, groups, N, L)");
  TORCH_CHECK(delta.scalar_type() == u.scalar_type() && B.scalar_type() == u.scalar_type() &&
                  C.scalar_type() == u.scalar_type(),
              "vmamba2d CPU scan: u, delta, B and C must share a dtype");
  for (const auto& [t, name] : {std::pair<const OptTensor&, const char*>{D, "D"}, {delta_bias, "delta_bias"}}) {
    if (t.has_value()) {
      check_float_contiguous(*t, name);
      TORCH_CHECK(t->dim() == 1 && t->size(0) == s.dim, "vmamba2d CPU scan: ", name, " must be (dim,)");
    }
  }
  return s;
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

// A, D, delta_bias in the compute dtype (no copy when they already are).
Tensor as_compute(const Tensor& t, at::ScalarType dtype) { return t.to(dtype).contiguous(); }
OptTensor as_compute(const OptTensor& t, at::ScalarType dtype) {
  return t.has_value() ? OptTensor(as_compute(*t, dtype)) : std::nullopt;
}

// Per-thread scratch arrays (allocated here, on the calling thread, as one ATen tensor so that
// memory profilers see it): (threads, arrays, L).
Tensor thread_workspaces(const ScanShape& s, int64_t arrays, const Tensor& like) {
  return at::empty({at::get_num_threads(), arrays, s.length()}, like.options());
}

template <typename T>
Workspace<T> this_thread_workspace(T* workspaces, int64_t arrays, int64_t length) {
  return Workspace<T>(workspaces + at::get_thread_num() * arrays * length, length);
}

template <typename T>
ScanInputs<T> scan_inputs(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                          const OptTensor& D, const OptTensor& delta_bias, bool delta_softplus) {
  return ScanInputs<T>{u.data_ptr<T>(),
                       delta.data_ptr<T>(),
                       A.data_ptr<T>(),
                       B.data_ptr<T>(),
                       C.data_ptr<T>(),
                       D.has_value() ? D->data_ptr<T>() : nullptr,
                       delta_bias.has_value() ? delta_bias->data_ptr<T>() : nullptr,
                       delta_softplus};
}

Tensor forward(const Tensor& u, const Tensor& delta, const Tensor& A_in, const Tensor& B, const Tensor& C,
               const OptTensor& D_in, const OptTensor& bias_in, bool delta_softplus, int64_t height,
               int64_t width, bool out_fp32) {
  const ScanShape s = check_inputs(u, delta, A_in, B, C, D_in, bias_in, height, width);
  const auto dtype = u.scalar_type();
  const Tensor A = as_compute(A_in, dtype);
  const OptTensor D = as_compute(D_in, dtype);
  const OptTensor bias = as_compute(bias_in, dtype);
  Tensor y = at::empty(u.sizes(), u.options());
  const Tensor workspaces = thread_workspaces(s, kForwardArrays, u);

  AT_DISPATCH_FLOATING_TYPES(dtype, "vmamba2d_scan_2d_cpu_forward", [&] {
    const ScanInputs<scalar_t> in = scan_inputs<scalar_t>(u, delta, A, B, C, D, bias, delta_softplus);
    const ChannelKernels<scalar_t> kernels = best_channel_kernels<scalar_t>();
    scalar_t* y_ptr = y.data_ptr<scalar_t>();
    scalar_t* scratch = workspaces.data_ptr<scalar_t>();
    at::parallel_for(0, s.batch * s.dim, 1, [&](int64_t begin, int64_t end) {
      const FlushDenormals flush(std::is_same_v<scalar_t, float>);
      Workspace<scalar_t> ws = this_thread_workspace(scratch, kForwardArrays, s.length());
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / s.dim;
        const int64_t d = task % s.dim;
        kernels.forward(in, s, b, d, y_ptr + task * s.length(), ws);
      }
    });
  });
  return out_fp32 ? y.to(at::kFloat) : y;
}

std::vector<OptTensor> backward(const Tensor& u, const Tensor& delta, const Tensor& A_in, const Tensor& B,
                                const Tensor& C, const OptTensor& D_in, const OptTensor& bias_in,
                                bool delta_softplus, int64_t height, int64_t width, const Tensor& dy_in) {
  const ScanShape s = check_inputs(u, delta, A_in, B, C, D_in, bias_in, height, width);
  TORCH_CHECK(dy_in.sizes() == u.sizes(), "vmamba2d CPU scan: dy must match u's shape");
  const auto dtype = u.scalar_type();
  const Tensor A = as_compute(A_in, dtype);
  const OptTensor D = as_compute(D_in, dtype);
  const OptTensor bias = as_compute(bias_in, dtype);
  const Tensor dy = as_compute(dy_in, dtype);

  const int64_t cpg = s.channels_per_group();
  const int64_t chunks = backward_chunks_per_group(s);
  Tensor du = at::empty(u.sizes(), u.options());
  Tensor ddelta = at::empty(u.sizes(), u.options());
  // dB / dC partial sums: (batch, groups, chunks, N, L); chunk c holds channels [c*cpg/chunks, ...).
  Tensor dB_parts = at::zeros({s.batch, s.groups, chunks, s.nstate, s.length()}, u.options());
  Tensor dC_parts = at::zeros({s.batch, s.groups, chunks, s.nstate, s.length()}, u.options());
  Tensor dA_parts = at::empty({s.batch, s.dim, s.nstate}, u.options());
  Tensor dD_parts = at::empty({s.batch, s.dim}, u.options());
  Tensor dbias_parts = at::empty({s.batch, s.dim}, u.options());
  const Tensor workspaces = thread_workspaces(s, kBackwardArrays, u);

  AT_DISPATCH_FLOATING_TYPES(dtype, "vmamba2d_scan_2d_cpu_backward", [&] {
    using T = scalar_t;
    const ScanInputs<T> in = scan_inputs<T>(u, delta, A, B, C, D, bias, delta_softplus);
    const ChannelKernels<T> kernels = best_channel_kernels<T>();
    const T* dy_ptr = dy.data_ptr<T>();
    T* du_ptr = du.data_ptr<T>();
    T* ddelta_ptr = ddelta.data_ptr<T>();
    T* dB_ptr = dB_parts.data_ptr<T>();
    T* dC_ptr = dC_parts.data_ptr<T>();
    T* dA_ptr = dA_parts.data_ptr<T>();
    T* dD_ptr = dD_parts.data_ptr<T>();
    T* dbias_ptr = dbias_parts.data_ptr<T>();
    const int64_t L = s.length();
    T* scratch = workspaces.data_ptr<T>();
    at::parallel_for(0, s.batch * s.groups * chunks, 1, [&](int64_t begin, int64_t end) {
      const FlushDenormals flush(std::is_same_v<T, float>);
      Workspace<T> ws = this_thread_workspace(scratch, kBackwardArrays, L);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t chunk = task % chunks;
        const int64_t bg = task / chunks;  // b * groups + g
        const int64_t b = bg / s.groups;
        const int64_t g = bg % s.groups;
        const int64_t first = g * cpg + chunk * cpg / chunks;
        const int64_t stop = g * cpg + (chunk + 1) * cpg / chunks;
        for (int64_t d = first; d < stop; ++d) {
          const int64_t bd = b * s.dim + d;
          const ChannelGrads<T> out{du_ptr + bd * L,
                                    ddelta_ptr + bd * L,
                                    dB_ptr + task * s.nstate * L,
                                    dC_ptr + task * s.nstate * L,
                                    dA_ptr + bd * s.nstate,
                                    dD_ptr + bd,
                                    dbias_ptr + bd};
          kernels.backward(in, s, b, d, dy_ptr + bd * L, out, ws);
        }
      }
    });
  });

  // Fixed-order reductions: over chunks for dB / dC, over the batch for the per-channel grads.
  // With one chunk per group the partial buffers already are dB / dC.
  Tensor dB = (chunks == 1 ? dB_parts.view(B.sizes()) : dB_parts.sum(2)).to(B.scalar_type());
  Tensor dC = (chunks == 1 ? dC_parts.view(C.sizes()) : dC_parts.sum(2)).to(C.scalar_type());
  Tensor dA = dA_parts.sum(0).to(A_in.scalar_type());
  OptTensor dD;
  if (D_in.has_value()) dD = dD_parts.sum(0).to(D_in->scalar_type());
  OptTensor dbias;
  if (bias_in.has_value()) dbias = dbias_parts.sum(0).to(bias_in->scalar_type());
  return {du, ddelta, dA, dB, dC, dD, dbias};
}

}  // namespace
}  // namespace cpu
}  // namespace vmamba2d

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "vmamba2d: 2D selective scan, CPU kernel (forward and backward)";
  m.def("forward", &vmamba2d::cpu::forward, "2D selective scan forward -> y (batch, dim, L)",
        pybind11::arg("u"), pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"),
        pybind11::arg("D"), pybind11::arg("delta_bias"), pybind11::arg("delta_softplus"), pybind11::arg("height"),
        pybind11::arg("width"), pybind11::arg("out_fp32"));
  m.def(
      "openmp",
      [] {
#ifdef _OPENMP
        return true;
#else
        return false;
#endif
      },
      "Whether this build parallelises with OpenMP (without it at::parallel_for runs serially)");
  m.def(
      "isa", [] { return std::string(vmamba2d::cpu::best_channel_kernels<float>().isa); },
      "The instruction-set build of the kernel this CPU runs: 'avx512', 'avx2' or 'baseline'");
  m.def("backward", &vmamba2d::cpu::backward,
        "2D selective scan backward -> [du, ddelta, dA, dB, dC, dD or None, ddelta_bias or None]",
        pybind11::arg("u"), pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"),
        pybind11::arg("D"), pybind11::arg("delta_bias"), pybind11::arg("delta_softplus"), pybind11::arg("height"),
        pybind11::arg("width"), pybind11::arg("dy"));
}
