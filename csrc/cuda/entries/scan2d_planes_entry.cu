// One extern "C" entry of the v4 one-plane-per-lane forward (scan2d_planes.cuh), compiled with
// csrc/cuda as the include path (outside setup.py's glob of the nvcc-built extension's sources);
// configured by macros so a launcher compiles exactly the instance a PlanesPlan asks for (NVRTC: -D
// options; nvcc -cubin for the static report, dev/gpu/v4_static_planes.py):
//   VMAMBA2D_PL_DTYPE   0 fp32, 1 fp16, 2 bf16 (u, delta, B, C and a y that is not fp32)
//   VMAMBA2D_PL_HEIGHT  the map's height H
//   VMAMBA2D_PL_WIDTH   the map's width W (H * W <= 64)
//   VMAMBA2D_PL_ROUTE   the route code (0 .. 15)
//   VMAMBA2D_PL_COPY    bytes per asynchronous copy and staged store: 16, 8 or 4 (every pointer
//                       aligned to it)
// (PlanesPlan: vmamba2d/ops/compiled/planes_launch.py, whose defines() gives these.)
// Launch: vmamba2d_planes_forward(PlanesParams) with kPlanesThreads (128) threads per block (chunk =
// 128), any grid (persistent CTAs; at most planes_chunks), planes_layout(p).total bytes of dynamic
// shared memory (above 48 KiB: the function's max dynamic shared memory attribute raised first).
#include "scan2d_planes_device.cuh"

#ifndef VMAMBA2D_PL_DTYPE
#define VMAMBA2D_PL_DTYPE 0
#endif
#ifndef VMAMBA2D_PL_HEIGHT
#define VMAMBA2D_PL_HEIGHT 7
#endif
#ifndef VMAMBA2D_PL_WIDTH
#define VMAMBA2D_PL_WIDTH 7
#endif
#ifndef VMAMBA2D_PL_ROUTE
#define VMAMBA2D_PL_ROUTE 0
#endif
#ifndef VMAMBA2D_PL_COPY
#define VMAMBA2D_PL_COPY 16
#endif
// CTAs per SM the registers are capped for (kPlanesMinBlocks: 64 registers); lower for experiments.
#ifndef VMAMBA2D_PL_MIN_BLOCKS
#define VMAMBA2D_PL_MIN_BLOCKS vmamba2d::planes::kPlanesMinBlocks
#endif

namespace vmamba2d {
namespace planes {

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

static_assert(VMAMBA2D_PL_ROUTE >= 0 && VMAMBA2D_PL_ROUTE < 16, "VMAMBA2D_PL_ROUTE: a route code 0 .. 15");
static_assert(VMAMBA2D_PL_HEIGHT >= 1 && VMAMBA2D_PL_WIDTH >= 1 &&
                  VMAMBA2D_PL_HEIGHT * VMAMBA2D_PL_WIDTH <= kMaxCells,
              "VMAMBA2D_PL_HEIGHT x VMAMBA2D_PL_WIDTH: a plane of 1 .. 64 cells");

}  // namespace planes
}  // namespace vmamba2d

extern "C" __global__ void __launch_bounds__(vmamba2d::planes::kPlanesThreads, VMAMBA2D_PL_MIN_BLOCKS)
    vmamba2d_planes_forward(const vmamba2d::planes::PlanesParams p) {
  using namespace vmamba2d::planes;
  extern __shared__ __align__(16) unsigned char planes_smem[];
  planes_forward_kernel<DeviceElement<VMAMBA2D_PL_DTYPE>::type, VMAMBA2D_PL_HEIGHT, VMAMBA2D_PL_WIDTH,
                        VMAMBA2D_PL_ROUTE, VMAMBA2D_PL_COPY>(p, planes_smem);
}
