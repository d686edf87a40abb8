// ATen-facing part of the 2D scan kernel, shared by the CUDA entry points and the host emulation:
// argument checks, the tiling plan, output / scratch allocation and the launch sequence.
// A Backend provides:
//   static constexpr bool kCuda;                        tensors must be CUDA (else CPU) tensors
//   static DeviceLimits limits(const at::Tensor& u);    SM count and shared memory per block
//   static void forward(const Params&, ElementType);         one forward pass (Params::pass)
//   static void carry_scan(const Params&, const CarryScan&); tile-parallel carry propagation
//   static void backward(const Params&, ElementType);        one backward pass (Params::pass)
//   static void poison(at::Tensor&);                    fill never-read-before-written scratch
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "scan2d_common.h"

namespace vmamba2d {
namespace scan2d {

using OptTensor = std::optional<at::Tensor>;

struct DeviceLimits {
  int sm_count;
  size_t smem_per_block;  // opt-in maximum of dynamic shared memory per block
  size_t smem_per_sm;     // shared memory of one SM (what resident blocks share)
  int arch;               // compute capability x 10 the kernels that run there were compiled for
  size_t reserved_smem_per_block;  // what the runtime takes of the SM's shared memory per block
};

// Shared memory the runtime reserves per resident block (cudaDevAttrReservedSharedMemoryPerBlock)
// on a device of compute capability arch x 10, where no device says: 1 KiB from sm_80 on (each
// SM's opt-in maximum per block is 1 KiB below its shared memory), none before (equal there).
inline size_t reserved_smem_per_block(int arch) { return arch >= 80 ? 1024 : 0; }

inline ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ElementType::kFloat32;
    case at::kHalf:
      return ElementType::kFloat16;
    case at::kBFloat16:
      return ElementType::kBFloat16;
    default:
      TORCH_CHECK_TYPE(false, "selective_scan_2d (cuda kernel): u must be float32, float16 or "
                              "bfloat16, got ", t);
  }
  return ElementType::kFloat32;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Per axis: a map extent larger than a tile is cut into tiles (scanned in order, with carries);
// an extent that fits into a tile is packed several times across it (maps of consecutive batch
// entries, one per segment). E.g. 7x7 maps: 4x4 maps per tile; 1xL maps: 32 maps stacked in the
// tile rows, the columns tiled along L (a chunked 1D scan).
inline void plan_axis(int64_t extent, int& pack, int& segment, int& tiles) {
  if (extent <= kTile) {
    pack = static_cast<int>(kTile / extent);
    segment = static_cast<int>(extent);
    tiles = 1;
  } else {
    pack = 1;
    segment = kTile;
    tiles = static_cast<int>(ceil_div(extent, kTile));
  }
}

inline uint32_t segment_magic(int segment) { return 65536u / static_cast<uint32_t>(segment) + 1u; }

inline Geometry plan_geometry(int64_t batch, int64_t dim, int64_t groups, int64_t nstate,
                              int64_t height, int64_t width) {
  Geometry g{};
  g.batch = static_cast<int>(batch);
  g.dim = static_cast<int>(dim);
  g.groups = static_cast<int>(groups);
  g.nstate = static_cast<int>(nstate);
  g.height = static_cast<int>(height);
  g.width = static_cast<int>(width);
  g.length = height * width;
  plan_axis(width, g.pack_cols, g.seg_w, g.tiles_w);
  plan_axis(height, g.pack_rows, g.seg_h, g.tiles_h);
  // No more maps per tile than the batch has.
  const int64_t batch_or_1 = std::max<int64_t>(batch, 1);
  g.pack_cols = static_cast<int>(std::min<int64_t>(g.pack_cols, batch_or_1));
  g.pack_rows = static_cast<int>(std::min<int64_t>(g.pack_rows, ceil_div(batch_or_1, g.pack_cols)));
  g.magic_h = segment_magic(g.seg_h);
  g.magic_w = segment_magic(g.seg_w);
  g.batch_blocks = static_cast<int>(ceil_div(batch, static_cast<int64_t>(g.pack_rows) * g.pack_cols));
  return g;
}

// Blocks of one kernel resident per SM with blocks of nwarps warps taking smem bytes: limited by
// the SM's shared memory and by the registers per thread the kernel's budget allows.
inline int resident_blocks(size_t smem, int nwarps, int registers, const DeviceLimits& dev) {
  if (smem > dev.smem_per_block) return 0;
  const int by_smem = static_cast<int>(dev.smem_per_sm / (smem + dev.reserved_smem_per_block));
  const int by_registers = kRegistersPerSm / (registers * nwarps * kTile);
  return std::min(by_smem, by_registers);
}

inline int resident_warps(size_t smem, int nwarps, int registers, const DeviceLimits& dev) {
  return resident_blocks(smem, nwarps, registers, dev) * nwarps;
}

// How a grid of `blocks` blocks fills `slots` resident block slots (SMs x resident blocks per SM):
// in ceil(blocks / slots) waves; the slots of the last wave that stay empty are lost.
struct WaveFit {
  int64_t waves;
  double lost;  // share of the waves' slots without a block, 0 .. 1
};

inline WaveFit wave_fit(int64_t blocks, int64_t slots) {
  const int64_t waves = ceil_div(blocks, std::max<int64_t>(slots, 1));
  return WaveFit{waves, 1.0 - static_cast<double>(blocks) / static_cast<double>(waves * slots)};
}

// Registers per thread each kernel is compiled for (__launch_bounds__ in the .cu files).
inline int forward_registers(Variant v, int arch) {
  return kRegistersPerSm / (kBlockThreads * forward_min_blocks_per_sm(v, arch));
}
inline int backward_registers(Variant v) {
  return kRegistersPerSm / (kBlockThreads * backward_min_blocks_per_sm(v));
}
// A grid that leaves at most this share of its waves' slots empty counts as filling the device.
constexpr double kMaxLostSlots = 0.10;
// The tile-parallel passes cost about this many sequential tile steps per tile (edge passes, final
// pass, carry scans); see use_tile_parallel.
constexpr int64_t kTileParallelPasses = 3;

// Whether the tiles of a map should run in parallel: a sequential block walks its map's `tiles`
// tiles one after another, so a grid of `blocks` blocks takes ceil(blocks / slots) waves of `tiles`
// tile steps; the tile-parallel passes run blocks * tiles blocks about kTileParallelPasses times.
// The two run different kernel variants, so their resident slots may differ (the backward at N = 1).
inline bool use_tile_parallel(int64_t blocks, int64_t tiles, int64_t slots, int64_t parallel_slots) {
  if (tiles <= 1 || tiles > 65535) return false;
  const int64_t sequential = wave_fit(blocks, slots).waves * tiles;
  const int64_t parallel = kTileParallelPasses * wave_fit(blocks * tiles, parallel_slots).waves;
  return parallel < sequential;
}

struct BlockShape {
  int channels;
  int wpc;
};

// Block shape of one kernel: `channels` (dividing the group's channel count, at most kMaxWarps)
// side by side, each on wpc <= min(kMaxWarps / channels, N) warps. The most channels per block --
// each B / C quad is loaded once for all of them -- among the shapes that keep at least 3/4 of the
// best shape's resident warps; then the most warps per channel (fewer state rounds).
template <class SmemOf>
inline BlockShape pick_block_shape(const Geometry& g, const DeviceLimits& dev, int registers,
                                   SmemOf&& smem_of, const char* pass) {
  const int per_group = g.dim / g.groups;
  std::vector<std::pair<BlockShape, int>> shapes;
  int best = 0;
  for (int c = std::min(kMaxWarps, per_group); c >= 1; --c) {
    if (per_group % c != 0) continue;
    for (int wpc = std::min(kMaxWarps / c, g.nstate); wpc >= 1; --wpc) {
      const int warps = resident_warps(smem_of(c, wpc), c * wpc, registers, dev);
      shapes.push_back({BlockShape{c, wpc}, warps});
      best = std::max(best, warps);
    }
  }
  TORCH_CHECK(best > 0, "selective_scan_2d (cuda kernel): N = ", g.nstate, " needs ", smem_of(1, 1),
              " bytes of shared memory per block in the ", pass, ", the device allows ",
              dev.smem_per_block);
  // The best shape itself qualifies, so the search always finds one.
  return std::find_if(shapes.begin(), shapes.end(), [&](const std::pair<BlockShape, int>& s) {
           return s.second > 0 && 4 * s.second >= 3 * best;
         })->first;
}

// Resident block slots of the whole device for a pass's block shape.
inline int64_t block_slots(const DeviceLimits& dev, size_t smem, int nwarps, int registers) {
  return static_cast<int64_t>(dev.sm_count) * resident_blocks(smem, nwarps, registers, dev);
}

// Channel slices of the backward: the fewest (a divisor of the channel sets of a group, each slice
// owning its dB / dC partial) whose grid of base_blocks * slices blocks loses at most
// kMaxLostSlots of its waves' slots; else the one that loses the least (fewest on a tie).
inline int pick_slices(int64_t base_blocks, int sets, int64_t slots) {
  int best = 1;
  double best_lost = 2.0;
  for (int s = 1; s <= sets; ++s) {
    if (sets % s != 0) continue;
    const double lost = wave_fit(base_blocks * s, slots).lost;
    if (lost <= kMaxLostSlots) return s;
    if (lost < best_lost) {
      best = s;
      best_lost = lost;
    }
    if (base_blocks * s >= 4 * slots) break;  // more slices only add partials to sum
  }
  return best;
}

// The work split for a geometry on a device (see Launch in scan2d_common.h). Grids are measured
// in resident block slots (SMs x blocks of that shape resident per SM), not in SMs. A route
// launch (g.route.active) runs the route variant, whose budgets are the general variant's.
inline Launch plan_launch(const Geometry& g, const DeviceLimits& dev) {
  Launch k{};
  const bool routed = g.route.active;
  const auto fwd_smem = [&](int c, int wpc) {
    return forward_layout(c, wpc, g.nstate, routed, forward_carry_in_registers(g.nstate, wpc, dev.arch)).total;
  };
  const auto bwd_smem = [&](int c, int wpc) { return backward_layout(c, wpc, g.nstate).total; };
  const int fwd_registers = forward_registers(routed ? Variant::kRoute : Variant::kGeneral, dev.arch);
  const BlockShape fwd = pick_block_shape(g, dev, fwd_registers, fwd_smem, "forward");
  // The backward's sequential pass runs a one-state variant at N = 1 (one warp per channel
  // there), with its own register budget; the tile-parallel passes run the general variant.
  const int bwd_registers = backward_registers(
      g.nstate == 1 ? (routed ? Variant::kOneStateRoute : Variant::kOneStateSequential) : Variant::kGeneral);
  const BlockShape bwd = pick_block_shape(g, dev, bwd_registers, bwd_smem, "backward");
  k.fwd_channels = fwd.channels;
  k.fwd_wpc = fwd.wpc;
  k.bwd_channels = bwd.channels;
  k.bwd_wpc = bwd.wpc;
  k.fwd_carry_in_registers = forward_carry_in_registers(g.nstate, fwd.wpc, dev.arch);
  const int64_t fwd_slots = block_slots(dev, fwd_smem(fwd.channels, fwd.wpc), fwd.channels * fwd.wpc,
                                        fwd_registers);
  const int64_t bwd_slots = block_slots(dev, bwd_smem(bwd.channels, bwd.wpc), bwd.channels * bwd.wpc,
                                        bwd_registers);
  const int64_t bwd_parallel_slots = block_slots(dev, bwd_smem(bwd.channels, bwd.wpc),
                                                 bwd.channels * bwd.wpc, backward_registers(Variant::kGeneral));
  const int64_t base_blocks = static_cast<int64_t>(std::max(g.batch_blocks, 1)) * g.groups;
  k.slices = pick_slices(base_blocks, g.dim / g.groups / k.bwd_channels, bwd_slots);
  // Too few maps to fill the slots: the tiles of a map run in parallel instead.
  const int64_t tiles = static_cast<int64_t>(g.tiles_h) * g.tiles_w;
  const int64_t sequential_blocks = static_cast<int64_t>(g.batch_blocks) * (g.dim / k.fwd_channels);
  k.tile_parallel = use_tile_parallel(sequential_blocks, tiles, fwd_slots, fwd_slots);
  k.bwd_tile_parallel = use_tile_parallel(base_blocks * k.slices, tiles, bwd_slots, bwd_parallel_slots);
  return k;
}

// Blocks of the forward's / backward's main grid (the sequential pass or the tile-parallel final
// pass) for a plan.
inline int64_t forward_blocks(const Geometry& g, const Launch& k) {
  const int64_t tiles = k.tile_parallel ? static_cast<int64_t>(g.tiles_h) * g.tiles_w : 1;
  return static_cast<int64_t>(g.batch_blocks) * (g.dim / k.fwd_channels) * tiles;
}

inline int64_t backward_blocks(const Geometry& g, const Launch& k) {
  const int64_t tiles = k.bwd_tile_parallel ? static_cast<int64_t>(g.tiles_h) * g.tiles_w : 1;
  return static_cast<int64_t>(g.batch_blocks) * g.groups * k.slices * tiles;
}

template <class Backend>
void check_tensor(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.defined(), "selective_scan_2d (cuda kernel): ", name, " is undefined");
  TORCH_CHECK(t.is_contiguous(), "selective_scan_2d (cuda kernel): ", name, " must be contiguous");
  if (Backend::kCuda) {
    TORCH_CHECK(t.is_cuda(), "selective_scan_2d (cuda kernel): ", name, " must be a CUDA tensor, got ",
                t.device());
  } else {
    TORCH_CHECK(t.is_cpu(), "selective_scan_2d (emulation): ", name, " must be a CPU tensor, got ",
                t.device());
  }
  TORCH_CHECK(t.device() == like.device(), "selective_scan_2d (cuda kernel): ", name, " is on ",
              t.device(), " but u is on ", like.device());
}

inline void check_shape(const at::Tensor& t, const char* name, at::IntArrayRef expected) {
  TORCH_CHECK_VALUE(t.sizes() == expected, "selective_scan_2d (cuda kernel): ", name,
                    " must have shape ", expected, ", got ", t.sizes());
}

inline void check_dtype(const at::Tensor& t, const char* name, at::ScalarType expected) {
  TORCH_CHECK_TYPE(t.scalar_type() == expected, "selective_scan_2d (cuda kernel): ", name,
                   " must be ", expected, ", got ", t.scalar_type());
}

// Validates everything and returns the plan.
template <class Backend>
Geometry check_inputs(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                      const at::Tensor& B, const at::Tensor& C, const OptTensor& D,
                      const OptTensor& delta_bias, int64_t height, int64_t width) {
  check_tensor<Backend>(u, "u", u);
  TORCH_CHECK_VALUE(u.dim() == 3, "selective_scan_2d (cuda kernel): u must be (batch, dim, L), got ",
                    u.sizes());
  const int64_t batch = u.size(0), dim = u.size(1), length = u.size(2);
  TORCH_CHECK_VALUE(height >= 1 && width >= 1 && height * width == length,
                    "selective_scan_2d (cuda kernel): height * width must equal L = ", length,
                    ", got height=", height, " width=", width);
  TORCH_CHECK_VALUE(length < std::numeric_limits<int32_t>::max(),
                    "selective_scan_2d (cuda kernel): L = ", length, " is too large");
  element_type(u.scalar_type());
  check_tensor<Backend>(delta, "delta", u);
  check_shape(delta, "delta", u.sizes());
  check_dtype(delta, "delta", u.scalar_type());
  check_tensor<Backend>(A, "A", u);
  TORCH_CHECK_VALUE(A.dim() == 2 && A.size(0) == dim,
                    "selective_scan_2d (cuda kernel): A must be (dim, N), got ", A.sizes());
  check_dtype(A, "A", at::kFloat);
  const int64_t nstate = A.size(1);
  TORCH_CHECK_VALUE(nstate >= 1 && nstate <= kMaxState, "selective_scan_2d (cuda kernel): N = ",
                    nstate, " states, supported 1..", kMaxState);
  check_tensor<Backend>(B, "B", u);
  TORCH_CHECK_VALUE(B.dim() == 4, "selective_scan_2d (cuda kernel): B must be (batch, groups, N, L), got ",
                    B.sizes());
  const int64_t groups = B.size(1);
  TORCH_CHECK_VALUE(groups >= 1 && dim % groups == 0, "selective_scan_2d (cuda kernel): groups = ",
                    groups, " must divide dim = ", dim);
  check_shape(B, "B", {batch, groups, nstate, length});
  check_dtype(B, "B", u.scalar_type());
  check_tensor<Backend>(C, "C", u);
  check_shape(C, "C", {batch, groups, nstate, length});
  check_dtype(C, "C", u.scalar_type());
  if (D.has_value()) {
    check_tensor<Backend>(*D, "D", u);
    check_shape(*D, "D", {dim});
    check_dtype(*D, "D", at::kFloat);
  }
  if (delta_bias.has_value()) {
    check_tensor<Backend>(*delta_bias, "delta_bias", u);
    check_shape(*delta_bias, "delta_bias", {dim});
    check_dtype(*delta_bias, "delta_bias", at::kFloat);
  }
  TORCH_CHECK_VALUE(batch <= std::numeric_limits<int32_t>::max() && dim <= 65535,
                    "selective_scan_2d (cuda kernel): batch = ", batch, ", dim = ", dim,
                    " exceed the grid limits");
  return plan_geometry(batch, dim, groups, nstate, height, width);
}

inline Params base_params(const Geometry& g, const Launch& k, const at::Tensor& u,
                          const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
                          const at::Tensor& C, const OptTensor& D, const OptTensor& delta_bias,
                          bool softplus) {
  Params p{};
  p.g = g;
  p.k = k;
  p.softplus = softplus;
  p.u = u.data_ptr();
  p.delta = delta.data_ptr();
  p.B = B.data_ptr();
  p.C = C.data_ptr();
  p.A = A.data_ptr<float>();
  p.D = D.has_value() ? D->data_ptr<float>() : nullptr;
  p.delta_bias = delta_bias.has_value() ? delta_bias->data_ptr<float>() : nullptr;
  return p;
}

inline at::Tensor fp32_scratch(int64_t numel, const at::Tensor& like) {
  return at::empty({numel}, like.options().dtype(at::kFloat));
}

// The forward passes of a prepared launch (p.y / p.y_fp32 set): the tile-parallel passes or the
// sequential one. With `save_carries` (and more than one tile per map) the carries into every tile
// are recorded for the backward: returns [carry_h, carry_v], empty when not recorded.
template <class Backend>
std::vector<at::Tensor> run_forward(Params& p, ElementType type, const at::Tensor& like, bool save_carries) {
  const Geometry& g = p.g;
  at::Tensor carry_h = fp32_scratch(0, like), carry_v = fp32_scratch(0, like);
  if (p.k.tile_parallel) {
    // Few maps: the tiles of a map run in parallel; the passes leave the carries into every tile.
    const int64_t numel = carry_numel(g, true);
    at::Tensor ch = fp32_scratch(numel, like), cv = fp32_scratch(numel, like);
    at::Tensor edge = fp32_scratch(numel, like), prod = fp32_scratch(numel, like);
    for (at::Tensor* t : {&ch, &cv, &edge, &prod}) Backend::poison(*t);
    p.record = true;
    p.carry_h = ch.data_ptr<float>();
    p.carry_v = cv.data_ptr<float>();
    p.edge = edge.data_ptr<float>();
    p.prod = prod.data_ptr<float>();
    if (g.tiles_w > 1) {
      p.pass = kRowEdges;
      Backend::forward(p, type);
    }
    Backend::carry_scan(p, CarryScan{true, false, p.edge, p.prod, p.carry_h});
    if (g.tiles_h > 1) {
      p.pass = kColumnEdges;
      Backend::forward(p, type);
    }
    Backend::carry_scan(p, CarryScan{false, false, p.edge, p.prod, p.carry_v});
    p.pass = kFinal;
    Backend::forward(p, type);
    if (save_carries) return {ch, cv};
    return {carry_h, carry_v};
  }
  const bool record = save_carries && g.tiles_h * g.tiles_w > 1;
  p.record = record;
  if (record) {
    carry_h = fp32_scratch(carry_numel(g, true), like);
    Backend::poison(carry_h);
    p.carry_h = carry_h.data_ptr<float>();
  }
  at::Tensor vbuf;
  if (g.tiles_h > 1 || record) {
    vbuf = fp32_scratch(carry_numel(g, record), like);
    Backend::poison(vbuf);
    p.carry_v = vbuf.data_ptr<float>();
    if (record) carry_v = vbuf;
  }
  p.pass = kSequential;
  Backend::forward(p, type);
  return {carry_h, carry_v};
}

// Runs the forward; with `save_carries` (and more than one tile per map) it records the carries
// into every tile for the backward. Returns [y, carry_h, carry_v]: y (batch, dim, L) in fp32 when
// out_fp32 else u's dtype; the carries flat fp32, empty when not saved.
template <class Backend>
std::vector<at::Tensor> forward_impl(const at::Tensor& u, const at::Tensor& delta,
                                     const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                                     const OptTensor& D, const OptTensor& delta_bias, bool softplus,
                                     int64_t height, int64_t width, bool out_fp32,
                                     bool save_carries) {
  const Geometry g = check_inputs<Backend>(u, delta, A, B, C, D, delta_bias, height, width);
  at::Tensor y = at::empty(u.sizes(), u.options().dtype(out_fp32 ? at::kFloat : u.scalar_type()));
  if (u.numel() == 0) return {y, fp32_scratch(0, u), fp32_scratch(0, u)};
  Backend::poison(y);
  Params p = base_params(g, plan_launch(g, Backend::limits(u)), u, delta, A, B, C, D, delta_bias,
                         softplus);
  p.y = y.data_ptr();
  p.y_fp32 = y.scalar_type() == at::kFloat;
  std::vector<at::Tensor> carries = run_forward<Backend>(p, element_type(u.scalar_type()), u, save_carries);
  return {y, carries[0], carries[1]};
}

// The backward passes of a prepared launch (inputs, carries, dy and the gradient buffers set):
// the tile-parallel passes or the sequential one.
template <class Backend>
void run_backward(Params& p, ElementType type, const at::Tensor& like) {
  const Geometry& g = p.g;
  if (!p.k.bwd_tile_parallel) {
    p.pass = kSequential;
    Backend::backward(p, type);
    return;
  }
  // Few maps: gradient carries by the edge passes + reverse carry scans, then every tile at once.
  const int64_t numel = carry_numel(g, true);
  at::Tensor gin_v = fp32_scratch(numel, like), gin_h = fp32_scratch(numel, like);
  at::Tensor edge = fp32_scratch(numel, like), prod = fp32_scratch(numel, like);
  for (at::Tensor* t : {&gin_v, &gin_h, &edge, &prod}) Backend::poison(*t);
  p.grad_in_v = gin_v.data_ptr<float>();
  p.grad_in_h = gin_h.data_ptr<float>();
  p.edge = edge.data_ptr<float>();
  p.prod = prod.data_ptr<float>();
  if (g.tiles_h > 1) {
    p.pass = kColumnEdges;
    Backend::backward(p, type);
  }
  Backend::carry_scan(p, CarryScan{false, true, p.edge, p.prod, p.grad_in_v});
  if (g.tiles_w > 1) {
    p.pass = kRowEdges;
    Backend::backward(p, type);
  }
  Backend::carry_scan(p, CarryScan{true, true, p.edge, p.prod, p.grad_in_h});
  p.pass = kFinal;
  Backend::backward(p, type);
}

// [du, ddelta, dA, dB, dC, dD (undefined without D), ddelta_bias (undefined without it)].
// carry_h / carry_v: the carries a forward with save_carries recorded for these inputs, or empty
// tensors (then the carries are recorded here by a forward pass without y).
template <class Backend>
std::vector<at::Tensor> backward_impl(const at::Tensor& u, const at::Tensor& delta,
                                      const at::Tensor& A, const at::Tensor& B,
                                      const at::Tensor& C, const OptTensor& D,
                                      const OptTensor& delta_bias, bool softplus, int64_t height,
                                      int64_t width, const at::Tensor& dy,
                                      const at::Tensor& carry_h, const at::Tensor& carry_v) {
  const Geometry g = check_inputs<Backend>(u, delta, A, B, C, D, delta_bias, height, width);
  check_tensor<Backend>(dy, "dy", u);
  check_shape(dy, "dy", u.sizes());
  TORCH_CHECK_TYPE(dy.scalar_type() == u.scalar_type() || dy.scalar_type() == at::kFloat,
                   "selective_scan_2d (cuda kernel): dy must be ", u.scalar_type(),
                   " or float32, got ", dy.scalar_type());
  const at::TensorOptions f32 = u.options().dtype(at::kFloat);
  at::Tensor dD = D.has_value() ? at::zeros({g.dim}, f32) : at::Tensor();
  at::Tensor ddb = delta_bias.has_value() ? at::zeros({g.dim}, f32) : at::Tensor();
  if (u.numel() == 0) {
    return {at::zeros_like(u), at::zeros_like(delta), at::zeros_like(A), at::zeros_like(B),
            at::zeros_like(C), dD, ddb};
  }
  const int tiles = g.tiles_h * g.tiles_w;
  const int64_t carries = tiles > 1 ? carry_numel(g, true) : 0;
  const bool given = carry_h.numel() > 0 || carry_v.numel() > 0;
  if (given) {
    check_tensor<Backend>(carry_h, "carry_h", u);
    check_tensor<Backend>(carry_v, "carry_v", u);
    check_dtype(carry_h, "carry_h", at::kFloat);
    check_dtype(carry_v, "carry_v", at::kFloat);
    TORCH_CHECK_VALUE(carry_h.numel() == carries && carry_v.numel() == carries,
                      "selective_scan_2d (cuda kernel): carry_h / carry_v must hold ", carries,
                      " floats (the forward's saved carries for these shapes), got ",
                      carry_h.numel(), " / ", carry_v.numel());
  }
  const Launch launch = plan_launch(g, Backend::limits(u));
  const ElementType type = element_type(u.scalar_type());
  Params p = base_params(g, launch, u, delta, A, B, C, D, delta_bias, softplus);
  at::Tensor ch = carry_h, cv = carry_v, grad_carry_v;
  if (tiles > 1) {
    if (!given) {
      std::vector<at::Tensor> rec = forward_impl<Backend>(u, delta, A, B, C, D, delta_bias,
                                                          softplus, height, width, true, true);
      ch = rec[1];
      cv = rec[2];
    }
    grad_carry_v = fp32_scratch(grad_carry_numel(g), u);
    Backend::poison(grad_carry_v);
    p.carry_h = ch.data_ptr<float>();
    p.carry_v = cv.data_ptr<float>();
    p.grad_carry_v = grad_carry_v.data_ptr<float>();
  }
  at::Tensor du = at::empty_like(u);
  at::Tensor ddelta = at::empty_like(delta);
  Backend::poison(du);
  Backend::poison(ddelta);
  at::Tensor dB_part = at::zeros({launch.slices, g.batch, g.groups, g.nstate, g.length}, f32);
  at::Tensor dC_part = at::zeros({launch.slices, g.batch, g.groups, g.nstate, g.length}, f32);
  // Per-block partials of dA / dD / ddelta_bias: one row per (tile, batch block, channel) in the
  // tile-parallel backward, per (batch block, channel) otherwise.
  const bool tile_parallel = launch.bwd_tile_parallel;
  const int64_t part_tiles = tile_parallel ? tiles : 1;
  at::Tensor dA_part = at::empty({part_tiles * g.batch_blocks, g.dim, g.nstate}, f32);
  at::Tensor dD_part = at::empty({part_tiles * g.batch_blocks, g.dim}, f32);
  at::Tensor ddb_part = at::empty({part_tiles * g.batch_blocks, g.dim}, f32);
  Backend::poison(dA_part);
  Backend::poison(dD_part);
  Backend::poison(ddb_part);
  p.dy = dy.data_ptr();
  p.dy_fp32 = dy.scalar_type() == at::kFloat;
  p.du = du.data_ptr();
  p.ddelta = ddelta.data_ptr();
  p.dB_part = dB_part.data_ptr<float>();
  p.dC_part = dC_part.data_ptr<float>();
  p.dA_part = dA_part.data_ptr<float>();
  p.dD_part = dD_part.data_ptr<float>();
  p.ddb_part = ddb_part.data_ptr<float>();
  run_backward<Backend>(p, type, u);

  // Fixed-order reductions over slices / batch blocks: bitwise reproducible.
  at::Tensor dB = launch.slices == 1 ? dB_part[0] : dB_part.sum(0);
  at::Tensor dC = launch.slices == 1 ? dC_part[0] : dC_part.sum(0);
  at::Tensor dA = dA_part.sum(0);
  if (D.has_value()) dD = dD_part.sum(0);
  if (delta_bias.has_value()) ddb = ddb_part.sum(0);
  return {du, ddelta, dA, dB.to(B.scalar_type()), dC.to(C.scalar_type()), dD, ddb};
}

}  // namespace scan2d
}  // namespace vmamba2d
