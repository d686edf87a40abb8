// Execution context of scan2d_kernel.cuh on the GPU: each call runs the body for the calling
// thread only; shared and global views are raw pointers. Methods are __host__ __device__ so the
// shared templates compile on both sides; their host branches are never executed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "scan2d_common.h"
#include "scan2d_kernel.cuh"

namespace vmamba2d {
namespace scan2d {

template <>
struct Element<__half> {
  static __device__ SS2D_INLINE float load(__half v) { return __half2float(v); }
  static __device__ SS2D_INLINE __half store(float v) { return __float2half_rn(v); }
};

template <>
struct Element<__nv_bfloat16> {
  static __device__ SS2D_INLINE float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ SS2D_INLINE __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

struct DeviceCtx {
  static constexpr int kLaneSlots = 1;

  template <class V>
  SS2D_HD SS2D_INLINE V* shared(char* smem, size_t byte_offset, int64_t) const {
    return reinterpret_cast<V*>(smem + byte_offset);
  }
  template <class V>
  SS2D_HD SS2D_INLINE V* global(V* ptr, int64_t) const {
    return ptr;
  }

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
    f(static_cast<int>(threadIdx.x) >> kTileShift);
#endif
  }
  template <class F>
  SS2D_HD SS2D_INLINE void each_lane(F&& f) const {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x) & (kTile - 1));
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
};

}  // namespace scan2d
}  // namespace vmamba2d
