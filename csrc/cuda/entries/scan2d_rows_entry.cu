// One extern "C" entry of the v4 row-streaming forward (scan2d_rows.cuh), compiled with csrc/cuda as
// the include path (this folder is outside setup.py's glob of the nvcc-built extension's sources);
// configured by macros so a
// launcher compiles exactly the instance a RowsPlan asks for (NVRTC: -D options; nvcc -cubin for
// the static report, dev/gpu/v4_static_report.py):
//   VMAMBA2D_RS_DTYPE     0 fp32, 1 fp16, 2 bf16 (u, delta, B, C and a y that is not fp32)
//   VMAMBA2D_RS_VEC       RowsPlan::vec
//   VMAMBA2D_RS_LOAD      RowsPlan::load
//   VMAMBA2D_RS_ROUTE     the route code with bit 2 (from_bottom, RowsParams::from_bottom) clear
//   VMAMBA2D_RS_PREFETCH  RowsPlan::prefetch
//   VMAMBA2D_RS_STEPS     RowsPlan::scan_steps (rows_scan_steps of the launch's seg_lanes)
//   VMAMBA2D_RS_CROSS     1: the entry is vmamba2d_rows_cross_forward instead, the four-route kernel
//                         (CrossRowsForward: VMamba's cross routes, RowsParams in the four-route
//                         layout; VEC must divide W; ROUTE is not read; PREFETCH: the rows of u
//                         and delta held ahead, CrossPlan::prefetch; 1 with FOLD)
//   VMAMBA2D_RS_MIN_BLOCKS blocks per SM of the launch bounds (default below); the four-route plan
//                         sets it at 4 columns a lane (CrossPlan::min_blocks: 6 fp16 / bf16, 5 fp32)
//   VMAMBA2D_RS_FOLD      1 (with VMAMBA2D_RS_CROSS): the four-route kernel folds the step sizes
//                         (CrossRowsForward's kFold): the entry is vmamba2d_rows_cross_forward(RowsFoldParams),
//                         delta low-rank [batch][4 * rank][L] (scan2d_rows_common.h)
// (RowsPlan: vmamba2d/ops/compiled/rows_plan.py, whose defines() gives these.)
// Launch: vmamba2d_rows_forward(RowsParams) with kRowsThreads (128) threads per block and
// ceil(rows_items / 4) blocks, no dynamic shared memory.
#include "scan2d_rows_device.cuh"

#ifndef VMAMBA2D_RS_DTYPE
#define VMAMBA2D_RS_DTYPE 0
#endif
#ifndef VMAMBA2D_RS_VEC
#define VMAMBA2D_RS_VEC 4
#endif
#ifndef VMAMBA2D_RS_LOAD
#define VMAMBA2D_RS_LOAD VMAMBA2D_RS_VEC
#endif
#ifndef VMAMBA2D_RS_ROUTE
#define VMAMBA2D_RS_ROUTE 0
#endif
#ifndef VMAMBA2D_RS_PREFETCH
#define VMAMBA2D_RS_PREFETCH 1
#endif
#ifndef VMAMBA2D_RS_STEPS
#define VMAMBA2D_RS_STEPS 4
#endif
#ifndef VMAMBA2D_RS_FOLD
#define VMAMBA2D_RS_FOLD 0
#endif
// Blocks per SM the kernel is compiled for (kRowsMinBlocks: 64 registers) unless the plan sets it: the
// four-route kernel at 4 columns a lane holds two routes' state for 4 columns and is compiled for 6
// blocks (80 registers) in fp16 / bf16, 5 (96) in fp32 (rows_plan.CROSS_WIDE_MIN_BLOCKS); holding u
// and delta two rows ahead (rows_plan.CROSS_DEEP_MIN_BLOCKS), at 4 columns 5 (96) in fp16 / bf16, at 2
// columns 6 (80), at 1 column the default 8 (64).
// The fp16 four-route kernel on sm_75 takes 7 (72 registers, 28 of the SM's 32 warps): at 64
// registers ptxas (NVRTC 13.0, nvcc 13.0) spills 4+4 B with an 8 B stack frame at V = 2 with 3 or 4
// scan steps (W = 14, 28). The unfolded fp32 one takes 7 on sm_75 and sm_80 since its bottom-up sweep
// holds the y read-back a row ahead: at 64 registers NVRTC 13.0 spills 32+32 B with a 16 B frame there
// at W = 14, 28. bf16, the fp32 folding instance, fp16 on sm_80 and newer, and fp32 on sm_86 and newer
// fit 64 without spills.
#ifndef VMAMBA2D_RS_MIN_BLOCKS
#if VMAMBA2D_RS_CROSS && defined(__CUDA_ARCH__) && \
    ((VMAMBA2D_RS_DTYPE == 1 && __CUDA_ARCH__ == 750) || \
     (VMAMBA2D_RS_DTYPE == 0 && !VMAMBA2D_RS_FOLD && (__CUDA_ARCH__ == 750 || __CUDA_ARCH__ == 800)))
#define VMAMBA2D_RS_MIN_BLOCKS 7
#else
#define VMAMBA2D_RS_MIN_BLOCKS vmamba2d::rows::kRowsMinBlocks
#endif
#endif

namespace vmamba2d {
namespace rows {

template <int kType>
struct DeviceElement;
template <>
struct DeviceElement<0> {
  using type = DeviceF32;
};
template <>
struct DeviceElement<1> {
  using type = DeviceF16;
};
template <>
struct DeviceElement<2> {
  using type = DeviceBF16;
};

static_assert(VMAMBA2D_RS_ROUTE >= 0 && VMAMBA2D_RS_ROUTE < 16 && (VMAMBA2D_RS_ROUTE & kRouteFromBottom) == 0,
              "VMAMBA2D_RS_ROUTE: a route code without its from_bottom bit");
static_assert(!((VMAMBA2D_RS_ROUTE & kRouteFlat) && (VMAMBA2D_RS_ROUTE & kRouteColumnsFirst)),
              "flat column-major routes are not row streams");

}  // namespace rows
}  // namespace vmamba2d

#if defined(VMAMBA2D_RS_CROSS) && VMAMBA2D_RS_CROSS && VMAMBA2D_RS_FOLD
extern "C" __global__ void __launch_bounds__(vmamba2d::rows::kRowsThreads, VMAMBA2D_RS_MIN_BLOCKS)
    vmamba2d_rows_cross_forward(const vmamba2d::rows::RowsFoldParams p) {
  using namespace vmamba2d::rows;
  static_assert(VMAMBA2D_RS_PREFETCH == 1, "VMAMBA2D_RS_PREFETCH: the folding instance loads one row ahead");
  rows_cross_forward_kernel<DeviceElement<VMAMBA2D_RS_DTYPE>::type, VMAMBA2D_RS_VEC, VMAMBA2D_RS_LOAD,
                            VMAMBA2D_RS_STEPS, true>(p);
}
#elif defined(VMAMBA2D_RS_CROSS) && VMAMBA2D_RS_CROSS
extern "C" __global__ void __launch_bounds__(vmamba2d::rows::kRowsThreads, VMAMBA2D_RS_MIN_BLOCKS)
    vmamba2d_rows_cross_forward(const vmamba2d::rows::RowsParams p) {
  using namespace vmamba2d::rows;
  rows_cross_forward_kernel<DeviceElement<VMAMBA2D_RS_DTYPE>::type, VMAMBA2D_RS_VEC, VMAMBA2D_RS_LOAD,
                            VMAMBA2D_RS_STEPS, false, VMAMBA2D_RS_PREFETCH>(p);
}
#else
extern "C" __global__ void __launch_bounds__(vmamba2d::rows::kRowsThreads, VMAMBA2D_RS_MIN_BLOCKS)
    vmamba2d_rows_forward(const vmamba2d::rows::RowsParams p) {
  using namespace vmamba2d::rows;
  constexpr Order kOrder = (VMAMBA2D_RS_ROUTE & kRouteFlat)            ? Order::kFlat
                           : (VMAMBA2D_RS_ROUTE & kRouteColumnsFirst) ? Order::kColumnsFirst
                                                                       : Order::kRowsFirst;
  rows_forward_kernel<DeviceElement<VMAMBA2D_RS_DTYPE>::type, VMAMBA2D_RS_VEC, VMAMBA2D_RS_LOAD, kOrder,
                      (VMAMBA2D_RS_ROUTE & kRouteFromRight) != 0, VMAMBA2D_RS_PREFETCH,
                      VMAMBA2D_RS_STEPS>(p);
}
#endif
