// Execution context of scan2d_kernel.cuh on the GPU: each call runs the body for the calling
// thread only. Methods are __host__ __device__ so the shared templates compile on both sides;
// their host branches are never executed.
#pragma once

#include "scan2d_common.h"

namespace vmamba2d {
namespace scan2d {

struct DeviceCtx {
  static constexpr int kLaneSlots = 1;

  SS2D_HD SS2D_INLINE int nthreads() const {
#ifdef __CUDA_ARCH__
    return static_cast<int>(blockDim.x);
#else
    return 0;
#endif
  }
  SS2D_HD SS2D_INLINE int nwarps() const { return nthreads() / kTile; }
  SS2D_HD SS2D_INLINE int lane_slot(int) const { return 0; }

  template <class F>
  SS2D_HD SS2D_INLINE void each_thread(F&& f) const {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x));
#endif
  }
  template <class F>
  SS2D_HD SS2D_INLINE void each_warp(F&& f) const {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x) / kTile);
#endif
  }
  template <class F>
  SS2D_HD SS2D_INLINE void each_lane(F&& f) const {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x) % kTile);
#endif
  }
  SS2D_HD SS2D_INLINE void barrier() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
  SS2D_HD SS2D_INLINE void sync_warp() const {
#ifdef __CUDA_ARCH__
    __syncwarp();
#endif
  }
  SS2D_HD SS2D_INLINE void add(float* target, float value, bool atomic) const {
#ifdef __CUDA_ARCH__
    if (atomic) {
      atomicAdd(target, value);
    } else {
      *target += value;
    }
#endif
  }
};

}  // namespace scan2d
}  // namespace vmamba2d
