// 2D selective scan on CPU: per-(batch, channel) forward and backward kernels on raw pointers.
//
// Recurrence (docs/scan.md), per batch b, channel d, state n, pixel p = i * W + j:
//   dt = softplus(delta + delta_bias[d])   (identity without softplus)
//   a  = exp(dt * A[d, n])
//   hh[i, j] = a[i, j] * hh[i, j - 1] + dt * B[g, n, p] * u      (horizontal)
//   h[i, j]  = a[i, j] * h[i - 1, j]  + hh[i, j]                  (vertical)
//   y = sum_n C[g, n, p] * h + D[d] * u
// That is route 0 of scan_2d_passes.h; the same per-state code scans any route (the four-route
// kernel, scan_2d_routes_kernel.h, runs several per channel).
//
// The kernels work on one state map of L = H * W values at a time, in a per-thread workspace of a
// few such maps, so the N per-state maps of a batch are never materialised.
//
// This file is compiled once per instruction set (scan_2d_isa_*.cpp): it must be included with
// VMAMBA2D_ISA defined to the namespace of that build, so each build's functions stay distinct.
#pragma once
#ifndef VMAMBA2D_ISA
#error "define VMAMBA2D_ISA (the instruction-set namespace) before including scan_2d_kernel.h"
#endif

#include <algorithm>
#include <cstdint>

#include "scan_2d_math.h"
#include "scan_2d_passes.h"
#include "scan_2d_types.h"

namespace vmamba2d {
namespace cpu {
namespace VMAMBA2D_ISA {

// dt[p] = softplus(delta[p] + bias) (or without softplus); also dt_u[p] = dt[p] * u[p].
template <typename T>
void compute_dt(const T* delta, const T* u, T bias, bool use_softplus, int64_t length, T* dt, T* dt_u) {
  if (use_softplus) {
    for (int64_t p = 0; p < length; ++p) dt[p] = Math<T>::softplus(delta[p] + bias);
  } else {
    for (int64_t p = 0; p < length; ++p) dt[p] = delta[p] + bias;
  }
  for (int64_t p = 0; p < length; ++p) dt_u[p] = dt[p] * u[p];
}

// decay[p] = exp(dt[p] * a_rate) and x[p] = dt_u[p] * b[p] for one state.
template <typename T>
void discretize_state(const T* dt, const T* dt_u, const T* b, T a_rate, int64_t length, T* decay, T* x) {
  for (int64_t p = 0; p < length; ++p) decay[p] = Math<T>::exp(dt[p] * a_rate);
  for (int64_t p = 0; p < length; ++p) x[p] = dt_u[p] * b[p];
}

// One channel's slices of the inputs for one route: its maps, its route's / group's B and C, its
// scalars.
template <typename T>
struct ChannelInputs {
  const T* u;        // (L,)
  const T* delta;    // (L,)
  const T* B;        // (N, L)
  const T* C;        // (N, L)
  const T* a_rates;  // (N,): the channel's row of A
  T bias;            // its delta_bias or 0
  T skip;            // its D or 0
};

template <typename T>
ChannelInputs<T> channel_inputs(const ScanInputs<T>& in, const ScanShape& s, int64_t b, int64_t d) {
  const int64_t L = s.length();
  const int64_t offset = (b * s.dim + d) * L;
  const int64_t group_offset = (b * s.groups + d / s.channels_per_group()) * s.nstate * L;
  return {in.u + offset,          in.delta + offset, in.B + group_offset,
          in.C + group_offset,    in.A + d * s.nstate, in.delta_bias ? in.delta_bias[d] : T(0),
          in.D ? in.D[d] : T(0)};
}

// The scratch maps of one state's scans (L values each; carries: one per line of a flat route).
template <typename T>
struct StateMaps {
  T* decay;
  T* hh;        // the first pass's result (2D routes); holds x = dt * B * u on entry
  T* h;         // the state
  T* lambda;    // dL/dh, then dL/d(decay)
  T* mu;        // dL/dhh = dL/dx
  T* products;  // running decay products along the lines of a flat route
  T* carries;
};

// In place in m.h: x -> the state of one route.
template <typename T>
void scan_state(const RoutePasses& route, const StateMaps<T>& m, const MapShape& shape) {
  const int64_t H = shape.height;
  const int64_t W = shape.width;
  if (route.flat) {
    scan_lines<T, false>(route.first, route.second, {m.decay, m.h, nullptr, m.h, m.products}, m.carries, H, W);
    return;
  }
  const PassArrays<T> in_place{m.decay, m.h, nullptr, m.h, nullptr};
  scan_pass<T, false>(route.first, in_place, H, W);
  scan_pass<T, false>(route.second, in_place, H, W);
}

// Recomputes one state of one route from x (in m.hh) and runs its adjoint recurrences for the
// seed C * dy: leaves the state in m.h, dL/dx in m.mu and dL/d(decay) in m.lambda.
//   2D:   lambda = adjoint of the second pass (C dy), mu = adjoint of the first pass (lambda),
//         dL/da = lambda * h[previous along the second pass] + mu * hh[previous along the first]
//   flat: mu = g, the adjoint of the whole sequence, and dL/da = g * h[previous in the sequence]
template <typename T>
void scan_state_adjoint(const RoutePasses& route, const T* c, const T* dy, const StateMaps<T>& m,
                        const MapShape& shape) {
  const int64_t H = shape.height;
  const int64_t W = shape.width;
  if (route.flat) {
    scan_lines<T, false>(route.first, route.second, {m.decay, m.hh, nullptr, m.h, m.products}, m.carries, H, W);
    scan_lines<T, true>(opposite(route.first), opposite(route.second), {m.decay, dy, c, m.mu, m.products},
                        m.carries, H, W);
    product_with_previous(route.first, m.mu, m.h, m.lambda, false, H, W);
    const LineOrder lines(route.first, route.second, H, W);
    for (int64_t t = 1; t < lines.count(); ++t) {
      const int64_t start = lines.first_cell(t);
      m.lambda[start] = m.mu[start] * m.h[lines.last_cell(t - 1)];
    }
    return;
  }
  scan_pass<T, false>(route.first, {m.decay, m.hh, nullptr, m.hh, nullptr}, H, W);
  scan_pass<T, false>(route.second, {m.decay, m.hh, nullptr, m.h, nullptr}, H, W);
  scan_pass<T, true>(opposite(route.second), {m.decay, dy, c, m.lambda, nullptr}, H, W);
  scan_pass<T, true>(opposite(route.first), {m.decay, m.lambda, nullptr, m.mu, nullptr}, H, W);
  product_with_previous(route.second, m.lambda, m.h, m.lambda, false, H, W);
  product_with_previous(route.first, m.mu, m.hh, m.lambda, true, H, W);
}

// Adds one route's sum_n C[n, p] * h_n[p] into y (L,) for one channel.
// Workspace: dt, dt_u, decay, h, products, carries (kForwardArrays).
template <typename T>
void add_route_output(const ChannelInputs<T>& ch, const RoutePasses& route, bool delta_softplus,
                      const MapShape& shape, T* y, Workspace<T>& ws) {
  const int64_t L = shape.length();
  T* dt = ws.array(0);
  T* dt_u = ws.array(1);
  const StateMaps<T> m{ws.array(2), nullptr, ws.array(3), nullptr, nullptr, ws.array(4), ws.array(5)};
  const T* h = m.h;
  compute_dt(ch.delta, ch.u, ch.bias, delta_softplus, L, dt, dt_u);
  for (int64_t n = 0; n < shape.nstate; ++n) {
    const T* c_n = ch.C + n * L;
    discretize_state(dt, dt_u, ch.B + n * L, ch.a_rates[n], L, m.decay, m.h);
    scan_state(route, m, shape);
    for (int64_t p = 0; p < L; ++p) y[p] += c_n[p] * h[p];
  }
}

// One state's gradient terms through decay = exp(dt * A) and x = dt * B * u, given
// ddecay = dL/d(decay) and mu = dL/dx: dA's per-pixel terms, and the accumulations into
// d(dt), dB and du. The arrays never overlap (restrict lets the compiler vectorise).
template <typename T>
void chain_state_grads(const T* __restrict ddecay, const T* __restrict decay, const T* __restrict mu,
                       const T* __restrict dt, const T* __restrict dt_u, const T* __restrict u,
                       const T* __restrict b, T a_rate, int64_t length, T* __restrict da_terms,
                       T* __restrict ddt, T* __restrict db, T* __restrict du) {
  for (int64_t p = 0; p < length; ++p) {
    const T dlog_decay = ddecay[p] * decay[p];  // dL/d(dt * A)
    da_terms[p] = dlog_decay * dt[p];
    ddt[p] += dlog_decay * a_rate + mu[p] * b[p] * u[p];
    db[p] += mu[p] * dt_u[p];
    du[p] += mu[p] * dt[p] * b[p];
  }
}

// One route's gradients for one channel, recomputing its scans state by state: adds into out.du
// and into the route's out.dB / out.dC; writes out.ddelta, out.dA and out.ddelta_bias (when set),
// never out.dD. Workspace: dt, dt_u, ddt, decay, hh, h, lambda, mu, products, carries
// (kBackwardArrays).
template <typename T>
void add_route_grads(const ChannelInputs<T>& ch, const RoutePasses& route, bool delta_softplus,
                     const MapShape& shape, const T* dy, const ChannelGrads<T>& out, Workspace<T>& ws) {
  const int64_t L = shape.length();
  T* dt = ws.array(0);
  T* dt_u = ws.array(1);
  T* ddt = ws.array(2);
  const StateMaps<T> m{ws.array(3), ws.array(4), ws.array(5), ws.array(6),
                       ws.array(7), ws.array(8), ws.array(9)};
  compute_dt(ch.delta, ch.u, ch.bias, delta_softplus, L, dt, dt_u);
  std::fill(ddt, ddt + L, T(0));

  for (int64_t n = 0; n < shape.nstate; ++n) {
    const T* b_n = ch.B + n * L;
    const T* c_n = ch.C + n * L;
    T* dc_n = out.dC + n * L;
    const T a_rate = ch.a_rates[n];
    discretize_state(dt, dt_u, b_n, a_rate, L, m.decay, m.hh);
    scan_state_adjoint(route, c_n, dy, m, shape);
    for (int64_t p = 0; p < L; ++p) dc_n[p] += dy[p] * m.h[p];
    // Chain through decay = exp(dt * A) and x = dt * B * u (dx = mu); h is free for dA's terms.
    T* da_terms = m.h;
    chain_state_grads(m.lambda, m.decay, m.mu, dt, dt_u, ch.u, b_n, a_rate, L, da_terms, ddt, out.dB + n * L,
                      out.du);
    out.dA[n] = sum_values(da_terms, L);
  }

  if (delta_softplus) {
    for (int64_t p = 0; p < L; ++p) out.ddelta[p] = ddt[p] * Math<T>::sigmoid(ch.delta[p] + ch.bias);
  } else {
    std::copy(ddt, ddt + L, out.ddelta);
  }
  if (out.ddelta_bias) *out.ddelta_bias = sum_values(out.ddelta, L);
}

// sum_p dy[p] * u[p]: the skip weight's gradient (scratch: L values).
template <typename T>
T skip_grad(const T* dy, const T* u, int64_t length, T* scratch) {
  for (int64_t p = 0; p < length; ++p) scratch[p] = dy[p] * u[p];
  return sum_values(scratch, length);
}

// y for one (batch, channel): y[p] = sum_n C[n, p] * h_n[p] + D * u[p].
template <typename T>
void forward_channel(const ScanInputs<T>& in, const ScanShape& s, int64_t b, int64_t d, T* y,
                     Workspace<T>& ws) {
  const ChannelInputs<T> ch = channel_inputs(in, s, b, d);
  for (int64_t p = 0; p < s.length(); ++p) y[p] = ch.skip * ch.u[p];
  add_route_output(ch, route_passes(0), in.delta_softplus, s.map(), y, ws);
}

// Gradients of one (batch, channel): du, ddelta, dA, dD, ddelta_bias of the channel, and its
// accumulations into its group's dB / dC.
template <typename T>
void backward_channel(const ScanInputs<T>& in, const ScanShape& s, int64_t b, int64_t d, const T* dy,
                      const ChannelGrads<T>& out, Workspace<T>& ws) {
  const int64_t L = s.length();
  const ChannelInputs<T> ch = channel_inputs(in, s, b, d);
  for (int64_t p = 0; p < L; ++p) out.du[p] = ch.skip * dy[p];
  if (out.dD) *out.dD = skip_grad(dy, ch.u, L, ws.array(0));
  add_route_grads(ch, route_passes(0), in.delta_softplus, s.map(), dy, out, ws);
}

}  // namespace VMAMBA2D_ISA
}  // namespace cpu
}  // namespace vmamba2d
