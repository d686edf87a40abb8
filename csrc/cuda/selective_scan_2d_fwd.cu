// Forward kernel instantiations (fp32 / fp16 / bf16 inputs) and their launcher.
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "scan2d_device.cuh"
#include "scan2d_kernel.cuh"
#include "scan2d_launch.h"

namespace vmamba2d {
namespace scan2d {

template <class T>
__global__ void __launch_bounds__(kMaxWarps * kTile) scan2d_forward_kernel(Params p) {
  extern __shared__ __align__(16) char smem[];
  DeviceCtx ctx;
  forward_block<T>(ctx, p, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), smem);
}

template <class T>
static void launch_forward_typed(const Params& p, int nwarps, size_t smem_bytes,
                                 cudaStream_t stream) {
  auto kernel = scan2d_forward_kernel<T>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes)));
  const dim3 grid(static_cast<unsigned>(p.g.batch_blocks), static_cast<unsigned>(p.g.dim));
  kernel<<<grid, nwarps * kTile, smem_bytes, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_forward(const Params& p, ElementType type, int nwarps, size_t smem_bytes,
                    cudaStream_t stream) {
  switch (type) {
    case ElementType::kFloat32:
      launch_forward_typed<float>(p, nwarps, smem_bytes, stream);
      break;
    case ElementType::kFloat16:
      launch_forward_typed<c10::Half>(p, nwarps, smem_bytes, stream);
      break;
    case ElementType::kBFloat16:
      launch_forward_typed<c10::BFloat16>(p, nwarps, smem_bytes, stream);
      break;
  }
}

}  // namespace scan2d
}  // namespace vmamba2d
