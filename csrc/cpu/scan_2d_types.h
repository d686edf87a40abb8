// Plain data shared by the CPU scan's glue code and its per-ISA kernels (no code that depends on
// the instruction set, so it can be included anywhere).
#pragma once

#include <cstdint>

namespace vmamba2d {
namespace cpu {

// The grid of one state map and the number of states.
struct MapShape {
  int64_t height;
  int64_t width;
  int64_t nstate;

  int64_t length() const { return height * width; }
};

// The single-route scan: u, delta (batch, dim, L); B, C (batch, groups, N, L).
struct ScanShape {
  int64_t batch;
  int64_t dim;
  int64_t groups;
  int64_t nstate;
  int64_t height;
  int64_t width;

  int64_t length() const { return height * width; }
  int64_t channels_per_group() const { return dim / groups; }
  MapShape map() const { return {height, width, nstate}; }
};

// The four-route scan: u (batch, dim, L); delta (batch, routes, dim, L); B, C (batch, routes, N, L);
// A (routes * dim, N); D, delta_bias (routes * dim,). The maps u, y, dy and du are contiguous, or
// all channels-last (batch, L, dim) when channels_last. With a step-size projection (rank > 0),
// delta is low-rank (batch, routes, rank, L) and ScanInputs::delta_proj (routes * dim, rank).
struct CrossShape {
  int64_t batch;
  int64_t dim;
  int64_t routes;
  int64_t nstate;
  int64_t height;
  int64_t width;
  bool channels_last;
  int64_t rank = 0;  // of the step-size projection; 0 without one

  int64_t length() const { return height * width; }
  MapShape map() const { return {height, width, nstate}; }
  // Channels per kernel call: a group shares each load of the low-rank step sizes (see
  // cross_channel_group); one channel without a projection. (The float forward's channel-lane
  // kernel takes kLaneChannels: lane_forward.)
  int64_t channel_group() const;
  // Where channel d of sample b starts in u / y / dy / du, and the step between its pixels.
  int64_t map_offset(int64_t b, int64_t d) const {
    return channels_last ? b * dim * length() + d : (b * dim + d) * length();
  }
  int64_t pixel_stride() const { return channels_last ? dim : 1; }
};

// Read-only inputs, all contiguous and of one scalar type T, shaped as ScanShape or CrossShape says
// (D, delta_bias, delta_proj may be null; delta_proj is the four-route scan's only).
template <typename T>
struct ScanInputs {
  const T* u;
  const T* delta;
  const T* A;
  const T* B;
  const T* C;
  const T* D;
  const T* delta_bias;
  bool delta_softplus;
  const T* delta_proj = nullptr;
};

// Scratch memory of one thread: arrays of L values each, carved from caller-owned storage.
template <typename T>
class Workspace {
 public:
  Workspace(T* data, int64_t length) : data_(data), length_(length) {}
  T* array(int64_t index) { return data_ + index * length_; }

 private:
  T* data_;
  int64_t length_;
};

// Where the gradients of one channel (and route) go. du, ddelta: (L,) of its channel (du
// accumulates over routes); dB, dC: (N, L) accumulators of its (batch, group or route), shared by
// the channels of one backward task, never by two tasks; dA: (N,) and dD, ddelta_bias: scalars (or
// null), per (batch, channel), reduced over the batch afterwards.
template <typename T>
struct ChannelGrads {
  T* du;
  T* ddelta;
  T* dB;
  T* dC;
  T* dA;
  T* dD;
  T* ddelta_bias;
};

constexpr int64_t kForwardArrays = 6;  // dt, dt_u, decay, state, products, carries

constexpr int64_t kBackwardArrays = 10;  // dt, dt_u, ddt, decay, hh, h, lambda, mu, products, carries

// Channels of one four-route kernel call when it projects the step sizes: the projection loads
// each vector of a route's low-rank step sizes once for all of them (kProjectChannels independent
// accumulator chains; one channel alone waits on the FMA latency on small maps).
constexpr int64_t kProjectChannels = 8;

// Channels of one call of the channel-lane forward (scan_2d_lanes_kernel.h), one per lane of an
// AVX-512 vector of floats.
constexpr int64_t kLaneChannels = 16;
// Most states the channel-lane forward scans (its first-pass carries live in registers).
constexpr int64_t kMaxLaneStates = 64;
// Cells of a line whose decays and inputs the channel-lane forward forms together.
constexpr int64_t kLaneBlock = 8;

inline int64_t CrossShape::channel_group() const { return rank > 0 ? kProjectChannels : 1; }

// Whether a float forward's shapes suit the channel-lane kernel (scan_2d_lanes_kernel.h,
// kLaneChannels channels per call, one per vector lane): channels-last maps (a pixel's channels
// adjacent), a step-size projection (each pixel's step sizes formed from the low-rank rows), at
// least kLaneChannels channels and at most kMaxLaneStates states. (cross_forward also asks for
// the AVX-512 build and a task per thread.)
inline bool lane_forward(const CrossShape& s) {
  return s.channels_last && s.rank > 0 && s.dim >= kLaneChannels && s.nstate <= kMaxLaneStates;
}

// Its workspace, in arrays of L floats: the lanes' y (L vectors), the second pass's carries (one
// vector per cell of a line and state), the route's decay rates (one vector per state) and, for a
// run-time number of states, a block's decays and inputs (kLaneBlock vectors per state each); a
// vector is kLaneChannels floats.
inline int64_t lane_forward_arrays(const CrossShape& s) {
  const int64_t line = s.height > s.width ? s.height : s.width;
  const int64_t vectors = s.length() + line * s.nstate + s.nstate + 2 * kLaneBlock * s.nstate;
  return (vectors * kLaneChannels + s.length() - 1) / s.length();
}

// Where the channel-lane backward writes (scan_2d_lanes_kernel.h). Rows of one sample's channels:
// dA (batch, routes * dim, N), dD / ddelta_bias (batch, routes * dim), dweight (batch, routes, dim,
// R), the step-size projection's gradient per sample. Partial sums over the channels of one task,
// added to: ddelta_low (routes, R, L), the low-rank step sizes' gradient, and dB / dC (routes, N, L).
struct LaneGrads {
  float* ddelta_low;
  float* dweight;
  float* dB;
  float* dC;
  float* dA;
  float* dD;
  float* ddelta_bias;
};

// Most states the channel-lane backward scans: it keeps each state's decays and states of every
// cell of the map (3 * N vectors per cell).
constexpr int64_t kMaxLaneBackwardStates = 16;

// Whether a float backward's shapes suit the channel-lane backward (the forward's conditions, at
// most kMaxLaneBackwardStates states).
inline bool lane_backward(const CrossShape& s) { return lane_forward(s) && s.nstate <= kMaxLaneBackwardStates; }

// Its workspace, in arrays of L floats: the lanes' dy and du (L vectors each), then a route's
// scratch: step sizes, their slopes and (full-rank) gradients (L vectors each), decays, states h and hh
// (L vectors per state each) and the second pass's carries (one vector per cell of a line and state).
inline int64_t lane_backward_arrays(const CrossShape& s) {
  const int64_t line = s.height > s.width ? s.height : s.width;
  const int64_t vectors = 5 * s.length() + 3 * s.length() * s.nstate + line * s.nstate;
  return (vectors * kLaneChannels + s.length() - 1) / s.length();
}

// The four-route kernel's arrays for a call on `group` channels: the above, then per channel its
// route's step sizes (delta plane, projected), then its planes gathered from channels-last maps
// (forward: u, y; backward: u, dy, du).
constexpr int64_t cross_forward_arrays(int64_t group) { return kForwardArrays + 3 * group; }
constexpr int64_t cross_backward_arrays(int64_t group) { return kBackwardArrays + 4 * group; }

}  // namespace cpu
}  // namespace vmamba2d
