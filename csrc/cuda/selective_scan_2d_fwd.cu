// Forward kernel instantiations (fp32 / fp16 / bf16 inputs) and their launcher. No ATen: compiles
// device-only with `nvcc -cubin -I csrc/cuda` for the resource check.
#define SS2D_DEFINE_CARRY_SCAN_KERNEL
#include "scan2d_kernels.cuh"
#include "scan2d_launch.h"
#include "scan2d_launch_shape.h"

namespace vmamba2d {
namespace scan2d {

template <class T>
static cudaError_t launch_forward_typed(const Params& p, cudaStream_t stream) {
  const LaunchShape shape = forward_shape(p);
  const dim3 grid(shape.grid[0], shape.grid[1], shape.grid[2]);
  const Variant v = shape.variant;
  auto kernel = scan2d_forward_kernel<T, Variant::kGeneral>;
  if (v == Variant::kOneStateSequential) kernel = scan2d_forward_kernel<T, Variant::kOneStateSequential>;
  if (v == Variant::kRoute) kernel = scan2d_forward_kernel<T, Variant::kRoute>;
  if (v == Variant::kOneStateRoute) kernel = scan2d_forward_kernel<T, Variant::kOneStateRoute>;
  kernel<<<grid, shape.threads, shape.smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t forward_kernel_arch(int* arch) {
  cudaFuncAttributes attributes{};
  const cudaError_t err =
      cudaFuncGetAttributes(&attributes, scan2d_forward_kernel<float, Variant::kOneStateSequential>);
  *arch = attributes.ptxVersion;
  return err;
}

cudaError_t launch_carry_scan(const Params& p, const CarryScan& scan, cudaStream_t stream) {
  const LaunchShape shape = carry_scan_shape(p, scan);
  scan2d_carry_scan_kernel<<<shape.grid[0], shape.threads, 0, stream>>>(p, scan);
  return cudaGetLastError();
}

cudaError_t launch_forward(const Params& p, ElementType type, cudaStream_t stream) {
  switch (type) {
    case ElementType::kFloat32:
      return launch_forward_typed<float>(p, stream);
    case ElementType::kFloat16:
      return launch_forward_typed<__half>(p, stream);
    case ElementType::kBFloat16:
      return launch_forward_typed<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

template <class T>
static cudaError_t allow_forward_shared_memory_typed(size_t smem_bytes) {
  const int bytes = static_cast<int>(smem_bytes);
  const cudaFuncAttribute attr = cudaFuncAttributeMaxDynamicSharedMemorySize;
  cudaError_t err = cudaFuncSetAttribute(scan2d_forward_kernel<T, Variant::kGeneral>, attr, bytes);
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(scan2d_forward_kernel<T, Variant::kOneStateSequential>, attr, bytes);
  }
  if (err == cudaSuccess) err = cudaFuncSetAttribute(scan2d_forward_kernel<T, Variant::kRoute>, attr, bytes);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(scan2d_forward_kernel<T, Variant::kOneStateRoute>, attr, bytes);
  return err;
}

cudaError_t allow_forward_shared_memory(size_t smem_bytes) {
  cudaError_t err = allow_forward_shared_memory_typed<float>(smem_bytes);
  if (err == cudaSuccess) err = allow_forward_shared_memory_typed<__half>(smem_bytes);
  if (err == cudaSuccess) err = allow_forward_shared_memory_typed<__nv_bfloat16>(smem_bytes);
  return err;
}

}  // namespace scan2d
}  // namespace vmamba2d
