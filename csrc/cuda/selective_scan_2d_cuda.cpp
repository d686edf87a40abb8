// vmamba2d._C_cuda: the CUDA 2D selective scan (same functions as vmamba2d._C_cpu) plus the host
// emulation of the same kernel code used by the GPU-less tests.
// Only c10/cuda and the CUDA runtime headers are used on the host side (not ATen/cuda, which
// needs the cuBLAS / cuSPARSE headers that a minimal toolkit does not ship).
#include <ATen/Context.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/extension.h>

#include <cstdlib>
#include <cstring>

#include "scan2d_driver.h"
#include "scan2d_emulate.h"
#include "scan2d_launch.h"

namespace vmamba2d {
namespace scan2d {
namespace {

struct CudaBackend {
  static constexpr bool kCuda = true;

  // As many warps (<= kMaxWarps, <= N) as the device's opt-in shared memory allows.
  static int backward_warps(int nstate) {
    int device = 0;
    int optin = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const size_t limit = static_cast<size_t>(optin);
    int nwarps = std::min(kMaxWarps, nstate);
    while (nwarps > 1 && smem_layout(true, nwarps, nstate).total > limit) --nwarps;
    TORCH_CHECK(smem_layout(true, nwarps, nstate).total <= limit,
                "selective_scan_2d (cuda kernel): N = ", nstate, " needs ",
                smem_layout(true, nwarps, nstate).total, " bytes of shared memory, device allows ",
                limit);
    return nwarps;
  }

  static void forward(const Params& p, ElementType type, int nwarps, size_t smem_bytes) {
    launch_forward(p, type, nwarps, smem_bytes, c10::cuda::getCurrentCUDAStream().stream());
  }

  static void backward(const Params& p, ElementType type, int nwarps, size_t smem_bytes) {
    launch_backward(p, type, nwarps, smem_bytes, c10::cuda::getCurrentCUDAStream().stream());
  }

  static void poison(at::Tensor&) {}
};

void require_cuda(const at::Tensor& u) {
  TORCH_CHECK(u.is_cuda(), "vmamba2d._C_cuda: u must be a CUDA tensor, got ", u.device());
}

// torch.use_deterministic_algorithms(True) or VMAMBA2D_DETERMINISTIC=1.
bool deterministic_requested() {
  const char* env = std::getenv("VMAMBA2D_DETERMINISTIC");
  return at::globalContext().deterministicAlgorithms() || (env != nullptr && std::strcmp(env, "1") == 0);
}

at::Tensor forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                   const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                   const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                   int64_t height, int64_t width, bool out_fp32) {
  require_cuda(u);
  const c10::cuda::CUDAGuard guard(u.device());
  return forward_impl<CudaBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width,
                                   out_fp32);
}

std::vector<at::Tensor> backward(const at::Tensor& u, const at::Tensor& delta,
                                 const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                                 const std::optional<at::Tensor>& D,
                                 const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                 int64_t height, int64_t width, const at::Tensor& dy) {
  require_cuda(u);
  const c10::cuda::CUDAGuard guard(u.device());
  return backward_impl<CudaBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, height,
                                    width, dy, deterministic_requested());
}

}  // namespace
}  // namespace scan2d
}  // namespace vmamba2d

namespace vmamba2d::scan2d {
bool kernel_image_available(int64_t device_index);  // scan2d_probe.cu
}  // namespace vmamba2d::scan2d

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using namespace vmamba2d::scan2d;
  m.doc() = "2D selective scan (2DMamba) CUDA kernel: tiled forward and backward.";
  m.def("forward", &forward,
        "forward(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_fp32) -> y\n"
        "u, delta: (batch, dim, L) fp32/fp16/bf16 CUDA, contiguous; A: (dim, N) fp32, N <= 64;\n"
        "B, C: (batch, groups, N, L) in u's dtype; D, delta_bias: (dim,) fp32 or None.\n"
        "Returns y (batch, dim, L), fp32 if out_fp32 else u's dtype.",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("height"), py::arg("width"),
        py::arg("out_fp32"));
  m.def("backward", &backward,
        "backward(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy)\n"
        "  -> [du, ddelta, dA, dB, dC, dD, ddelta_bias]\n"
        "dy: (batch, dim, L) in u's dtype or fp32. du, ddelta, dB, dC in the inputs' dtype;\n"
        "dA, dD, ddelta_bias fp32 (dD / ddelta_bias undefined when D / delta_bias is None).\n"
        "dB / dC use fp32 atomics unless torch.use_deterministic_algorithms(True) or\n"
        "VMAMBA2D_DETERMINISTIC=1, which makes them bitwise reproducible.",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("height"), py::arg("width"),
        py::arg("dy"));
  m.def("kernel_image_available", &kernel_image_available,
        "kernel_image_available(device_index) -> bool: whether this build holds a kernel image "
        "GPU device_index can run (False: rebuild with its arch in TORCH_CUDA_ARCH_LIST).",
        py::arg("device_index"));
  m.def("_emulate_forward", &emulate_forward,
        "The CUDA forward kernel's code run on the CPU (CPU tensors; for tests). Same arguments "
        "as forward.",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("height"), py::arg("width"),
        py::arg("out_fp32"));
  m.def("_emulate_backward", &emulate_backward,
        "The CUDA backward kernel's code run on the CPU (CPU tensors; for tests). Same arguments "
        "as backward plus `deterministic` (the group-ordered dB / dC path).",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("height"), py::arg("width"),
        py::arg("dy"), py::arg("deterministic"));
}
