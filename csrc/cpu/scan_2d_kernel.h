// 2D selective scan on CPU: the per-(batch, channel) forward and backward kernels on raw pointers.
//
// Recurrence (DESIGN.md section 1), per batch b, channel d, state n, pixel p = i * W + j:
//   dt = softplus(delta + delta_bias[d])   (identity without softplus)
//   a  = exp(dt * A[d, n])
//   hh[i, j] = a[i, j] * hh[i, j - 1] + dt * B[g, n, p] * u      (horizontal)
//   h[i, j]  = a[i, j] * h[i - 1, j]  + hh[i, j]                  (vertical)
//   y = sum_n C[g, n, p] * h + D[d] * u
//
// The kernels work on one state map of L = H * W values at a time, in a per-thread workspace of a
// few such maps, so the N per-state maps of a batch are never materialised. Loops along a
// row are written over contiguous memory so the compiler vectorises them; the horizontal
// recurrences, which are serial along a row, are interleaved over several rows to hide latency.
//
// This file is compiled once per instruction set (scan_2d_isa_*.cpp): it must be included with
// VMAMBA2D_ISA defined to the namespace of that build, so each build's functions stay distinct.
#ifndef VMAMBA2D_ISA
#error "define VMAMBA2D_ISA (the instruction-set namespace) before including scan_2d_kernel.h"
#endif

#include <algorithm>
#include <cstdint>

#include "scan_2d_math.h"
#include "scan_2d_types.h"

namespace vmamba2d {
namespace cpu {
namespace VMAMBA2D_ISA {

// Number of rows whose serial horizontal recurrences are advanced together.
constexpr int64_t kRowInterleave = 8;

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

// In place: values[i, j] <- decay[i, j] * values[i, j - 1] + values[i, j] along every row.
template <typename T>
void scan_rows_forward(const T* decay, T* values, int64_t height, int64_t width) {
  int64_t i = 0;
  for (; i + kRowInterleave <= height; i += kRowInterleave) {
    T carry[kRowInterleave] = {};
    for (int64_t j = 0; j < width; ++j) {
      for (int64_t r = 0; r < kRowInterleave; ++r) {
        const int64_t p = (i + r) * width + j;
        carry[r] = decay[p] * carry[r] + values[p];
        values[p] = carry[r];
      }
    }
  }
  for (; i < height; ++i) {
    T carry = T(0);
    for (int64_t j = 0; j < width; ++j) {
      const int64_t p = i * width + j;
      carry = decay[p] * carry + values[p];
      values[p] = carry;
    }
  }
}

// In place, right to left: values[i, j] <- values[i, j] + decay[i, j + 1] * values[i, j + 1].
template <typename T>
void scan_rows_reverse(const T* decay, T* values, int64_t height, int64_t width) {
  int64_t i = 0;
  for (; i + kRowInterleave <= height; i += kRowInterleave) {
    T carry[kRowInterleave] = {};  // decay[i, j + 1] * values[i, j + 1]
    for (int64_t j = width - 1; j >= 0; --j) {
      for (int64_t r = 0; r < kRowInterleave; ++r) {
        const int64_t p = (i + r) * width + j;
        const T v = values[p] + carry[r];
        values[p] = v;
        carry[r] = decay[p] * v;
      }
    }
  }
  for (; i < height; ++i) {
    T carry = T(0);
    for (int64_t j = width - 1; j >= 0; --j) {
      const int64_t p = i * width + j;
      const T v = values[p] + carry;
      values[p] = v;
      carry = decay[p] * v;
    }
  }
}

// One (batch, channel)'s slices of the inputs: its own maps, its group's B / C, its scalars.
template <typename T>
struct ChannelInputs {
  const T* u;        // (L,)
  const T* delta;    // (L,)
  const T* B;        // (N, L)
  const T* C;        // (N, L)
  const T* a_rates;  // (N,): A[d, :]
  T bias;            // delta_bias[d] or 0
  T skip;            // D[d] or 0
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

// y for one (batch, channel): y[p] = sum_n C[n, p] * h_n[p] + D * u[p].
template <typename T>
void forward_channel(const ScanInputs<T>& in, const ScanShape& s, int64_t b, int64_t d, T* y,
                     Workspace<T>& ws) {
  const int64_t L = s.length();
  const int64_t W = s.width;
  const ChannelInputs<T> ch = channel_inputs(in, s, b, d);
  const T* u = ch.u;
  const T* B = ch.B;
  const T* C = ch.C;
  T* dt = ws.array(0);
  T* dt_u = ws.array(1);
  T* decay = ws.array(2);
  T* h = ws.array(3);

  compute_dt(ch.delta, u, ch.bias, in.delta_softplus, L, dt, dt_u);
  for (int64_t p = 0; p < L; ++p) y[p] = ch.skip * u[p];

  for (int64_t n = 0; n < s.nstate; ++n) {
    const T* b_n = B + n * L;
    const T* c_n = C + n * L;
    discretize_state(dt, dt_u, b_n, ch.a_rates[n], L, decay, h);
    scan_rows_forward(decay, h, s.height, W);
    for (int64_t j = 0; j < W; ++j) y[j] += c_n[j] * h[j];
    for (int64_t i = 1; i < s.height; ++i) {
      const int64_t row = i * W;
      for (int64_t j = 0; j < W; ++j) {
        h[row + j] += decay[row + j] * h[row - W + j];
        y[row + j] += c_n[row + j] * h[row + j];
      }
    }
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

// Gradients of one (batch, channel), recomputing the forward scans state by state.
// Adjoints: lambda = dL/dh, mu = dL/dhh:
//   lambda[i, j] = C dy + a[i + 1, j] lambda[i + 1, j]        (reverse vertical)
//   mu[i, j]     = lambda[i, j] + a[i, j + 1] mu[i, j + 1]     (reverse horizontal)
//   dx = mu,  da[i, j] = lambda[i, j] h[i - 1, j] + mu[i, j] hh[i, j - 1]
// then through a = exp(dt A), x = dt B u and dt = softplus(delta + bias).
template <typename T>
void backward_channel(const ScanInputs<T>& in, const ScanShape& s, int64_t b, int64_t d, const T* dy,
                      const ChannelGrads<T>& out, Workspace<T>& ws) {
  const int64_t L = s.length();
  const int64_t H = s.height;
  const int64_t W = s.width;
  const ChannelInputs<T> ch = channel_inputs(in, s, b, d);
  const T* u = ch.u;
  const T* B = ch.B;
  const T* C = ch.C;
  T* dt = ws.array(0);
  T* dt_u = ws.array(1);
  T* ddt = ws.array(2);
  T* decay = ws.array(3);
  T* hh = ws.array(4);
  T* h = ws.array(5);
  T* lambda = ws.array(6);
  T* mu = ws.array(7);

  const T bias = ch.bias;
  compute_dt(ch.delta, u, bias, in.delta_softplus, L, dt, dt_u);
  const T skip = ch.skip;
  for (int64_t p = 0; p < L; ++p) {
    out.du[p] = skip * dy[p];
    mu[p] = dy[p] * u[p];
    ddt[p] = T(0);
  }
  if (out.dD) *out.dD = sum_values(mu, L);

  for (int64_t n = 0; n < s.nstate; ++n) {
    const T* b_n = B + n * L;
    const T* c_n = C + n * L;
    T* db_n = out.dB + n * L;
    T* dc_n = out.dC + n * L;
    const T a_rate = ch.a_rates[n];

    // Recompute hh and h.
    discretize_state(dt, dt_u, b_n, a_rate, L, decay, hh);
    scan_rows_forward(decay, hh, H, W);
    std::copy(hh, hh + W, h);
    for (int64_t i = 1; i < H; ++i) {
      const int64_t row = i * W;
      for (int64_t j = 0; j < W; ++j) h[row + j] = decay[row + j] * h[row - W + j] + hh[row + j];
    }
    for (int64_t p = 0; p < L; ++p) dc_n[p] += dy[p] * h[p];

    // lambda: reverse vertical scan of C * dy.
    const int64_t last = (H - 1) * W;
    for (int64_t j = 0; j < W; ++j) lambda[last + j] = c_n[last + j] * dy[last + j];
    for (int64_t i = H - 2; i >= 0; --i) {
      const int64_t row = i * W;
      for (int64_t j = 0; j < W; ++j) {
        lambda[row + j] = c_n[row + j] * dy[row + j] + decay[row + W + j] * lambda[row + W + j];
      }
    }
    // mu: reverse horizontal scan of lambda.
    std::copy(lambda, lambda + L, mu);
    scan_rows_reverse(decay, mu, H, W);

    // dL/d(decay), in place of lambda: lambda[i, j] h[i - 1, j] + mu[i, j] hh[i, j - 1].
    T* ddecay = lambda;
    std::fill(ddecay, ddecay + W, T(0));
    for (int64_t p = W; p < L; ++p) ddecay[p] *= h[p - W];
    for (int64_t i = 0; i < H; ++i) {
      const int64_t row = i * W;
      for (int64_t j = 1; j < W; ++j) ddecay[row + j] += mu[row + j] * hh[row + j - 1];
    }
    // Chain through decay = exp(dt * A) and x = dt * B * u (dx = mu); h is free for dA's terms.
    T* da_terms = h;
    chain_state_grads(ddecay, decay, mu, dt, dt_u, u, b_n, a_rate, L, da_terms, ddt, db_n, out.du);
    out.dA[n] = sum_values(da_terms, L);
  }

  const T* delta = ch.delta;
  if (in.delta_softplus) {
    for (int64_t p = 0; p < L; ++p) out.ddelta[p] = ddt[p] * Math<T>::sigmoid(delta[p] + bias);
  } else {
    std::copy(ddt, ddt + L, out.ddelta);
  }
  if (out.ddelta_bias) *out.ddelta_bias = sum_values(out.ddelta, L);
}

}  // namespace VMAMBA2D_ISA
}  // namespace cpu
}  // namespace vmamba2d
