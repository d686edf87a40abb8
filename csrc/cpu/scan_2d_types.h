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
  // cross_channel_group); one channel without a projection.
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

inline int64_t CrossShape::channel_group() const { return rank > 0 ? kProjectChannels : 1; }

// The four-route kernel's arrays for a call on `group` channels: the above, then per channel its
// route's step sizes (delta plane, projected), then its planes gathered from channels-last maps
// (forward: u, y; backward: u, dy, du).
constexpr int64_t cross_forward_arrays(int64_t group) { return kForwardArrays + 3 * group; }
constexpr int64_t cross_backward_arrays(int64_t group) { return kBackwardArrays + 4 * group; }

}  // namespace cpu
}  // namespace vmamba2d
