// The CUDA kernels' __global__ entry points: the forward and backward per (element type, variant)
// and the carry scan. One definition for both builds: selective_scan_2d_fwd.cu / _bwd.cu
// instantiate them for nvcc, NVRTC compiles this header per instantiation by name expression
// (vmamba2d/ops/compiled/nvrtc.py), so both run exactly the same code. No host runtime API.
#pragma once

#include "scan2d_device.cuh"

namespace vmamba2d {
namespace scan2d {

template <class T, Variant V>
__global__ void __launch_bounds__(kBlockThreads, forward_min_blocks_per_sm(V, kCompiledArch))
    scan2d_forward_kernel(Params p) {
  extern __shared__ __align__(16) char smem[];
  DeviceCtx ctx;
  forward_block<T, V>(ctx, p, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                      static_cast<int>(blockIdx.z), smem);
}

template <class T, Variant V>
__global__ void __launch_bounds__(kBlockThreads, backward_min_blocks_per_sm(V)) scan2d_backward_kernel(Params p) {
  extern __shared__ __align__(16) char smem[];
  DeviceCtx ctx;
  backward_block<T, V>(ctx, p, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                       static_cast<int>(blockIdx.z), smem);
}

// Not a template, so defined only where SS2D_DEFINE_CARRY_SCAN_KERNEL is set (the forward's .cu,
// the NVRTC program of the carry scan): one definition per binary.
#ifdef SS2D_DEFINE_CARRY_SCAN_KERNEL
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm) scan2d_carry_scan_kernel(Params p, CarryScan scan) {
  DeviceCtx ctx;
  carry_scan_block(ctx, p, static_cast<int>(blockIdx.x), scan);
}
#endif

}  // namespace scan2d
}  // namespace vmamba2d
