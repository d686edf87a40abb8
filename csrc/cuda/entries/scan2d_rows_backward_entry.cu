// The extern "C" entries of the RS backward of a 2D route (scan2d_rows_backward.cuh), compiled with
// csrc/cuda as the include path and configured by macros (NVRTC -D options; nvcc -cubin for the
// static report), so a launcher compiles exactly the instance a RowsPlan asks for:
//   VMAMBA2D_RSB_DTYPE     0 fp32, 1 fp16, 2 bf16 (u, delta, B, C, du, ddelta; dy too unless fp32)
//   VMAMBA2D_RSB_VEC       RowsPlan::vec (1, 2 or 4)
//   VMAMBA2D_RSB_LOAD      RowsPlan::load
//   VMAMBA2D_RSB_STEPS     RowsPlan::scan_steps
//   VMAMBA2D_RSB_MAPS      RowsPlan::maps_per_warp (the backward only)
//   VMAMBA2D_RSB_ROUTE     a 2D route code (0-7); the saving forward's has bit 2 (from_bottom, a
//                          run-time field of RowsParams) clear: 0, 1, 4 or 5; the backward compiles
//                          it (RowsBackwardParams::from_bottom must match)
//   VMAMBA2D_RSB_DU_F32    1: du is fp32 (RowsBackwardParams::du_fp32 must match; a 2-byte
//                          instance's, for a multi-route op's running sum), 0: in the inputs' type
//   VMAMBA2D_RSB_SAVE      1: the entry is vmamba2d_rows_forward_save instead, the route's forward
//                          that also stores the band carries (RowsParams, then float* carries)
//                          2: vmamba2d_rows_cross_save instead, the band carries of VMamba's four
//                          cross routes in one launch (CrossRowsCarries: RowsParams in the
//                          four-route layout, then float* carries [4][batch * dim][carry rows][W];
//                          VEC must divide W; ROUTE and PREFETCH are not read)
//   VMAMBA2D_RSB_PREFETCH  RowsPlan::prefetch (the saving forward only)
// (vmamba2d/ops/compiled/rows_backward_launch.py builds these.)
// Launch: vmamba2d_rows_backward(RowsBackwardParams) with up to kRowsThreads (128) threads per
// block (whole warps), ceil(rows_backward_items / warps per block) blocks, no dynamic shared memory
// (the band buffers are static: 4 warps x band_slots<V> x 32 floats, 34 KiB at V = 4);
// vmamba2d_rows_forward_save(RowsParams, float*) as the RS forward entry.
#include "scan2d_rows_backward_device.cuh"

#ifndef VMAMBA2D_RSB_DTYPE
#define VMAMBA2D_RSB_DTYPE 0
#endif
#ifndef VMAMBA2D_RSB_VEC
#define VMAMBA2D_RSB_VEC 4
#endif
#ifndef VMAMBA2D_RSB_LOAD
#define VMAMBA2D_RSB_LOAD VMAMBA2D_RSB_VEC
#endif
#ifndef VMAMBA2D_RSB_STEPS
#define VMAMBA2D_RSB_STEPS 4
#endif
#ifndef VMAMBA2D_RSB_MAPS
#define VMAMBA2D_RSB_MAPS 2
#endif
#ifndef VMAMBA2D_RSB_PREFETCH
#define VMAMBA2D_RSB_PREFETCH 1
#endif
#ifndef VMAMBA2D_RSB_ROUTE
#define VMAMBA2D_RSB_ROUTE 0
#endif
#ifndef VMAMBA2D_RSB_DU_F32
#define VMAMBA2D_RSB_DU_F32 0
#endif
// Blocks per SM the backward is compiled for: at V = 4 the band buffers (34 KiB a block) let at
// most 6 blocks share an sm_90 SM (sm_80: 4, sm_75: 1), so 6 there (80 registers; at 64 every
// instance spilled 8-56 bytes under NVRTC) costs no occupancy; narrower lanes: kRowsMinBlocks (64).
#ifndef VMAMBA2D_RSB_MIN_BLOCKS
#define VMAMBA2D_RSB_MIN_BLOCKS (VMAMBA2D_RSB_VEC == 4 ? 6 : vmamba2d::rows::kRowsMinBlocks)
#endif

namespace vmamba2d {
namespace rows {

template <int kType>
struct BackwardElement;
template <>
struct BackwardElement<0> {
  using type = DeviceF32;
};
template <>
struct BackwardElement<1> {
  using type = DeviceF16;
};
template <>
struct BackwardElement<2> {
  using type = DeviceBF16;
};

static_assert(VMAMBA2D_RSB_VEC == 1 || VMAMBA2D_RSB_VEC == 2 || VMAMBA2D_RSB_VEC == 4, "VMAMBA2D_RSB_VEC: 1, 2 or 4");
static_assert(VMAMBA2D_RSB_ROUTE >= 0 && VMAMBA2D_RSB_ROUTE < 8, "VMAMBA2D_RSB_ROUTE: a 2D route code");
constexpr Order kBackwardOrder = (VMAMBA2D_RSB_ROUTE & kRouteColumnsFirst) ? Order::kColumnsFirst : Order::kRowsFirst;
constexpr bool kBackwardFromRight = (VMAMBA2D_RSB_ROUTE & kRouteFromRight) != 0;
constexpr int kBackwardFromBottom = (VMAMBA2D_RSB_ROUTE & kRouteFromBottom) ? 1 : 0;

}  // namespace rows
}  // namespace vmamba2d

#if defined(VMAMBA2D_RSB_SAVE) && VMAMBA2D_RSB_SAVE == 2
// At 4 columns a lane the two routes' state takes 80 registers (6 blocks per SM: at 64, NVRTC 13.0
// spilled 28-36 B of the fp32 / fp16 instances on sm_75 .. sm_90), as the four-route forward's.
extern "C" __global__ void __launch_bounds__(vmamba2d::rows::kRowsThreads,
                                             VMAMBA2D_RSB_VEC == 4 ? 6 : vmamba2d::rows::kRowsMinBlocks)
    vmamba2d_rows_cross_save(const vmamba2d::rows::RowsParams p, float* carries) {
  using namespace vmamba2d::rows;
  rows_cross_save_kernel<BackwardElement<VMAMBA2D_RSB_DTYPE>::type, VMAMBA2D_RSB_VEC, VMAMBA2D_RSB_LOAD,
                         VMAMBA2D_RSB_STEPS>(p, carries);
}
#elif defined(VMAMBA2D_RSB_SAVE) && VMAMBA2D_RSB_SAVE
static_assert((VMAMBA2D_RSB_ROUTE & vmamba2d::rows::kRouteFromBottom) == 0,
              "VMAMBA2D_RSB_ROUTE of the saving forward: from_bottom is RowsParams::from_bottom");
extern "C" __global__ void __launch_bounds__(vmamba2d::rows::kRowsThreads, vmamba2d::rows::kRowsMinBlocks)
    vmamba2d_rows_forward_save(const vmamba2d::rows::RowsParams p, float* carries) {
  using namespace vmamba2d::rows;
  rows_forward_saving_kernel<BackwardElement<VMAMBA2D_RSB_DTYPE>::type, VMAMBA2D_RSB_VEC, VMAMBA2D_RSB_LOAD,
                             VMAMBA2D_RSB_PREFETCH, VMAMBA2D_RSB_STEPS, kBackwardOrder, kBackwardFromRight>(p, carries);
}
#else
extern "C" __global__ void __launch_bounds__(vmamba2d::rows::kRowsThreads, VMAMBA2D_RSB_MIN_BLOCKS)
    vmamba2d_rows_backward(const vmamba2d::rows::RowsBackwardParams p) {
  using namespace vmamba2d::rows;
  __shared__ float band[rows_backward_smem_floats<VMAMBA2D_RSB_VEC>()];
  rows_backward_kernel<BackwardElement<VMAMBA2D_RSB_DTYPE>::type, VMAMBA2D_RSB_VEC, VMAMBA2D_RSB_LOAD,
                       VMAMBA2D_RSB_STEPS, VMAMBA2D_RSB_MAPS, kBackwardOrder, kBackwardFromRight,
                       kBackwardFromBottom, VMAMBA2D_RSB_DU_F32>(p, band);
}
#endif
