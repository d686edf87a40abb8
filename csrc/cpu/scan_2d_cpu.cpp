// Tensor-level entry points of the single-route CPU 2D selective scan.
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

#include <type_traits>
#include <vector>

#include "scan_2d_glue.h"
#include "scan_2d_isa.h"
#include "scan_2d_ops.h"

namespace vmamba2d {
namespace cpu {
namespace {

ScanShape check_inputs(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                       const OptTensor& D, const OptTensor& delta_bias, int64_t height, int64_t width) {
  check_scan_tensors(u, delta, A, B, C);
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
  check_channel_vectors(D, delta_bias, s.dim, "(dim,)");
  return s;
}

}  // namespace

Tensor forward(const Tensor& u, const Tensor& delta, const Tensor& A_in, const Tensor& B, const Tensor& C,
               const OptTensor& D_in, const OptTensor& bias_in, bool delta_softplus, int64_t height,
               int64_t width, bool out_fp32) {
  const ScanShape s = check_inputs(u, delta, A_in, B, C, D_in, bias_in, height, width);
  const ComputeInputs inputs(u, delta, A_in, B, C, D_in, bias_in, delta_softplus);
  Tensor y = at::empty(u.sizes(), u.options());
  const Tensor workspaces = thread_workspaces(s.length(), kForwardArrays, u);

  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "vmamba2d_scan_2d_cpu_forward", [&] {
    const ScanInputs<scalar_t> in = inputs.pointers<scalar_t>();
    const ChannelKernels<scalar_t> kernels = best_channel_kernels<scalar_t>();
    scalar_t* y_ptr = y.data_ptr<scalar_t>();
    parallel_tasks<scalar_t>(s.batch * s.dim, workspaces, kForwardArrays, s.length(),
                             [&](int64_t task, Workspace<scalar_t>& ws) {
                               kernels.forward(in, s, task / s.dim, task % s.dim, y_ptr + task * s.length(), ws);
                             });
  });
  return out_fp32 ? y.to(at::kFloat) : y;
}

std::vector<OptTensor> backward(const Tensor& u, const Tensor& delta, const Tensor& A_in, const Tensor& B,
                                const Tensor& C, const OptTensor& D_in, const OptTensor& bias_in,
                                bool delta_softplus, int64_t height, int64_t width, const Tensor& dy_in) {
  const ScanShape s = check_inputs(u, delta, A_in, B, C, D_in, bias_in, height, width);
  TORCH_CHECK(dy_in.sizes() == u.sizes(), "vmamba2d CPU scan: dy must match u's shape");
  const ComputeInputs inputs(u, delta, A_in, B, C, D_in, bias_in, delta_softplus);
  const Tensor dy = as_compute(dy_in, u.scalar_type());

  const int64_t cpg = s.channels_per_group();
  const int64_t chunks = backward_chunks_per_unit(s.batch * s.groups, cpg);
  // dB / dC partial sums: (batch, groups, chunks, N, L); chunk c holds channels [c*cpg/chunks, ...).
  const BackwardParts parts(u, delta.sizes(), {s.batch, s.groups, chunks, s.nstate, s.length()}, 2, s.dim, s.nstate);
  const Tensor workspaces = thread_workspaces(s.length(), kBackwardArrays, u);

  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "vmamba2d_scan_2d_cpu_backward", [&] {
    using T = scalar_t;
    const ScanInputs<T> in = inputs.pointers<T>();
    const ChannelKernels<T> kernels = best_channel_kernels<T>();
    const T* dy_ptr = dy.data_ptr<T>();
    const ChannelGrads<T> all = parts.buffers<T>();
    const int64_t L = s.length();
    parallel_tasks<T>(s.batch * s.groups * chunks, workspaces, kBackwardArrays, L, [&](int64_t task, Workspace<T>& ws) {
      const int64_t chunk = task % chunks;
      const int64_t bg = task / chunks;  // b * groups + g
      const int64_t b = bg / s.groups;
      const int64_t g = bg % s.groups;
      const int64_t first = g * cpg + chunk * cpg / chunks;
      const int64_t stop = g * cpg + (chunk + 1) * cpg / chunks;
      for (int64_t d = first; d < stop; ++d) {
        const int64_t bd = b * s.dim + d;
        const ChannelGrads<T> out{all.du + bd * L,          all.ddelta + bd * L,   all.dB + task * s.nstate * L,
                                  all.dC + task * s.nstate * L, all.dA + bd * s.nstate, all.dD + bd,
                                  all.ddelta_bias + bd};
        kernels.backward(in, s, b, d, dy_ptr + bd * L, out, ws);
      }
    });
  });
  return parts.reduce(A_in, B, C, D_in, bias_in);
}

}  // namespace cpu
}  // namespace vmamba2d
