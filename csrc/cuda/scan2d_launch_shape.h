// Grid, block and dynamic shared memory of each kernel launch, from the plan in Params. Plain C++
// (no CUDA runtime, no ATen): the nvcc launchers (selective_scan_2d_fwd.cu / _bwd.cu) and the
// NVRTC path's host driver (selective_scan_2d_nvrtc.cpp) both launch with these figures.
#pragma once

#include <cstddef>
#include <cstdint>

#include "scan2d_common.h"

namespace vmamba2d {
namespace scan2d {

struct LaunchShape {
  unsigned grid[3];
  int threads;
  size_t smem;
  Variant variant;  // the kernel variant (kGeneral for the carry scan, which has none)
};

// grid = (batch_blocks, dim / fwd_channels, 1 or the tiles of a map for the tile-parallel passes),
// fwd_channels * fwd_wpc warps.
inline LaunchShape forward_shape(const Params& p) {
  const int tiles = p.pass == kSequential ? 1 : p.g.tiles_h * p.g.tiles_w;
  return LaunchShape{{static_cast<unsigned>(p.g.batch_blocks), static_cast<unsigned>(p.g.dim / p.k.fwd_channels),
                      static_cast<unsigned>(tiles)},
                     p.k.fwd_channels * p.k.fwd_wpc * kTile,
                     forward_layout(p.k.fwd_channels, p.k.fwd_wpc, p.g.nstate, p.g.route.active,
                                    p.k.fwd_carry_in_registers).total,
                     kernel_variant(p, p.k.fwd_wpc)};
}

// grid = (batch_blocks, groups * slices, 1 or the tiles of a map), bwd_channels * bwd_wpc warps.
inline LaunchShape backward_shape(const Params& p) {
  const int tiles = p.pass == kSequential ? 1 : p.g.tiles_h * p.g.tiles_w;
  return LaunchShape{{static_cast<unsigned>(p.g.batch_blocks), static_cast<unsigned>(p.g.groups * p.k.slices),
                      static_cast<unsigned>(tiles)},
                     p.k.bwd_channels * p.k.bwd_wpc * kTile,
                     backward_layout(p.k.bwd_channels, p.k.bwd_wpc, p.g.nstate).total,
                     kernel_variant(p, p.k.bwd_wpc)};
}

// 1D grid of kBlockThreads-thread blocks over carry_scan_lines(g, scan.rows), no shared memory.
inline LaunchShape carry_scan_shape(const Params& p, const CarryScan& scan) {
  const int64_t blocks = (carry_scan_lines(p.g, scan.rows) + kBlockThreads - 1) / kBlockThreads;
  return LaunchShape{{static_cast<unsigned>(blocks), 1u, 1u}, kBlockThreads, 0, Variant::kGeneral};
}

}  // namespace scan2d
}  // namespace vmamba2d
