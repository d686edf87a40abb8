// Host-side entry points of the CUDA kernels (defined in selective_scan_2d_fwd.cu / _bwd.cu).
// Plain C++ and the CUDA runtime API (no ATen): they return the launch's error, the ATen-facing
// code checks it.
#pragma once

#include <cuda_runtime_api.h>

#include "scan2d_common.h"

namespace vmamba2d {
namespace scan2d {

// grid = (g.batch_blocks, g.dim / k.fwd_channels, 1 or the tiles of a map for the tile-parallel
// passes), fwd_channels * fwd_wpc warps.
cudaError_t launch_forward(const Params& p, ElementType type, cudaStream_t stream);

// Tile-parallel passes: carries along tile rows or down tile columns (forward or reverse); 1D grid
// of kBlockThreads-thread blocks over carry_scan_lines(g, scan.rows).
cudaError_t launch_carry_scan(const Params& p, const CarryScan& scan, cudaStream_t stream);

// grid = (g.batch_blocks, g.groups * k.slices, 1 or the tiles of a map for the tile-parallel
// passes), bwd_channels * bwd_wpc warps; p.pass picks the edge passes or the full backward.
cudaError_t launch_backward(const Params& p, ElementType type, cudaStream_t stream);

// Compute capability x 10 of the forward kernel code the current GPU runs with this build: the PTX
// arch (cudaFuncAttributes::ptxVersion, __CUDA_ARCH__ / 10 while it was compiled) of the image the
// driver picks there. The launch plan sizes the forward's shared memory for that code
// (forward_carry_in_registers), which need not be the device's own compute capability (an sm_80
// image running on sm_86, a PTX image JIT-compiled for a newer GPU).
cudaError_t forward_kernel_arch(int* arch);

// Opts every kernel instantiation of this file set into `smem_bytes` of dynamic shared memory
// (cudaFuncSetAttribute); called once per device by the ATen side.
cudaError_t allow_shared_memory(size_t smem_bytes);

}  // namespace scan2d
}  // namespace vmamba2d
