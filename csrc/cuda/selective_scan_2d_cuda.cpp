// vmamba2d._C_cuda: the CUDA 2D selective scan (same functions as vmamba2d._C_cpu, plus the saved
// tile carries) and the host emulation of the same kernel code used by the GPU-less tests.
// Only c10/cuda and the CUDA runtime headers are used on the host side (not ATen/cuda, which
// needs the cuBLAS / cuSPARSE headers that a minimal toolkit does not ship).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/extension.h>

#include <mutex>
#include <unordered_map>

#include "scan2d_driver.h"
#include "scan2d_emulation_bindings.h"
#include "scan2d_launch.h"
#include "scan2d_routes.h"

namespace vmamba2d {
namespace scan2d {
namespace {

// Device attributes and the kernels' shared-memory opt-in, done once per device (not per call).
DeviceLimits device_limits(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, DeviceLimits> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find(device);
  if (found != cache.end()) return found->second;
  int sms = 0, optin = 0, per_sm = 0, reserved = 0, arch = 0;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));  // forward_kernel_arch asks it
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  C10_CUDA_CHECK(allow_shared_memory(static_cast<size_t>(optin)));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
  C10_CUDA_CHECK(forward_kernel_arch(&arch));
  const DeviceLimits limits{sms, static_cast<size_t>(optin), static_cast<size_t>(per_sm), arch,
                            static_cast<size_t>(reserved)};
  cache.emplace(device, limits);
  return limits;
}

struct CudaBackend {
  static constexpr bool kCuda = true;

  static DeviceLimits limits(const at::Tensor& u) { return device_limits(u.get_device()); }

  static void forward(const Params& p, ElementType type) {
    C10_CUDA_CHECK(launch_forward(p, type, c10::cuda::getCurrentCUDAStream().stream()));
  }

  static void carry_scan(const Params& p, const CarryScan& scan) {
    C10_CUDA_CHECK(launch_carry_scan(p, scan, c10::cuda::getCurrentCUDAStream().stream()));
  }

  static void backward(const Params& p, ElementType type) {
    C10_CUDA_CHECK(launch_backward(p, type, c10::cuda::getCurrentCUDAStream().stream()));
  }

  static void poison(at::Tensor&) {}
};

void require_cuda(const at::Tensor& u) {
  TORCH_CHECK(u.is_cuda(), "vmamba2d._C_cuda: u must be a CUDA tensor, got ", u.device());
}

std::vector<at::Tensor> forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                const at::Tensor& B, const at::Tensor& C,
                                const std::optional<at::Tensor>& D,
                                const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                int64_t height, int64_t width, bool out_fp32, bool save_carries) {
  require_cuda(u);
  const c10::cuda::CUDAGuard guard(u.device());
  return forward_impl<CudaBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width,
                                   out_fp32, save_carries);
}

std::vector<at::Tensor> backward(const at::Tensor& u, const at::Tensor& delta,
                                 const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                                 const std::optional<at::Tensor>& D,
                                 const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                 int64_t height, int64_t width, const at::Tensor& dy,
                                 const at::Tensor& carry_h, const at::Tensor& carry_v) {
  require_cuda(u);
  const c10::cuda::CUDAGuard guard(u.device());
  return backward_impl<CudaBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, height,
                                    width, dy, carry_h, carry_v);
}

at::Tensor cross_forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                         const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                         const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                         const std::vector<int64_t>& routes, bool out_fp32) {
  require_cuda(u);
  const c10::cuda::CUDAGuard guard(u.device());
  return cross_forward_impl<CudaBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32);
}

std::vector<at::Tensor> cross_backward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                       const at::Tensor& B, const at::Tensor& C,
                                       const std::optional<at::Tensor>& D,
                                       const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                       const std::vector<int64_t>& routes, const at::Tensor& dy) {
  require_cuda(u);
  const c10::cuda::CUDAGuard guard(u.device());
  return cross_backward_impl<CudaBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy);
}

}  // namespace
}  // namespace scan2d
}  // namespace vmamba2d

namespace vmamba2d::scan2d {
bool kernel_image_available(int64_t device_index);  // scan2d_probe.cu
}  // namespace vmamba2d::scan2d

namespace {
int64_t kernel_image_arch_entry(int64_t device_index) {
  TORCH_CHECK_VALUE(device_index >= 0 && device_index < c10::cuda::device_count(),
                    "kernel_image_arch: device_index must be in [0, ", static_cast<int>(c10::cuda::device_count()),
                    "), got ", device_index);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  int arch = 0;
  C10_CUDA_CHECK(vmamba2d::scan2d::forward_kernel_arch(&arch));
  return arch;
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using namespace vmamba2d::scan2d;
  m.doc() = "2D selective scan (2DMamba) CUDA kernel v2: tiled forward and backward.";
  m.def("forward", &forward,
        "forward(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_fp32,\n"
        "        save_carries) -> [y, carry_h, carry_v]\n"
        "u, delta: (batch, dim, L) fp32/fp16/bf16 CUDA, contiguous; A: (dim, N) fp32, N <= 64;\n"
        "B, C: (batch, groups, N, L) in u's dtype; D, delta_bias: (dim,) fp32 or None.\n"
        "y (batch, dim, L), fp32 if out_fp32 else u's dtype. With save_carries, carry_h / carry_v\n"
        "are the tile carries (flat fp32) that backward takes instead of re-running the forward;\n"
        "empty otherwise or when a map fits into one tile.",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("height"), py::arg("width"),
        py::arg("out_fp32"), py::arg("save_carries"));
  m.def("backward", &backward,
        "backward(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy, carry_h,\n"
        "         carry_v) -> [du, ddelta, dA, dB, dC, dD, ddelta_bias]\n"
        "dy: (batch, dim, L) in u's dtype or fp32; carry_h / carry_v: forward(save_carries=True)'s\n"
        "carries, or empty tensors (then the backward records them itself). du, ddelta, dB, dC in\n"
        "the inputs' dtype; dA, dD, ddelta_bias fp32 (dD / ddelta_bias undefined when D /\n"
        "delta_bias is None). Deterministic: dB / dC are reduced without atomics in a fixed order.",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("height"), py::arg("width"),
        py::arg("dy"), py::arg("carry_h"), py::arg("carry_v"));
  m.def("cross_forward", &cross_forward,
        "cross_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32) -> y\n"
        "The four-route op (vmamba2d/ops/compiled/cross_ops.py), every route scanned in place: u (batch, dim,\n"
        "H, W) contiguous or channels-last; delta (batch, K, dim, H, W), B / C (batch, K, N, H, W) in\n"
        "u's dtype (fp32 / fp16 / bf16), contiguous; A (K * dim, N), D / delta_bias (K * dim,) fp32;\n"
        "routes: K route codes. y (batch, dim, H, W) in u's layout, the routes' outputs summed in route\n"
        "order in fp32; fp32 if out_fp32 else u's dtype.",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("routes"), py::arg("out_fp32"));
  m.def("cross_backward", &cross_backward,
        "cross_backward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy)\n"
        "    -> [du, ddelta, dA, dB, dC, dD, ddelta_bias]\n"
        "dy (batch, dim, H, W) in u's dtype or fp32. Each gradient in its input's shape and dtype (du in\n"
        "u's layout); dA, dD, ddelta_bias fp32, dD / ddelta_bias None when D / delta_bias is None.\n"
        "Deterministic: no atomics, fixed-order sums.",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("routes"), py::arg("dy"));
  m.def("kernel_image_available", &kernel_image_available,
        "kernel_image_available(device_index) -> bool: whether this build holds a kernel image "
        "GPU device_index can run (False: rebuild with its arch in TORCH_CUDA_ARCH_LIST).",
        py::arg("device_index"));
  m.def("kernel_image_arch", &kernel_image_arch_entry,
        "kernel_image_arch(device_index) -> int: compute capability x 10 of the kernel code this build "
        "runs on GPU device_index (the launch plan follows it: below 80 and 86 .. 89 the forward keeps its "
        "carries in registers).",
        py::arg("device_index"));
  define_emulation_bindings(m);
}
