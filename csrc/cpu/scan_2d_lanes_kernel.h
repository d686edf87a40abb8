// The four-route forward with one channel per vector lane (float, channels-last maps, step-size
// projection: lane_forward in scan_2d_types.h).
//
// The per-channel kernel (scan_2d_routes_kernel.h) scans one channel's plane at a time and can only
// vectorise along the map: its passes along rows are serial, and on the small maps of the late
// stages (14 x 14, 7 x 7) a row is shorter than a vector. Here a call's kLaneChannels channels go
// across the lanes of one LaneFloats vector (an AVX-512 register), so every step of the scan is one
// vector operation whatever the map's size: a pixel's channels are adjacent in a channels-last
// map, and its B, C and low-rank step sizes are one value for all of them.
//
// A route is one sweep over the map: the lines of its first pass (rows, or columns) in the order
// of its second pass, each line in the first pass's direction. A 2D route keeps the first pass's
// carry along the line and, per cell of a line, the second pass's carry from the previous line:
//   hh = a * hh_before + x            (first pass, along the line)
//   h  = a * h_previous_line + hh     (second pass, across the lines)
// which is what the two passes over the whole map compute (the second pass at a line only needs
// that line's hh); a flat route's state runs on from the end of one line into the next. The
// values are those of the per-channel kernel: the same step-size sums in the same order, the same
// exp / softplus approximations (scan_2d_math.h), the same operations per cell (flat routes: the
// per-channel kernel combines each line's carry afterwards, which rounds differently).
//
// Compiled in the AVX-512 build only (scan_2d_isa_avx512.cpp; see scan_2d_isa.h), inside its
// namespace VMAMBA2D_ISA like scan_2d_kernel.h.
#pragma once
#ifndef VMAMBA2D_ISA
#error "define VMAMBA2D_ISA (the instruction-set namespace) before including scan_2d_lanes_kernel.h"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "scan_2d_kernel.h"  // with the math and passes of this build
#include "scan_2d_routes_kernel.h"
#include "scan_2d_types.h"

namespace vmamba2d {
namespace cpu {
namespace VMAMBA2D_ISA {

static_assert(kVectorFloats == kLaneChannels, "a call's channels are one vector");

inline LaneFloats load_lanes(const float* from) { return load_vector<LaneFloats>(from); }

inline void store_lanes(float* to, LaneFloats v) { std::memcpy(to, &v, sizeof(v)); }

// Lane l = values[l * stride] (a column of a row-major table).
inline LaneFloats gather_lanes(const float* values, int64_t stride) {
  LaneFloats v;
  for (int64_t l = 0; l < kLaneChannels; ++l) v[l] = values[l * stride];
  return v;
}

// A route's sweep: the lines of its first pass in the order of its second, each in the first
// pass's direction: line(t) is the t-th line visited, position(q) the place of its q-th cell.
struct LaneSweep {
  int64_t lines;        // rows (first pass along rows) or columns
  int64_t line_length;  // cells per line
  int64_t line_step;    // between adjacent lines
  int64_t cell_step;    // between adjacent cells of a line
  bool lines_reversed;  // the second pass runs bottom-up / right-to-left
  bool cells_reversed;  // the first pass runs right-to-left / bottom-up

  LaneSweep(const RoutePasses& route, int64_t height, int64_t width)
      : lines(route.first.along_rows ? height : width),
        line_length(route.first.along_rows ? width : height),
        line_step(route.first.along_rows ? width : 1),
        cell_step(route.first.along_rows ? 1 : width),
        lines_reversed(route.second.reverse),
        cells_reversed(route.first.reverse) {}

  int64_t line(int64_t t) const { return lines_reversed ? lines - 1 - t : t; }
  int64_t position(int64_t q) const { return cells_reversed ? line_length - 1 - q : q; }
};

// Where route k's inputs of the lanes' channels [d0, d0 + kLaneChannels) of sample b start.
// weights: the projection as (routes, rank, dim) (cross_forward_lanes).
struct LaneRoute {
  int64_t row;            // of A, D, delta_bias: the lanes' first channel of route k
  LaneFloats bias;        // the lanes' delta_bias, or 0
  const float* weights;   // the lanes' projection weights of rank r at r * dim
  const float* low;       // (R, L) low-rank step sizes
  const float* B;         // (N, L)
  const float* C;         // (N, L)
  const float* u;         // the lanes' first channel in the channels-last map

  LaneRoute(const ScanInputs<float>& in, const CrossShape& s, const float* projection, int64_t b, int64_t k,
            int64_t d0)
      : row(k * s.dim + d0),
        bias(in.delta_bias ? load_lanes(in.delta_bias + row) : LaneFloats{}),
        weights(projection + k * s.rank * s.dim + d0),
        low(in.delta + (b * s.routes + k) * s.rank * s.length()),
        B(in.B + (b * s.routes + k) * s.nstate * s.length()),
        C(in.C + (b * s.routes + k) * s.nstate * s.length()),
        u(in.u + s.map_offset(b, d0)) {}
};

// Adds route k's output to y (L vectors) for the lanes' channels [d0, d0 + kLaneChannels) of
// sample b. kStates: N when it is a compile-time constant (1, the models'), else 0. weights: the
// projection as (routes, rank, dim) (cross_forward_lanes). Scratch: the workspace after y
// (lane_forward_arrays). A line is scanned in blocks of kLaneBlock cells: first the block's step
// sizes (kLaneBlock independent R-term sums in registers), decays and inputs x, whose long
// dependency chains overlap across the cells; then the scan through the block's cells in order.
template <int64_t kStates>
void add_lane_route(const ScanInputs<float>& in, const CrossShape& s, const float* weights, int64_t route_code,
                    int64_t b, int64_t k, int64_t d0, LaneFloats* y, LaneFloats* scratch) {
  const int64_t L = s.length();
  const int64_t N = kStates > 0 ? kStates : s.nstate;
  const int64_t R = s.rank;
  const int64_t line = s.height > s.width ? s.height : s.width;
  LaneFloats* second_carry = scratch;            // [position * N + n]
  LaneFloats* rates = second_carry + line * N;   // [n]: A of the lanes' channels
  LaneFloats* block_memory = rates + N;          // [j * N + n] decays, then inputs (kStates == 0)
  const LaneRoute route(in, s, weights, b, k, d0);
  for (int64_t n = 0; n < N; ++n) rates[n] = gather_lanes(in.A + route.row * N + n, N);
  LaneFloats block_registers[2 * kLaneBlock * (kStates > 0 ? kStates : 1)];
  LaneFloats* decays = kStates > 0 ? block_registers : block_memory;
  LaneFloats* inputs = decays + kLaneBlock * N;

  const RoutePasses passes = route_passes(route_code);
  const LaneSweep sweep(passes, s.height, s.width);
  const int64_t cells = sweep.line_length;
  for (int64_t i = 0; i < cells * N; ++i) second_carry[i] = LaneFloats{};
  LaneFloats first_carry[kStates > 0 ? kStates : kMaxLaneStates] = {};
  for (int64_t t = 0; t < sweep.lines; ++t) {
    const int64_t line_start = sweep.line(t) * sweep.line_step;
    if (!passes.flat) {
      for (int64_t n = 0; n < N; ++n) first_carry[n] = LaneFloats{};
    }
    for (int64_t q0 = 0; q0 < cells; q0 += kLaneBlock) {
      // The block's cells; past the line's end its last cell again (formed, never scanned).
      int64_t p[kLaneBlock];
#pragma GCC unroll 8
      for (int64_t j = 0; j < kLaneBlock; ++j) {
        p[j] = line_start + sweep.position(q0 + j < cells ? q0 + j : cells - 1) * sweep.cell_step;
      }
      LaneFloats dt[kLaneBlock];
      const LaneFloats w0 = load_lanes(route.weights);
#pragma GCC unroll 8
      for (int64_t j = 0; j < kLaneBlock; ++j) dt[j] = w0 * route.low[p[j]];
      for (int64_t r = 1; r < R; ++r) {
        const LaneFloats w = load_lanes(route.weights + r * s.dim);
        const float* low_r = route.low + r * L;
#pragma GCC unroll 8
        for (int64_t j = 0; j < kLaneBlock; ++j) dt[j] += w * low_r[p[j]];
      }
      for (int64_t j = 0; j < kLaneBlock; ++j) {
        dt[j] += route.bias;
        if (in.delta_softplus) dt[j] = softplus_approx(dt[j]);
        const LaneFloats dt_u = dt[j] * load_lanes(route.u + p[j] * s.dim);
        for (int64_t n = 0; n < N; ++n) {
          decays[j * N + n] = exp_approx(dt[j] * rates[n]);
          inputs[j * N + n] = dt_u * route.B[n * L + p[j]];
        }
      }
      const int64_t block = cells - q0 < kLaneBlock ? cells - q0 : kLaneBlock;
      for (int64_t j = 0; j < block; ++j) {
        LaneFloats out = y[p[j]];
        for (int64_t n = 0; n < N; ++n) {
          const LaneFloats decay = decays[j * N + n];
          const LaneFloats hh = decay * first_carry[n] + inputs[j * N + n];
          first_carry[n] = hh;
          LaneFloats h = hh;
          if (!passes.flat) {
            LaneFloats& across = second_carry[sweep.position(q0 + j) * N + n];
            h = hh + decay * across;
            across = h;
          }
          out += route.C[n * L + p[j]] * h;
        }
        y[p[j]] = out;
      }
    }
  }
}

// y of channels [d_begin, d_end) of sample b (a channels-last map; at most kLaneChannels
// channels): the routes' outputs summed in route order, plus the routes' summed skip weights times
// u. The lanes are channels [d0, d0 + kLaneChannels) with d0 = min(d_begin, dim - kLaneChannels),
// so a last group of fewer channels overlaps the one before it; only [d_begin, d_end) is stored.
// weights: the step-size projection as (routes, rank, dim) (a lane's weights adjacent).
// Workspace: lane_forward_arrays(s) arrays.
void cross_forward_lanes(const ScanInputs<float>& in, const CrossShape& s, const float* weights,
                         const int64_t* routes, int64_t b, int64_t d_begin, int64_t d_end, float* y_map,
                         Workspace<float>& ws) {
  const int64_t L = s.length();
  const int64_t d0 = std::min(d_begin, s.dim - kLaneChannels);
  LaneFloats* y = reinterpret_cast<LaneFloats*>(ws.array(0));
  LaneFloats* scratch = y + L;
  const float* u = in.u + s.map_offset(b, d0);
  LaneFloats skip{};
  if (in.D) {
    for (int64_t k = 0; k < s.routes; ++k) skip += load_lanes(in.D + k * s.dim + d0);
  }
  for (int64_t p = 0; p < L; ++p) y[p] = skip * load_lanes(u + p * s.dim);
  for (int64_t k = 0; k < s.routes; ++k) {
    if (s.nstate == 1) {
      add_lane_route<1>(in, s, weights, routes[k], b, k, d0, y, scratch);
    } else {
      add_lane_route<0>(in, s, weights, routes[k], b, k, d0, y, scratch);
    }
  }
  float* out = y_map + s.map_offset(b, d0);
  if (d_begin == d0 && d_end - d_begin == kLaneChannels) {
    for (int64_t p = 0; p < L; ++p) store_lanes(out + p * s.dim, y[p]);
    return;
  }
  for (int64_t p = 0; p < L; ++p) {
    for (int64_t l = d_begin - d0; l < d_end - d0; ++l) out[p * s.dim + l] = y[p][l];
  }
}

// The sum of a vector's lanes, always in the same order (halves added pairwise).
inline float sum_lanes(LaneFloats v) {
  typedef float Half __attribute__((vector_size(sizeof(LaneFloats) / 2)));
  typedef float Quarter __attribute__((vector_size(sizeof(LaneFloats) / 4)));
  static_assert(kLaneChannels == 16, "sum_lanes halves 16 lanes");
  const Half half = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                    __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Quarter quarter = __builtin_shufflevector(half, half, 0, 1, 2, 3) + __builtin_shufflevector(half, half, 4, 5, 6, 7);
  return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

// 1 in lanes [first, last), 0 in the others (a last group's lanes that belong to the group before).
inline LaneFloats lane_mask(int64_t first, int64_t last) {
  LaneFloats mask;
  for (int64_t l = 0; l < kLaneChannels; ++l) mask[l] = l >= first && l < last ? 1.0f : 0.0f;
  return mask;
}

// The per-route scratch of the channel-lane backward, in vectors (lane_backward_arrays).
struct LaneRouteScratch {
  LaneFloats* dt;       // [p] step sizes after bias / softplus
  LaneFloats* slope;    // [p] d(dt)/d(step size): sigmoid of the step size (softplus only)
  LaneFloats* ddelta;   // [p] the route's step-size gradient
  LaneFloats* decay;    // [p * N + n]
  LaneFloats* state;    // [p * N + n] h
  LaneFloats* first;    // [p * N + n] hh, the first pass's result (2D routes)
  LaneFloats* across;   // [position * N + n] the second pass's carries, then their adjoints
};

// Route k's gradients for the lanes' channels [d0, d0 + kLaneChannels) of sample b, lanes
// [keep_first, keep_last) kept (dy is 0 in the others, so they add nothing to the sums over
// channels). dy: the lanes' dy (L vectors); du (L vectors) accumulates. Writes route k's dA,
// ddelta_bias and projection gradient rows of the kept lanes; adds the lanes' sums into route k's
// partial ddelta_low, dB and dC (LaneGrads). Recomputes the route's states in one sweep in scan
// order (stored per cell), then runs the adjoint sweep in reverse order:
//   2D:   lambda = C dy + a[next line] lambda[next line]   (dL/dh)
//         mu     = lambda + a[next cell] mu[next cell]      (dL/dhh = dL/dx)
//         dL/da  = lambda * h[previous line] + mu * hh[previous cell]
//   flat: mu = C dy + a[next] mu[next], dL/da = mu * h[previous], across line ends
// and chains through a = exp(dt * A) and x = dt * B * u as the per-channel kernel does
// (chain_state_grads). The full-rank ddelta of a route stays in the workspace.
template <int64_t kStates>
void add_lane_route_grads(const ScanInputs<float>& in, const CrossShape& s, const float* weights, int64_t route_code,
                          int64_t b, int64_t k, int64_t d0, int64_t keep_first, int64_t keep_last,
                          const LaneFloats* dy, LaneFloats* du, const LaneGrads& out, const LaneRouteScratch& m) {
  const LaneInts keep = lane_mask(keep_first, keep_last) != 0.0f;
  const int64_t L = s.length();
  const int64_t N = kStates > 0 ? kStates : s.nstate;
  const int64_t R = s.rank;
  const LaneRoute route(in, s, weights, b, k, d0);
  const int64_t row = route.row;
  LaneFloats rates[kStates > 0 ? kStates : kMaxLaneBackwardStates];
  for (int64_t n = 0; n < N; ++n) rates[n] = gather_lanes(in.A + row * N + n, N);

  const RoutePasses passes = route_passes(route_code);
  const LaneSweep sweep(passes, s.height, s.width);
  const int64_t cells = sweep.line_length;
  auto cell = [&](int64_t t, int64_t q) { return sweep.line(t) * sweep.line_step + sweep.position(q) * sweep.cell_step; };

  // The states, in scan order.
  for (int64_t i = 0; i < cells * N; ++i) m.across[i] = LaneFloats{};
  LaneFloats carry[kStates > 0 ? kStates : kMaxLaneBackwardStates] = {};
  for (int64_t t = 0; t < sweep.lines; ++t) {
    if (!passes.flat) {
      for (int64_t n = 0; n < N; ++n) carry[n] = LaneFloats{};
    }
    for (int64_t q = 0; q < cells; ++q) {
      const int64_t p = cell(t, q);
      LaneFloats z = load_lanes(route.weights) * route.low[p];
      for (int64_t r = 1; r < R; ++r) z += load_lanes(route.weights + r * s.dim) * route.low[r * L + p];
      z += route.bias;
      LaneFloats dt = z;
      if (in.delta_softplus) {
        dt = softplus_approx(z);
        m.slope[p] = 1.0f / (1.0f + exp_approx(-z));
      }
      m.dt[p] = dt;
      const LaneFloats dt_u = dt * load_lanes(route.u + p * s.dim);
      for (int64_t n = 0; n < N; ++n) {
        const LaneFloats decay = exp_approx(dt * rates[n]);
        const LaneFloats x = dt_u * route.B[n * L + p];
        m.decay[p * N + n] = decay;
        const LaneFloats hh = decay * carry[n] + x;
        carry[n] = hh;
        if (passes.flat) {
          m.state[p * N + n] = hh;
        } else {
          LaneFloats& across = m.across[q * N + n];
          const LaneFloats h = hh + decay * across;
          across = h;
          m.first[p * N + n] = hh;
          m.state[p * N + n] = h;
        }
      }
    }
  }

  // The adjoint sweep: m.across now carries a * lambda from the line after.
  for (int64_t i = 0; i < cells * N; ++i) m.across[i] = LaneFloats{};
  LaneFloats da_sum[kStates > 0 ? kStates : kMaxLaneBackwardStates] = {};
  LaneFloats ddelta_sum{};
  LaneFloats along[kStates > 0 ? kStates : kMaxLaneBackwardStates] = {};  // a * mu from the cell after
  for (int64_t t = sweep.lines - 1; t >= 0; --t) {
    if (!passes.flat) {
      for (int64_t n = 0; n < N; ++n) along[n] = LaneFloats{};
    }
    for (int64_t q = cells - 1; q >= 0; --q) {
      const int64_t p = cell(t, q);
      // The cells before this one along the line and, 2D, on the line before (-1: none).
      const int64_t before = q > 0 ? cell(t, q - 1) : (passes.flat && t > 0 ? cell(t - 1, cells - 1) : -1);
      const int64_t above = !passes.flat && t > 0 ? cell(t - 1, q) : -1;
      const LaneFloats dy_p = dy[p];
      const LaneFloats u_p = load_lanes(route.u + p * s.dim);
      const LaneFloats dt = m.dt[p];
      const LaneFloats dt_u = dt * u_p;
      LaneFloats ddt{};
      LaneFloats du_p{};
      for (int64_t n = 0; n < N; ++n) {
        const LaneFloats decay = m.decay[p * N + n];
        const LaneFloats seed = route.C[n * L + p] * dy_p;
        LaneFloats mu;
        LaneFloats ddecay;
        if (passes.flat) {
          mu = seed + along[n];
          ddecay = before >= 0 ? mu * m.state[before * N + n] : LaneFloats{};
        } else {
          LaneFloats& across = m.across[q * N + n];
          const LaneFloats lambda = seed + across;
          mu = lambda + along[n];
          ddecay = above >= 0 ? lambda * m.state[above * N + n] : LaneFloats{};
          if (q > 0) ddecay += mu * m.first[before * N + n];
          across = decay * lambda;
        }
        along[n] = decay * mu;
        const float b_n = route.B[n * L + p];
        const LaneFloats dlog_decay = ddecay * decay;
        da_sum[n] += dlog_decay * dt;
        ddt += dlog_decay * rates[n] + mu * b_n * u_p;
        out.dB[(k * N + n) * L + p] += sum_lanes(mu * dt_u);
        du_p += mu * dt * b_n;
        out.dC[(k * N + n) * L + p] += sum_lanes(dy_p * m.state[p * N + n]);
      }
      du[p] += du_p;
      const LaneFloats ddelta = keep ? (in.delta_softplus ? ddt * m.slope[p] : ddt) : LaneFloats{};
      m.ddelta[p] = ddelta;
      ddelta_sum += ddelta;
    }
  }

  const int64_t grad_row = b * s.routes * s.dim + row;  // of the (batch, routes * dim) grads
  // The projection's gradients from the route's step-size gradients (0 in dropped lanes):
  // dweight[d, r] = sum_p ddelta[d, p] * low[r, p] for each kept lane's channel d, and
  // ddelta_low[r, p] += sum_d weight[d, r] * ddelta[d, p] over the lanes, for blocks of
  // kLaneChannels cells transposed so that the sum runs across lanes as vector FMAs over the cells.
  // kRankBlock ranks at a time: independent FMA chains, each ddelta vector loaded once for them.
  constexpr int64_t kRankBlock = 8;
  for (int64_t r0 = 0; r0 < R; r0 += kRankBlock) {
    const int64_t ranks = std::min(kRankBlock, R - r0);
    LaneFloats dweight[kRankBlock] = {};
    for (int64_t p = 0; p < L; ++p) {
      const LaneFloats ddelta = m.ddelta[p];
      for (int64_t i = 0; i < ranks; ++i) dweight[i] += ddelta * route.low[(r0 + i) * L + p];
    }
    for (int64_t l = keep_first; l < keep_last; ++l) {
      for (int64_t i = 0; i < ranks; ++i) out.dweight[(grad_row + l) * R + r0 + i] = dweight[i][l];
    }
  }
  float* ddelta_low = out.ddelta_low + k * R * L;
  for (int64_t p0 = 0; p0 < L; p0 += kLaneChannels) {
    const int64_t count = std::min(kLaneChannels, L - p0);
    LaneFloats cells_of_lane[kLaneChannels];  // [l][j] = ddelta of lane l at cell p0 + j
    for (int64_t l = 0; l < kLaneChannels; ++l) {
      for (int64_t j = 0; j < kLaneChannels; ++j) cells_of_lane[l][j] = j < count ? m.ddelta[p0 + j][l] : 0.0f;
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* weight_r = route.weights + r * s.dim;  // the lanes' weights of rank r
      LaneFloats sum = cells_of_lane[0] * weight_r[0];
      for (int64_t l = 1; l < kLaneChannels; ++l) sum += cells_of_lane[l] * weight_r[l];
      float* to = ddelta_low + r * L + p0;
      if (count == kLaneChannels) {
        store_lanes(to, load_lanes(to) + sum);
      } else {
        for (int64_t j = 0; j < count; ++j) to[j] += sum[j];
      }
    }
  }
  for (int64_t l = keep_first; l < keep_last; ++l) {
    for (int64_t n = 0; n < N; ++n) out.dA[(grad_row + l) * N + n] = da_sum[n][l];
    if (out.ddelta_bias) out.ddelta_bias[grad_row + l] = ddelta_sum[l];
  }
}

// Gradients of channels [d_begin, d_end) of sample b (channels-last maps; at most kLaneChannels
// channels) for every route, the lanes as in cross_forward_lanes: writes every route's rows of the
// kept channels in out.dA, out.dD, out.ddelta_bias and out.dweight, adds into the call's partial
// sums out.ddelta_low, out.dB and out.dC, and writes du_map of the kept channels. Workspace:
// lane_backward_arrays(s) arrays.
void cross_backward_lanes(const ScanInputs<float>& in, const CrossShape& s, const float* weights,
                          const int64_t* routes, int64_t b, int64_t d_begin, int64_t d_end, const float* dy_map,
                          float* du_map, const LaneGrads& out, Workspace<float>& ws) {
  const int64_t L = s.length();
  const int64_t N = s.nstate;
  const int64_t d0 = std::min(d_begin, s.dim - kLaneChannels);
  const int64_t keep_first = d_begin - d0;
  const int64_t keep_last = d_end - d0;
  LaneFloats* dy = reinterpret_cast<LaneFloats*>(ws.array(0));
  LaneFloats* du = dy + L;
  const LaneRouteScratch m{du + L, du + 2 * L, du + 3 * L, du + 4 * L, du + 4 * L + L * N, du + 4 * L + 2 * L * N,
                           du + 4 * L + 3 * L * N};
  const float* u = in.u + s.map_offset(b, d0);
  const float* dy_lanes = dy_map + s.map_offset(b, d0);
  LaneFloats skip{};
  if (in.D) {
    for (int64_t k = 0; k < s.routes; ++k) skip += load_lanes(in.D + k * s.dim + d0);
  }
  // Where lanes are dropped, their dy is 0 (a select, not a product: a non-finite dy stays out).
  const LaneInts keep = lane_mask(keep_first, keep_last) != 0.0f;
  LaneFloats dskip{};
  for (int64_t p = 0; p < L; ++p) {
    dy[p] = keep ? load_lanes(dy_lanes + p * s.dim) : LaneFloats{};
    du[p] = skip * dy[p];
    dskip += dy[p] * load_lanes(u + p * s.dim);
  }
  for (int64_t k = 0; k < s.routes; ++k) {
    if (N == 1) {
      add_lane_route_grads<1>(in, s, weights, routes[k], b, k, d0, keep_first, keep_last, dy, du, out, m);
    } else {
      add_lane_route_grads<0>(in, s, weights, routes[k], b, k, d0, keep_first, keep_last, dy, du, out, m);
    }
    if (in.D) {
      for (int64_t l = keep_first; l < keep_last; ++l) out.dD[(b * s.routes + k) * s.dim + d0 + l] = dskip[l];
    }
  }
  float* du_out = du_map + s.map_offset(b, d0);
  if (keep_first == 0 && keep_last == kLaneChannels) {
    for (int64_t p = 0; p < L; ++p) store_lanes(du_out + p * s.dim, du[p]);
    return;
  }
  for (int64_t p = 0; p < L; ++p) {
    for (int64_t l = keep_first; l < keep_last; ++l) du_out[p * s.dim + l] = du[p][l];
  }
}

}  // namespace VMAMBA2D_ISA
}  // namespace cpu
}  // namespace vmamba2d
