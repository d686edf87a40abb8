// Run-time checks of the kernel image the current GPU runs: whether this extension holds one, and
// the arch it was compiled for.
//
// This file is compiled with the same -gencode list as the scan kernels (setup.py gives every .cu
// of the extension the same TORCH_CUDA_ARCH_LIST), so if the driver can load the probe kernel
// below for a device, it can load the scan kernels too. Torch-free: only the CUDA runtime.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "scan2d_launch.h"

namespace vmamba2d {
namespace scan2d {
namespace {

__global__ void kernel_image_probe() {}

std::string describe(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

// Makes `device` current for its lifetime and restores the caller's device after.
class ScopedDevice {
 public:
  // who: the entry point named in errors.
  ScopedDevice(int device, const char* who) {
    check(cudaGetDevice(&previous_), "cudaGetDevice", who);
    if (device != previous_) check(cudaSetDevice(device), "cudaSetDevice", who);
  }
  ~ScopedDevice() { cudaSetDevice(previous_); }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  static void check(cudaError_t status, const char* what, const char* who) {
    if (status != cudaSuccess) {
      throw std::runtime_error(std::string("vmamba2d._C_cuda.") + who + ": " + what +
                               " failed (" + describe(status) + ")");
    }
  }

 private:
  int previous_ = 0;
};

}  // namespace

bool kernel_image_available(int64_t device_index) {
  int count = 0;
  ScopedDevice::check(cudaGetDeviceCount(&count), "cudaGetDeviceCount", "kernel_image_available");
  if (device_index < 0 || device_index >= count) {
    throw std::invalid_argument("kernel_image_available: device_index must be in [0, " +
                                std::to_string(count) + "), got " + std::to_string(device_index));
  }
  const ScopedDevice scoped(static_cast<int>(device_index), "kernel_image_available");
  cudaFuncAttributes attributes{};
  const cudaError_t status = cudaFuncGetAttributes(&attributes, kernel_image_probe);
  if (status == cudaSuccess) return true;
  cudaGetLastError();  // the lookup error is not sticky, but leave no error pending for torch
  if (status == cudaErrorNoKernelImageForDevice || status == cudaErrorInvalidDeviceFunction) {
    return false;
  }
  ScopedDevice::check(status, "cudaFuncGetAttributes", "kernel_image_available");
  return false;  // unreachable: check() throws
}

int kernel_image_arch(int device) {
  const ScopedDevice scoped(device, "kernel_image_arch");
  cudaFuncAttributes attributes{};
  ScopedDevice::check(cudaFuncGetAttributes(&attributes, kernel_image_probe), "cudaFuncGetAttributes",
                      "kernel_image_arch");
  return attributes.ptxVersion;
}

}  // namespace scan2d
}  // namespace vmamba2d
