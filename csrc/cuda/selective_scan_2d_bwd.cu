// Backward kernel instantiations (fp32 / fp16 / bf16 inputs) and their launcher. No ATen: compiles
// device-only with `nvcc -cubin -I csrc/cuda` for the resource check.
#include "scan2d_kernels.cuh"
#include "scan2d_launch.h"
#include "scan2d_launch_shape.h"

namespace vmamba2d {
namespace scan2d {

cudaError_t allow_forward_shared_memory(size_t smem_bytes);  // selective_scan_2d_fwd.cu

template <class T>
static cudaError_t launch_backward_typed(const Params& p, cudaStream_t stream) {
  const LaunchShape shape = backward_shape(p);
  const dim3 grid(shape.grid[0], shape.grid[1], shape.grid[2]);
  const Variant v = shape.variant;
  const auto kernel = v == Variant::kOneStateSequential ? scan2d_backward_kernel<T, Variant::kOneStateSequential>
                      : v == Variant::kOneStateRoute   ? scan2d_backward_kernel<T, Variant::kOneStateRoute>
                      : v == Variant::kRoute           ? scan2d_backward_kernel<T, Variant::kRoute>
                                                       : scan2d_backward_kernel<T, Variant::kGeneral>;
  kernel<<<grid, shape.threads, shape.smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_backward(const Params& p, ElementType type, cudaStream_t stream) {
  switch (type) {
    case ElementType::kFloat32:
      return launch_backward_typed<float>(p, stream);
    case ElementType::kFloat16:
      return launch_backward_typed<__half>(p, stream);
    case ElementType::kBFloat16:
      return launch_backward_typed<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

template <class T>
static cudaError_t allow_backward_shared_memory(size_t smem_bytes) {
  const int bytes = static_cast<int>(smem_bytes);
  const cudaFuncAttribute attr = cudaFuncAttributeMaxDynamicSharedMemorySize;
  cudaError_t err = cudaFuncSetAttribute(scan2d_backward_kernel<T, Variant::kGeneral>, attr, bytes);
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(scan2d_backward_kernel<T, Variant::kOneStateSequential>, attr, bytes);
  }
  if (err == cudaSuccess) err = cudaFuncSetAttribute(scan2d_backward_kernel<T, Variant::kRoute>, attr, bytes);
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(scan2d_backward_kernel<T, Variant::kOneStateRoute>, attr, bytes);
  }
  return err;
}

cudaError_t allow_shared_memory(size_t smem_bytes) {
  cudaError_t err = allow_backward_shared_memory<float>(smem_bytes);
  if (err == cudaSuccess) err = allow_backward_shared_memory<__half>(smem_bytes);
  if (err == cudaSuccess) err = allow_backward_shared_memory<__nv_bfloat16>(smem_bytes);
  if (err == cudaSuccess) err = allow_forward_shared_memory(smem_bytes);
  return err;
}

}  // namespace scan2d
}  // namespace vmamba2d
