// The GPU side of the RS backward (scan2d_rows_backward.cuh): the warp context with its band
// buffer in shared memory, and the kernel bodies of the backward and of the carry-saving forward.
// Compiles with nvcc and with NVRTC.
#pragma once

#include "scan2d_rows_backward.cuh"
#include "scan2d_rows_device.cuh"

namespace vmamba2d {
namespace rows {

// RowsDeviceCtx plus the warp's band buffer: slot t of lane l at band[t * 32 + l] (consecutive
// lanes in consecutive banks: no bank conflicts).
struct RowsBackwardDeviceCtx : RowsDeviceCtx {
  float* band;

  SS2D_HD SS2D_INLINE float band_get(int t, int lane) const { return band[t * kWarpLanes + lane]; }
  SS2D_HD SS2D_INLINE void band_put(int t, int lane, float v) const { band[t * kWarpLanes + lane] = v; }

  // An element offset the compiler must take as new at this point: a view made from it is not
  // hoisted out of the row loops and kept in registers.
  SS2D_HD SS2D_INLINE long long fresh(long long v) const {
#ifdef __CUDA_ARCH__
    asm volatile("" : "+l"(v));
#endif
    return v;
  }
};

// Shared memory of a block of kRowsThreads threads, in floats.
template <int kV>
SS2D_HD constexpr int rows_backward_smem_floats() {
  return (kRowsThreads / kWarpLanes) * band_slots<kV>() * kWarpLanes;
}

// Warp w of the grid takes item w; `smem` holds rows_backward_smem_floats<kV>() floats.
template <class E, int kV, int kLoad, int kSteps, int kMaps, Order kOrder, bool kFromRight, int kFromBottom,
          int kDuF32>
__device__ SS2D_INLINE void rows_backward_kernel(const RowsBackwardParams& p, float* smem) {
  static_assert(kSteps >= 0 && kSteps <= kScanSteps, "kSteps: rows_scan_steps of the plan");
  static_assert(kMaps >= 1 && kMaps <= kWarpLanes, "kMaps: maps_per_warp of the plan");
  static_assert(kFromBottom == 0 || kFromBottom == 1, "kFromBottom: the route's row direction");
  static_assert(kDuF32 == 0 || kDuF32 == 1, "kDuF32: du's type");
  // Compiled for another plan, row direction or du type.
  if ((1 << kSteps) < p.seg_lanes || p.maps_per_warp != kMaps || p.from_bottom != kFromBottom ||
      p.du_fp32 != kDuF32) {
    __trap();
  }
  RowsBackwardDeviceCtx ctx;
  ctx.band = smem + (threadIdx.x / kWarpLanes) * band_slots<kV>() * kWarpLanes;
  const long long item = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpLanes;
  if (item >= rows_backward_items(p)) return;
  RowsBackward<E, kV, kLoad, kSteps, kMaps, kOrder, kFromRight, kFromBottom, kDuF32>::run(ctx, p, item);
}

// The forward of a 2D route that also stores the band carries (RowsForward::run_saving).
template <class E, int kV, int kLoad, int kPrefetch, int kSteps, Order kOrder, bool kFromRight>
__device__ SS2D_INLINE void rows_forward_saving_kernel(const RowsParams& p, float* carries) {
  static_assert(kSteps >= 0 && kSteps <= kScanSteps, "kSteps: rows_scan_steps of the plan");
  if ((1 << kSteps) < p.seg_lanes) __trap();
  RowsDeviceCtx ctx;
  const long long item = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpLanes;
  if (item >= rows_items(p)) return;
  RowsForward<E, kV, kLoad, kOrder, kFromRight, kPrefetch, kSteps, true>::run_saving(ctx, p, item, carries);
}

// The four cross routes' band carries (CrossRowsCarries): warp w of the grid takes item w.
template <class E, int kV, int kLoad, int kSteps>
__device__ SS2D_INLINE void rows_cross_save_kernel(const RowsParams& p, float* carries) {
  static_assert(kSteps >= 0 && kSteps <= kScanSteps, "kSteps: rows_scan_steps of the plan");
  if ((1 << kSteps) < p.seg_lanes || p.width % kV != 0) __trap();
  RowsDeviceCtx ctx;
  const long long item = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpLanes;
  if (item >= rows_items(p)) return;
  CrossRowsCarries<E, kV, kLoad, kSteps>::run(ctx, p, item, carries);
}

}  // namespace rows
}  // namespace vmamba2d
