// Tensor-level entry points of the four-route CPU scan (one op for all routes of a mixer).
//
//   cross_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32, delta_proj_weight) -> y
//   cross_backward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy, delta_proj_weight)
//       -> [du, ddelta, dA, dB, dC, dD or None, ddelta_bias or None (, ddelta_proj_weight)]
//
// u (batch, dim, H, W) is read once for all K = len(routes) routes; delta (batch, K, dim, H, W),
// B / C (batch, K, N, H, W), A (K * dim, N), D / delta_bias (K * dim,) hold each route's inputs in
// map order; y (batch, dim, H, W) is the routes' outputs summed in route order. u may be contiguous
// or channels-last; y, du (and the dy the backward reads) are in u's layout. Dtypes as the
// single-route op (scan_2d_cpu.cpp). With delta_proj_weight (K, dim, R) delta is the low-rank
// (batch, K, R, H, W) and each route's step sizes are projected inside the kernel, for a group of
// kProjectChannels channels at a time; the backward recomputes them the same way and returns the
// gradients of the low-rank delta (batch, K, R, H, W) and of delta_proj_weight (K, dim, R) (the
// channel-lane backward forms them in the kernel, so the full-rank ddelta never reaches memory; the
// per-channel one as matmuls of its full-rank ddelta). The forward runs tasks over (batch, channel
// group: one channel without a projection; kLaneChannels, one per vector lane, for float
// channels-last maps with a projection on the AVX-512 build: scan_2d_lanes_kernel.h); the backward
// over (batch, channel chunk; chunks of lane groups where the lanes run), each task writing the
// sums over its channels (dB / dC of every route, the lanes' ddelta) into its own partial buffer,
// summed over the chunks in a fixed order afterwards (deterministic results).
#include <ATen/ATen.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "scan_2d_glue.h"
#include "scan_2d_isa.h"
#include "scan_2d_ops.h"

namespace vmamba2d {
namespace cpu {
namespace {

CrossShape check_cross_inputs(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                              const Tensor& C, const OptTensor& D, const OptTensor& delta_bias,
                              const std::vector<int64_t>& routes, const OptTensor& delta_proj_weight) {
  check_scan_tensors(u, delta, A, B, C, /*u_channels_last_ok=*/true);
  TORCH_CHECK(!routes.empty(), "vmamba2d CPU scan: routes must name at least one route");
  for (const int64_t code : routes) {
    TORCH_CHECK(code >= 0 && code < 16, "vmamba2d CPU scan: routes must be route codes in [0, 16), got ", code);
  }
  TORCH_CHECK(u.dim() == 4, "vmamba2d CPU scan: u must be (batch, dim, H, W), got ", u.sizes());
  TORCH_CHECK(A.dim() == 2, "vmamba2d CPU scan: A must be (routes * dim, N), got ", A.sizes());
  const int64_t K = static_cast<int64_t>(routes.size());
  CrossShape s{u.size(0), u.size(1), K, A.size(1), u.size(2), u.size(3), is_channels_last_map(u)};
  TORCH_CHECK(s.height > 0 && s.width > 0, "vmamba2d CPU scan: u's map must not be empty, got ", u.sizes());
  if (delta_proj_weight.has_value()) {
    check_float_contiguous(*delta_proj_weight, "delta_proj_weight");
    TORCH_CHECK(delta_proj_weight->dim() == 3 && delta_proj_weight->size(0) == K &&
                    delta_proj_weight->size(1) == s.dim && delta_proj_weight->size(2) > 0,
                "vmamba2d CPU scan: delta_proj_weight must be (routes, dim, R) with routes = ", K, ", dim = ", s.dim,
                " and R >= 1, got ", delta_proj_weight->sizes());
    s.rank = delta_proj_weight->size(2);
    TORCH_CHECK(delta.sizes() == at::IntArrayRef({s.batch, K, s.rank, s.height, s.width}),
                "vmamba2d CPU scan: with delta_proj_weight, delta must be (batch, routes, R, H, W) = ",
                at::IntArrayRef({s.batch, K, s.rank, s.height, s.width}), ", got ", delta.sizes());
  } else {
    TORCH_CHECK(delta.sizes() == at::IntArrayRef({s.batch, K, s.dim, s.height, s.width}),
                "vmamba2d CPU scan: delta must be (batch, routes, dim, H, W) = ",
                at::IntArrayRef({s.batch, K, s.dim, s.height, s.width}), ", got ", delta.sizes());
  }
  TORCH_CHECK(A.size(0) == K * s.dim, "vmamba2d CPU scan: A must be (routes * dim, N) with routes * dim = ", K * s.dim,
              ", got ", A.sizes());
  const std::vector<int64_t> bc_shape{s.batch, K, s.nstate, s.height, s.width};
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{B, "B"}, {C, "C"}}) {
    TORCH_CHECK(t.sizes() == at::IntArrayRef(bc_shape), "vmamba2d CPU scan: ", name,
                " must be (batch, routes, N, H, W) = ", at::IntArrayRef(bc_shape), ", got ", t.sizes());
  }
  check_channel_vectors(D, delta_bias, K * s.dim, "(routes * dim,)");
  return s;
}

// The scan's pointers, with the step-size projection (converted to the compute dtype in `weight`).
template <typename T>
ScanInputs<T> cross_pointers(const ComputeInputs& inputs, const OptTensor& weight) {
  ScanInputs<T> in = inputs.pointers<T>();
  if (weight.has_value()) in.delta_proj = weight->data_ptr<T>();
  return in;
}

// Whether a call runs a channel-lane kernel: float maps whose shapes suit it (`suits`), a build
// that has it (`built`), and enough tasks. Its tasks are twice the per-channel kernel's (16
// channels, not 8): it runs only where they still give every thread one, so a small batch on many
// cores keeps its parallelism.
bool use_lanes(const Tensor& u, const CrossShape& s, bool suits, bool built) {
  return u.scalar_type() == at::kFloat && suits && built &&
         s.batch * ((s.dim + kLaneChannels - 1) / kLaneChannels) >= at::get_num_threads();
}

// Channels [first, last) of sample b: by the channel-lane kernel where it has its weights (float
// maps only).
// lane_weights: the projection as (routes, R, dim) for the channel-lane kernel.
template <typename T>
void forward_group(const ChannelKernels<T>& kernels, const Tensor& lane_weights, const ScanInputs<T>& in,
                   const CrossShape& s, const std::vector<int64_t>& routes, int64_t b, int64_t first, int64_t last,
                   T* y, Workspace<T>& ws) {
  if constexpr (std::is_same_v<T, float>) {
    if (lane_weights.defined()) {
      return kernels.cross_forward_lanes(in, s, lane_weights.data_ptr<float>(), routes.data(), b, first, last, y, ws);
    }
  }
  kernels.cross_forward(in, s, routes.data(), b, first, last, y, ws);
}

// The step-size projection's gradients from the full-rank step sizes' gradient ddelta (batch, K,
// dim, H, W): (ddelta_low like the low-rank delta (batch, K, R, H, W), dweight (K, dim, R)).
std::pair<Tensor, Tensor> projection_grads(const Tensor& ddelta, const Tensor& low, const Tensor& weight) {
  const int64_t L = low.size(3) * low.size(4);
  const Tensor grad = ddelta.reshape({ddelta.size(0), ddelta.size(1), ddelta.size(2), L});
  const Tensor ddelta_low = at::matmul(weight.transpose(1, 2), grad);  // (batch, K, R, L)
  const Tensor dweight = at::matmul(grad, low.reshape({low.size(0), low.size(1), low.size(2), L}).transpose(2, 3));
  return {ddelta_low.view(low.sizes()), dweight.sum(0)};
}

// The backward by the channel-lane kernel (float, a step-size projection `proj` in the compute
// dtype): tasks over (batch, chunk of lane groups), each adding its groups' sums over channels
// into its own partial ddelta_low / dB / dC, summed over the chunks afterwards in a fixed order.
// Returns cross_backward's list, the projection's gradient last (in proj_in's dtype).
std::vector<OptTensor> lane_backward_tasks(const ComputeInputs& inputs, const Tensor& proj, const CrossShape& s,
                                           const std::vector<int64_t>& routes, const Tensor& dy, const Tensor& A_in,
                                           const Tensor& B, const Tensor& C, const OptTensor& D_in,
                                           const OptTensor& bias_in, const Tensor& proj_in) {
  const int64_t K = s.routes;
  const int64_t L = s.length();
  const int64_t groups = (s.dim + kLaneChannels - 1) / kLaneChannels;  // per sample
  const int64_t chunks = backward_chunks_per_unit(s.batch, groups);
  const BackwardParts parts(inputs.u, {0}, {s.batch, chunks, K, s.nstate, L}, 1, K * s.dim, s.nstate);
  const Tensor low_parts = at::zeros({s.batch, chunks, K, s.rank, s.height, s.width}, inputs.u.options());
  const Tensor dweight_rows = at::empty({s.batch, K, s.dim, s.rank}, inputs.u.options());
  const Tensor lane_weights = proj.transpose(1, 2).contiguous();
  const int64_t arrays = lane_backward_arrays(s);
  const Tensor workspaces = thread_workspaces(L, arrays, inputs.u);
  const ChannelKernels<float> kernels = best_channel_kernels<float>();
  const ScanInputs<float> in = cross_pointers<float>(inputs, proj);
  const ChannelGrads<float> all = parts.buffers<float>();
  parallel_tasks<float>(s.batch * chunks, workspaces, arrays, L, [&](int64_t task, Workspace<float>& ws) {
    const int64_t chunk = task % chunks;
    const LaneGrads grads{low_parts.data_ptr<float>() + task * K * s.rank * L, dweight_rows.data_ptr<float>(),
                          all.dB + task * K * s.nstate * L, all.dC + task * K * s.nstate * L, all.dA, all.dD,
                          all.ddelta_bias};
    for (int64_t group = chunk * groups / chunks; group < (chunk + 1) * groups / chunks; ++group) {
      const int64_t first = group * kLaneChannels;
      kernels.cross_backward_lanes(in, s, lane_weights.data_ptr<float>(), routes.data(), task / chunks, first,
                                   std::min(first + kLaneChannels, s.dim), dy.data_ptr<float>(), all.du, grads, ws);
    }
  });
  std::vector<OptTensor> grads = parts.reduce(A_in, B, C, D_in, bias_in);
  grads[1] = chunks == 1 ? low_parts.squeeze(1) : low_parts.sum(1);
  grads.push_back(dweight_rows.sum(0).to(proj_in.scalar_type()));
  return grads;
}

}  // namespace

Tensor cross_forward(const Tensor& u, const Tensor& delta, const Tensor& A_in, const Tensor& B, const Tensor& C,
                     const OptTensor& D_in, const OptTensor& bias_in, bool delta_softplus,
                     const std::vector<int64_t>& routes, bool out_fp32, const OptTensor& proj_in) {
  const CrossShape s = check_cross_inputs(u, delta, A_in, B, C, D_in, bias_in, routes, proj_in);
  const ComputeInputs inputs(u, delta, A_in, B, C, D_in, bias_in, delta_softplus);
  const OptTensor proj = as_compute(proj_in, u.scalar_type());
  Tensor y = at::empty(u.sizes(), u.options().memory_format(map_format(s.channels_last)));
  const bool lanes = use_lanes(u, s, lane_forward(s), best_channel_kernels<float>().cross_forward_lanes != nullptr);
  const Tensor lane_weights = lanes ? proj->transpose(1, 2).contiguous() : Tensor();
  const int64_t group = lanes ? kLaneChannels : s.channel_group();
  const int64_t groups = (s.dim + group - 1) / group;  // per sample
  const int64_t arrays = lanes ? lane_forward_arrays(s) : cross_forward_arrays(group);
  const Tensor workspaces = thread_workspaces(s.length(), arrays, u);

  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "vmamba2d_cross_scan_2d_cpu_forward", [&] {
    const ScanInputs<scalar_t> in = cross_pointers<scalar_t>(inputs, proj);
    const ChannelKernels<scalar_t> kernels = best_channel_kernels<scalar_t>();
    scalar_t* y_ptr = y.data_ptr<scalar_t>();
    parallel_tasks<scalar_t>(s.batch * groups, workspaces, arrays, s.length(), [&](int64_t task, Workspace<scalar_t>& ws) {
      const int64_t first = (task % groups) * group;
      forward_group(kernels, lane_weights, in, s, routes, task / groups, first, std::min(first + group, s.dim), y_ptr, ws);
    });
  });
  return out_fp32 ? y.to(at::kFloat) : y;
}

std::vector<OptTensor> cross_backward(const Tensor& u, const Tensor& delta, const Tensor& A_in, const Tensor& B,
                                      const Tensor& C, const OptTensor& D_in, const OptTensor& bias_in,
                                      bool delta_softplus, const std::vector<int64_t>& routes, const Tensor& dy_in,
                                      const OptTensor& proj_in) {
  const CrossShape s = check_cross_inputs(u, delta, A_in, B, C, D_in, bias_in, routes, proj_in);
  TORCH_CHECK(dy_in.sizes() == u.sizes(), "vmamba2d CPU scan: dy must match u's shape ", u.sizes(), ", got ",
              dy_in.sizes());
  const ComputeInputs inputs(u, delta, A_in, B, C, D_in, bias_in, delta_softplus);
  const OptTensor proj = as_compute(proj_in, u.scalar_type());
  const Tensor dy = dy_in.to(u.scalar_type()).contiguous(map_format(s.channels_last));

  if (use_lanes(u, s, lane_backward(s), best_channel_kernels<float>().cross_backward_lanes != nullptr)) {
    return lane_backward_tasks(inputs, *proj, s, routes, dy, A_in, B, C, D_in, bias_in, *proj_in);
  }
  const int64_t K = s.routes;
  const int64_t chunks = backward_chunks_per_unit(s.batch, s.dim);
  // dB / dC partial sums: (batch, chunks, routes, N, L); chunk c holds channels [c*dim/chunks, ...).
  const std::vector<int64_t> ddelta_sizes{s.batch, K, s.dim, s.height, s.width};
  const BackwardParts parts(u, ddelta_sizes, {s.batch, chunks, K, s.nstate, s.length()}, 1, K * s.dim, s.nstate);
  const int64_t group = s.channel_group();
  const int64_t arrays = cross_backward_arrays(group);
  const Tensor workspaces = thread_workspaces(s.length(), arrays, u);

  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "vmamba2d_cross_scan_2d_cpu_backward", [&] {
    using T = scalar_t;
    const ScanInputs<T> in = cross_pointers<T>(inputs, proj);
    const ChannelKernels<T> kernels = best_channel_kernels<T>();
    const ChannelGrads<T> all = parts.buffers<T>();
    const T* dy_ptr = dy.data_ptr<T>();
    const int64_t L = s.length();
    const int64_t NL = s.nstate * L;
    parallel_tasks<T>(s.batch * chunks, workspaces, arrays, L, [&](int64_t task, Workspace<T>& ws) {
      const int64_t b = task / chunks;
      const int64_t chunk = task % chunks;
      const int64_t chunk_end = (chunk + 1) * s.dim / chunks;
      std::vector<ChannelGrads<T>> route_grads(group * K);  // [g * K + k]: channel first + g, route k
      for (int64_t first = chunk * s.dim / chunks; first < chunk_end; first += group) {
        const int64_t last = std::min(first + group, chunk_end);
        for (int64_t d = first; d < last; ++d) {
          for (int64_t k = 0; k < K; ++k) {
            const int64_t row = b * K * s.dim + k * s.dim + d;  // of the per-(batch, route, channel) grads
            // du: set by the kernel (all routes add into the channel's du)
            route_grads[(d - first) * K + k] = {nullptr,          all.ddelta + row * L,    all.dB + (task * K + k) * NL,
                                                all.dC + (task * K + k) * NL, all.dA + row * s.nstate, all.dD + row,
                                                all.ddelta_bias + row};
          }
        }
        kernels.cross_backward(in, s, routes.data(), b, first, last, dy_ptr, all.du, route_grads.data(), ws);
      }
    });
  });
  std::vector<OptTensor> grads = parts.reduce(A_in, B, C, D_in, bias_in);
  if (proj.has_value()) {
    auto [ddelta_low, dweight] = projection_grads(*grads[1], delta, *proj);
    grads[1] = ddelta_low;
    grads.push_back(dweight.to(proj_in->scalar_type()));
  }
  return grads;
}

}  // namespace cpu
}  // namespace vmamba2d
