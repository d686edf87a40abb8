// Run-time check that this extension holds a kernel image the current GPU can run.
//
// This file is compiled with the same -gencode list as the scan kernels (setup.py gives every .cu
// of the extension the same TORCH_CUDA_ARCH_LIST), so if the driver can load the probe kernel
// below for a device, it can load the scan kernels too. Torch-free: only the CUDA runtime.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

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
  explicit ScopedDevice(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~ScopedDevice() { cudaSetDevice(previous_); }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  static void check(cudaError_t status, const char* what) {
    if (status != cudaSuccess) {
      throw std::runtime_error(std::string("vmamba2d._C_cuda.kernel_image_available: ") + what +
                               " failed (" + describe(status) + ")");
    }
  }

 private:
  int previous_ = 0;
};

}  // namespace

bool kernel_image_available(int64_t device_index) {
  int count = 0;
  ScopedDevice::check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device_index < 0 || device_index >= count) {
    throw std::invalid_argument("kernel_image_available: device_index must be in [0, " +
                                std::to_string(count) + "), got " + std::to_string(device_index));
  }
  const ScopedDevice scoped(static_cast<int>(device_index));
  cudaFuncAttributes attributes{};
  const cudaError_t status = cudaFuncGetAttributes(&attributes, kernel_image_probe);
  if (status == cudaSuccess) return true;
  cudaGetLastError();  // the lookup error is not sticky, but leave no error pending for torch
  if (status == cudaErrorNoKernelImageForDevice || status == cudaErrorInvalidDeviceFunction) {
    return false;
  }
  ScopedDevice::check(status, "cudaFuncGetAttributes");
  return false;  // unreachable: check() throws
}

}  // namespace scan2d
}  // namespace vmamba2d
