// The four-route scan on CPU: per-(batch, channel) kernels that run every route of one channel.
//
// Route k of channel d reads the shared map u[b, d] and its own delta[b, k, d], B[b, k], C[b, k],
// A / D / delta_bias row k * dim + d, and scans in the direction its code says
// (scan_2d_passes.h); y[b, d] is the sum of the routes' outputs, added in route order. Nothing is
// copied per route: the routes only change the loops' directions. u and y (dy and du) may be
// channels-last, as the models' maps are: a channel's plane is then gathered into the workspace
// once and its result scattered back, so the map needs no layout copy outside the op. With a
// step-size projection (CrossShape::rank > 0) delta is low-rank and each route's delta plane is
// projected into the workspace where it is read (the full-rank delta is never stored).
//
// Like scan_2d_kernel.h, compiled once per instruction set inside namespace VMAMBA2D_ISA.
#pragma once
#ifndef VMAMBA2D_ISA
#error "define VMAMBA2D_ISA (the instruction-set namespace) before including scan_2d_routes_kernel.h"
#endif

#include <cstdint>

#include "scan_2d_kernel.h"
#include "scan_2d_types.h"

namespace vmamba2d {
namespace cpu {
namespace VMAMBA2D_ISA {

// plane[p] = sum over r in order of weights[r] * low[r * L + p]: one route's projected step sizes.
// Whole blocks of kProjectBlock cells accumulate in registers over r (independent vector chains)
// and are stored once; the cells after the last whole block (all of them on small maps) accumulate
// in the plane, one vectorised pass per r. (A per-cell loop over r does not vectorise, and one
// 16-cell chain per block waits on the FMA latency: on a 7x7 map with R = 48 either took 2-4x
// the batched matmul's time.)
constexpr int64_t kProjectBlock = 64;

template <typename T>
void project_delta(const T* __restrict weights, const T* __restrict low, int64_t rank, int64_t length,
                   T* __restrict plane) {
  int64_t start = 0;
  for (; start + kProjectBlock <= length; start += kProjectBlock) {
    T acc[kProjectBlock];
    for (int64_t j = 0; j < kProjectBlock; ++j) acc[j] = weights[0] * low[start + j];
    for (int64_t r = 1; r < rank; ++r) {
      const T w = weights[r];
      const T* row = low + r * length + start;
      for (int64_t j = 0; j < kProjectBlock; ++j) acc[j] += w * row[j];
    }
    for (int64_t j = 0; j < kProjectBlock; ++j) plane[start + j] = acc[j];
  }
  for (int64_t p = start; p < length; ++p) plane[p] = weights[0] * low[p];
  for (int64_t r = 1; r < rank; ++r) {
    const T w = weights[r];
    const T* row = low + r * length;
    for (int64_t p = start; p < length; ++p) plane[p] += w * row[p];
  }
}

// Route k's step sizes (before bias / softplus) for channel d of sample b: its plane of delta, or,
// with a step-size projection, the plane projected into `scratch` (L values).
template <typename T>
const T* route_delta(const ScanInputs<T>& in, const CrossShape& s, int64_t b, int64_t k, int64_t d, T* scratch) {
  const int64_t L = s.length();
  if (!in.delta_proj) return in.delta + ((b * s.routes + k) * s.dim + d) * L;
  project_delta(in.delta_proj + (k * s.dim + d) * s.rank, in.delta + (b * s.routes + k) * s.rank * L, s.rank, L,
                scratch);
  return scratch;
}

// Route k's inputs for channel d of sample b, with u the channel's plane (L contiguous values);
// `scratch` (L values) holds the projected step sizes when there is a projection.
template <typename T>
ChannelInputs<T> route_channel_inputs(const ScanInputs<T>& in, const CrossShape& s, const T* u, int64_t b,
                                      int64_t k, int64_t d, T* scratch) {
  const int64_t L = s.length();
  const int64_t row = k * s.dim + d;  // of A, D, delta_bias
  const int64_t route_maps = (b * s.routes + k) * s.nstate * L;
  return {u,
          route_delta(in, s, b, k, d, scratch),
          in.B + route_maps,
          in.C + route_maps,
          in.A + row * s.nstate,
          in.delta_bias ? in.delta_bias[row] : T(0),
          in.D ? in.D[row] : T(0)};
}

// The routes' skip weights of channel d, summed in route order.
template <typename T>
T total_skip(const ScanInputs<T>& in, const CrossShape& s, int64_t d) {
  T total = T(0);
  if (in.D) {
    for (int64_t k = 0; k < s.routes; ++k) total += in.D[k * s.dim + d];
  }
  return total;
}

// A channel's plane of a channels-last map (`stride` values between pixels) into contiguous `out`,
// and back.
template <typename T>
void gather_plane(const T* plane, int64_t stride, int64_t length, T* __restrict out) {
  for (int64_t p = 0; p < length; ++p) out[p] = plane[p * stride];
}

template <typename T>
void scatter_plane(const T* __restrict values, int64_t length, int64_t stride, T* plane) {
  for (int64_t p = 0; p < length; ++p) plane[p * stride] = values[p];
}

// Channel d of sample b of y (a map in u's layout) = the sum over routes k in order of route k's
// output; routes: the K route codes. Channels-last planes are scanned in contiguous copies.
template <typename T>
void cross_forward_channel(const ScanInputs<T>& in, const CrossShape& s, const int64_t* routes, int64_t b,
                           int64_t d, T* y_map, Workspace<T>& ws) {
  const int64_t L = s.length();
  const int64_t stride = s.pixel_stride();
  const T* u = in.u + s.map_offset(b, d);
  T* y = y_map + s.map_offset(b, d);
  if (stride != 1) {
    T* u_plane = ws.array(kForwardArrays);
    gather_plane(u, stride, L, u_plane);
    u = u_plane;
    y = ws.array(kForwardArrays + 1);
  }
  const T skip = total_skip(in, s, d);
  for (int64_t p = 0; p < L; ++p) y[p] = skip * u[p];
  for (int64_t k = 0; k < s.routes; ++k) {
    add_route_output(route_channel_inputs(in, s, u, b, k, d, ws.array(kForwardArrays + 2)), route_passes(routes[k]),
                     in.delta_softplus, s.map(), y, ws);
  }
  if (stride != 1) scatter_plane(y, L, stride, y_map + s.map_offset(b, d));
}

// Gradients of channel d of sample b for every route: du (a map in u's layout, like dy) collects
// the routes' terms; route_grads[k] says where route k's other gradients go (its du is set here).
template <typename T>
void cross_backward_channel(const ScanInputs<T>& in, const CrossShape& s, const int64_t* routes, int64_t b,
                            int64_t d, const T* dy_map, T* du_map, ChannelGrads<T>* route_grads, Workspace<T>& ws) {
  const int64_t L = s.length();
  const int64_t stride = s.pixel_stride();
  const T* u = in.u + s.map_offset(b, d);
  const T* dy = dy_map + s.map_offset(b, d);
  T* du = du_map + s.map_offset(b, d);
  if (stride != 1) {
    T* u_plane = ws.array(kBackwardArrays);
    T* dy_plane = ws.array(kBackwardArrays + 1);
    gather_plane(u, stride, L, u_plane);
    gather_plane(dy, stride, L, dy_plane);
    u = u_plane;
    dy = dy_plane;
    du = ws.array(kBackwardArrays + 2);
  }
  const T skip = total_skip(in, s, d);
  for (int64_t p = 0; p < L; ++p) du[p] = skip * dy[p];
  if (in.D) {
    const T dskip = skip_grad(dy, u, L, ws.array(0));
    for (int64_t k = 0; k < s.routes; ++k) *route_grads[k].dD = dskip;
  }
  for (int64_t k = 0; k < s.routes; ++k) {
    route_grads[k].du = du;
    add_route_grads(route_channel_inputs(in, s, u, b, k, d, ws.array(kBackwardArrays + 3)), route_passes(routes[k]),
                    in.delta_softplus, s.map(), dy, route_grads[k], ws);
  }
  if (stride != 1) scatter_plane(du, L, stride, du_map + s.map_offset(b, d));
}

}  // namespace VMAMBA2D_ISA
}  // namespace cpu
}  // namespace vmamba2d
