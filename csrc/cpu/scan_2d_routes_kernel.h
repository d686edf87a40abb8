// The four-route scan on CPU: per-(batch, channel) kernels that run every route of one channel.
//
// Route k of channel d reads the shared map u[b, d] and its own delta[b, k, d], B[b, k], C[b, k],
// A / D / delta_bias row k * dim + d, and scans in the direction its code says
// (scan_2d_passes.h); y[b, d] is the sum of the routes' outputs, added in route order. Nothing is
// copied per route: the routes only change the loops' directions.
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

template <typename T>
ChannelInputs<T> route_channel_inputs(const ScanInputs<T>& in, const CrossShape& s, int64_t b, int64_t k,
                                      int64_t d) {
  const int64_t L = s.length();
  const int64_t row = k * s.dim + d;  // of A, D, delta_bias
  const int64_t route_maps = (b * s.routes + k) * s.nstate * L;
  return {in.u + (b * s.dim + d) * L,
          in.delta + ((b * s.routes + k) * s.dim + d) * L,
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

// y[b, d] (L,) = sum over routes k in order of route k's output; routes: the K route codes.
template <typename T>
void cross_forward_channel(const ScanInputs<T>& in, const CrossShape& s, const int64_t* routes, int64_t b,
                           int64_t d, T* y, Workspace<T>& ws) {
  const T skip = total_skip(in, s, d);
  const T* u = in.u + (b * s.dim + d) * s.length();
  for (int64_t p = 0; p < s.length(); ++p) y[p] = skip * u[p];
  for (int64_t k = 0; k < s.routes; ++k) {
    add_route_output(route_channel_inputs(in, s, b, k, d), route_passes(routes[k]), in.delta_softplus, s.map(),
                     y, ws);
  }
}

// Gradients of channel d of batch b for every route: route_grads[k] says where route k's go (all
// with the same du, which collects the routes' terms).
template <typename T>
void cross_backward_channel(const ScanInputs<T>& in, const CrossShape& s, const int64_t* routes, int64_t b,
                            int64_t d, const T* dy, const ChannelGrads<T>* route_grads, Workspace<T>& ws) {
  const int64_t L = s.length();
  const T skip = total_skip(in, s, d);
  const T* u = in.u + (b * s.dim + d) * L;
  T* du = route_grads[0].du;
  for (int64_t p = 0; p < L; ++p) du[p] = skip * dy[p];
  if (in.D) {
    const T dskip = skip_grad(dy, u, L, ws.array(0));
    for (int64_t k = 0; k < s.routes; ++k) *route_grads[k].dD = dskip;
  }
  for (int64_t k = 0; k < s.routes; ++k) {
    add_route_grads(route_channel_inputs(in, s, b, k, d), route_passes(routes[k]), in.delta_softplus, s.map(), dy,
                    route_grads[k], ws);
  }
}

}  // namespace VMAMBA2D_ISA
}  // namespace cpu
}  // namespace vmamba2d
