// The four-route scan on CPU: per-(batch, channel) kernels that run every route of one channel.
//
// Route k of channel d reads the shared map u[b, d] and its own delta[b, k, d], B[b, k], C[b, k],
// A / D / delta_bias row k * dim + d, and scans in the direction its code says
// (scan_2d_passes.h); y[b, d] is the sum of the routes' outputs, added in route order. Nothing is
// copied per route: the routes only change the loops' directions. u and y (dy and du) may be
// channels-last, as the models' maps are: a channel's plane is then gathered into the workspace
// once and its result scattered back, so the map needs no layout copy outside the op. With a
// step-size projection (CrossShape::rank > 0) delta is low-rank and each call runs a group of
// channels: route by route, the group's delta planes are projected together into the workspace
// where they are read (the full-rank delta is never stored), then each channel scans the route.
//
// Like scan_2d_kernel.h, compiled once per instruction set inside namespace VMAMBA2D_ISA.
#pragma once
#ifndef VMAMBA2D_ISA
#error "define VMAMBA2D_ISA (the instruction-set namespace) before including scan_2d_routes_kernel.h"
#endif

#include <algorithm>
#include <cstdint>

#include "scan_2d_kernel.h"
#include "scan_2d_types.h"

namespace vmamba2d {
namespace cpu {
namespace VMAMBA2D_ISA {

// plane[p] = sum over r in order of weights[r] * low[r * L + p]: one channel's projected step sizes
// (used where a route has fewer channels than a group). Whole blocks of kProjectBlock cells
// accumulate in registers over r and are stored once; the cells after the last whole block
// accumulate in the plane, one vectorised pass per r.
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

// One vector register of the build's instruction set, as a GCC / Clang vector type: the block of
// cells of project_delta_group. (Written with plain arrays, GCC vectorised that loop nest across
// the channels, with transposes, and ran 3-4x slower than one channel at a time.)
template <typename T>
struct ProjectVector;
template <>
struct ProjectVector<float> {
  typedef float type __attribute__((vector_size(VMAMBA2D_VECTOR_BYTES)));
};
template <>
struct ProjectVector<double> {
  typedef double type __attribute__((vector_size(VMAMBA2D_VECTOR_BYTES)));
};

template <typename Vector, typename T>
Vector load_vector(const T* from) {
  Vector v;
  __builtin_memcpy(&v, from, sizeof(v));
  return v;
}

// planes[g * L + p] = sum over r in order of weights[g * rank + r] * low[r * L + p] for the
// kProjectChannels channels g of a group (weights: their rows, `rank` apart): the same sums as
// project_delta, in a register block of one vector of cells per channel, so each vector of `low`
// is loaded once per r for the whole group and the group's kProjectChannels FMA chains run side by
// side (a matrix-multiply micro-kernel). The last block of a map that is not a whole number of
// vectors starts one vector before the end, overlapping the block before it (its cells get the
// same values again); maps smaller than a vector go through project_delta.
template <typename T>
void project_delta_group(const T* __restrict weights, const T* __restrict low, int64_t rank, int64_t length,
                         T* __restrict planes) {
  using Vector = typename ProjectVector<T>::type;
  constexpr int64_t G = kProjectChannels;
  constexpr int64_t V = sizeof(Vector) / sizeof(T);
  if (length < V) {
    for (int64_t g = 0; g < G; ++g) project_delta(weights + g * rank, low, rank, length, planes + g * length);
    return;
  }
  for (int64_t next = 0; next < length; next += V) {
    const int64_t start = std::min(next, length - V);
    Vector acc[G];
    const Vector first = load_vector<Vector>(low + start);
#pragma GCC unroll 8
    for (int64_t g = 0; g < G; ++g) acc[g] = weights[g * rank] * first;
    for (int64_t r = 1; r < rank; ++r) {
      const Vector row = load_vector<Vector>(low + r * length + start);
#pragma GCC unroll 8
      for (int64_t g = 0; g < G; ++g) acc[g] += weights[g * rank + r] * row;
    }
#pragma GCC unroll 8
    for (int64_t g = 0; g < G; ++g) __builtin_memcpy(planes + g * length + start, &acc[g], sizeof(Vector));
  }
}

// Route k's step sizes (before bias / softplus) of channels [d, d + count) of sample b, count at
// most s.channel_group(): a pointer to their planes (L values each, one after the other). Without
// a projection, delta's own planes; with one, projected into `scratch` (s.channel_group() planes).
template <typename T>
const T* route_deltas(const ScanInputs<T>& in, const CrossShape& s, int64_t b, int64_t k, int64_t d, int64_t count,
                      T* scratch) {
  const int64_t L = s.length();
  if (!in.delta_proj) return in.delta + ((b * s.routes + k) * s.dim + d) * L;
  const T* low = in.delta + (b * s.routes + k) * s.rank * L;
  const T* weights = in.delta_proj + k * s.dim * s.rank;  // route k's (dim, rank) rows
  if (s.dim < kProjectChannels) {
    for (int64_t g = 0; g < count; ++g) project_delta(weights + (d + g) * s.rank, low, s.rank, L, scratch + g * L);
    return scratch;
  }
  // A group that would run past the last channel is projected from kProjectChannels before it.
  const int64_t first = std::min(d, s.dim - kProjectChannels);
  project_delta_group(weights + first * s.rank, low, s.rank, L, scratch);
  return scratch + (d - first) * L;
}

// Route k's inputs for channel d of sample b, with u the channel's plane (L contiguous values) and
// delta its step sizes (L values, before bias / softplus).
template <typename T>
ChannelInputs<T> route_channel_inputs(const ScanInputs<T>& in, const CrossShape& s, const T* u, const T* delta,
                                      int64_t b, int64_t k, int64_t d) {
  const int64_t row = k * s.dim + d;  // of A, D, delta_bias
  const int64_t route_maps = (b * s.routes + k) * s.nstate * s.length();
  return {u,
          delta,
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

// A channel's plane of a map (`stride` values between pixels) as `length` contiguous values: the
// plane itself when it is contiguous, else its copy gathered into `scratch`.
template <typename T>
const T* contiguous_plane(const T* plane, int64_t stride, int64_t length, T* __restrict scratch) {
  if (stride == 1) return plane;
  for (int64_t p = 0; p < length; ++p) scratch[p] = plane[p * stride];
  return scratch;
}

// Contiguous `values` back into a channel's plane of a channels-last map.
template <typename T>
void scatter_plane(const T* __restrict values, int64_t length, int64_t stride, T* plane) {
  for (int64_t p = 0; p < length; ++p) plane[p * stride] = values[p];
}

// Channels [d_begin, d_end) of sample b of y (a map in u's layout; at most s.channel_group()
// channels): each channel's y is the sum over routes k in order of route k's output. Route by
// route, the group's step sizes are projected together, then each channel scans the route.
// Channels-last planes are scanned in contiguous copies. routes: the K route codes. Workspace:
// cross_forward_arrays(s.channel_group()) arrays.
template <typename T>
void cross_forward_channels(const ScanInputs<T>& in, const CrossShape& s, const int64_t* routes, int64_t b,
                            int64_t d_begin, int64_t d_end, T* y_map, Workspace<T>& ws) {
  const int64_t L = s.length();
  const int64_t stride = s.pixel_stride();
  const int64_t group = s.channel_group();
  const int64_t count = d_end - d_begin;
  T* delta_planes = ws.array(kForwardArrays);
  const T* u[kProjectChannels];
  T* y[kProjectChannels];
  for (int64_t g = 0; g < count; ++g) {
    const int64_t d = d_begin + g;
    u[g] = contiguous_plane(in.u + s.map_offset(b, d), stride, L, ws.array(kForwardArrays + group + g));
    y[g] = stride == 1 ? y_map + s.map_offset(b, d) : ws.array(kForwardArrays + 2 * group + g);
    const T skip = total_skip(in, s, d);
    for (int64_t p = 0; p < L; ++p) y[g][p] = skip * u[g][p];
  }
  for (int64_t k = 0; k < s.routes; ++k) {
    const T* deltas = route_deltas(in, s, b, k, d_begin, count, delta_planes);
    for (int64_t g = 0; g < count; ++g) {
      add_route_output(route_channel_inputs(in, s, u[g], deltas + g * L, b, k, d_begin + g), route_passes(routes[k]),
                       in.delta_softplus, s.map(), y[g], ws);
    }
  }
  if (stride != 1) {
    for (int64_t g = 0; g < count; ++g) scatter_plane(y[g], L, stride, y_map + s.map_offset(b, d_begin + g));
  }
}

// Gradients of channels [d_begin, d_end) of sample b (at most s.channel_group()) for every route:
// du (a map in u's layout, like dy) collects each channel's route terms; route_grads[g * K + k]
// says where route k's other gradients of channel d_begin + g go (its du is set here). Route by
// route as cross_forward_channels. Workspace: cross_backward_arrays(s.channel_group()) arrays.
template <typename T>
void cross_backward_channels(const ScanInputs<T>& in, const CrossShape& s, const int64_t* routes, int64_t b,
                             int64_t d_begin, int64_t d_end, const T* dy_map, T* du_map,
                             ChannelGrads<T>* route_grads, Workspace<T>& ws) {
  const int64_t L = s.length();
  const int64_t K = s.routes;
  const int64_t stride = s.pixel_stride();
  const int64_t group = s.channel_group();
  const int64_t count = d_end - d_begin;
  T* delta_planes = ws.array(kBackwardArrays);
  const T* u[kProjectChannels];
  const T* dy[kProjectChannels];
  T* du[kProjectChannels];
  for (int64_t g = 0; g < count; ++g) {
    const int64_t d = d_begin + g;
    u[g] = contiguous_plane(in.u + s.map_offset(b, d), stride, L, ws.array(kBackwardArrays + group + g));
    dy[g] = contiguous_plane(dy_map + s.map_offset(b, d), stride, L, ws.array(kBackwardArrays + 2 * group + g));
    du[g] = stride == 1 ? du_map + s.map_offset(b, d) : ws.array(kBackwardArrays + 3 * group + g);
    const T skip = total_skip(in, s, d);
    for (int64_t p = 0; p < L; ++p) du[g][p] = skip * dy[g][p];
    if (in.D) {
      const T dskip = skip_grad(dy[g], u[g], L, ws.array(0));
      for (int64_t k = 0; k < K; ++k) *route_grads[g * K + k].dD = dskip;
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    const T* deltas = route_deltas(in, s, b, k, d_begin, count, delta_planes);
    for (int64_t g = 0; g < count; ++g) {
      ChannelGrads<T>& grads = route_grads[g * K + k];
      grads.du = du[g];
      add_route_grads(route_channel_inputs(in, s, u[g], deltas + g * L, b, k, d_begin + g), route_passes(routes[k]),
                      in.delta_softplus, s.map(), dy[g], grads, ws);
    }
  }
  if (stride != 1) {
    for (int64_t g = 0; g < count; ++g) scatter_plane(du[g], L, stride, du_map + s.map_offset(b, d_begin + g));
  }
}

}  // namespace VMAMBA2D_ISA
}  // namespace cpu
}  // namespace vmamba2d
