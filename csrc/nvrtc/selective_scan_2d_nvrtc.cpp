// vmamba2d._C_nvrtc: the host side of the CUDA scan for the NVRTC-compiled kernels, built by the
// C++ compiler alone (no nvcc, no CUDA headers). The argument checks, the plan, the scratch
// buffers and the launch sequence are the nvcc build's (scan2d_driver.h / scan2d_routes.h); each
// launch goes to a Python callable (vmamba2d/ops/compiled/cuda_launch.py), which loads the kernel
// image NVRTC compiled and launches it on torch's current stream:
//   launch(kind, dtype, variant, grid, threads, smem, args)
//     kind "forward" / "backward" / "carry_scan"; dtype "fp32" / "fp16" / "bf16"; variant the
//     Variant's name; grid (x, y, z); threads per block; dynamic shared memory bytes; args the
//     kernel's parameters as bytes (Params, then CarryScan for the carry scan).
#include <c10/core/DeviceGuard.h>
#include <torch/extension.h>

#include <mutex>
#include <string>
#include <unordered_map>

#include "scan2d_driver.h"
#include "scan2d_launch_shape.h"
#include "scan2d_routes.h"

namespace vmamba2d {
namespace scan2d {
namespace {

std::mutex g_mutex;
pybind11::object* g_launch = nullptr;  // leaked on purpose: no Python call during interpreter exit
std::unordered_map<int, DeviceLimits> g_limits;

const char* dtype_name(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return "fp32";
    case ElementType::kFloat16:
      return "fp16";
    case ElementType::kBFloat16:
      return "bf16";
  }
  return "fp32";
}

template <class T>
pybind11::bytes as_bytes(const T& value) {
  return pybind11::bytes(reinterpret_cast<const char*>(&value), sizeof(T));
}

void launch(const char* kind, ElementType type, const LaunchShape& shape, pybind11::list args) {
  TORCH_CHECK(g_launch != nullptr, "vmamba2d._C_nvrtc: no launcher set (set_launcher)");
  (*g_launch)(kind, dtype_name(type), variant_name(shape.variant),
              pybind11::make_tuple(shape.grid[0], shape.grid[1], shape.grid[2]), shape.threads, shape.smem, args);
}

struct NvrtcBackend {
  static constexpr bool kCuda = true;

  static DeviceLimits limits(const at::Tensor& u) {
    const std::lock_guard<std::mutex> lock(g_mutex);
    const auto found = g_limits.find(u.get_device());
    TORCH_CHECK(found != g_limits.end(), "vmamba2d._C_nvrtc: no device limits for GPU ", u.get_device(),
                " (set_device_limits)");
    return found->second;
  }

  static void forward(const Params& p, ElementType type) {
    pybind11::list args;
    args.append(as_bytes(p));
    launch("forward", type, forward_shape(p), args);
  }

  static void carry_scan(const Params& p, const CarryScan& scan) {
    pybind11::list args;
    args.append(as_bytes(p));
    args.append(as_bytes(scan));
    launch("carry_scan", ElementType::kFloat32, carry_scan_shape(p, scan), args);
  }

  static void backward(const Params& p, ElementType type) {
    pybind11::list args;
    args.append(as_bytes(p));
    launch("backward", type, backward_shape(p), args);
  }

  static void poison(at::Tensor&) {}
};

void require_cuda(const at::Tensor& u) {
  TORCH_CHECK(u.is_cuda(), "vmamba2d._C_nvrtc: u must be a CUDA tensor, got ", u.device());
}

void set_launcher(pybind11::object launcher) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (g_launch == nullptr) g_launch = new pybind11::object();
  *g_launch = std::move(launcher);
}

void set_device_limits(int64_t device, int64_t sm_count, int64_t smem_per_block, int64_t smem_per_sm, int64_t arch,
                       int64_t reserved_smem_per_block) {
  TORCH_CHECK_VALUE(device >= 0 && sm_count >= 1 && smem_per_block >= 1 && smem_per_sm >= smem_per_block &&
                        arch >= 10 && reserved_smem_per_block >= 0,
                    "set_device_limits: need device >= 0, sm_count >= 1, smem_per_sm >= smem_per_block >= 1, "
                    "arch >= 10 (compute capability x 10) and reserved_smem_per_block >= 0");
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_limits[static_cast<int>(device)] =
      DeviceLimits{static_cast<int>(sm_count), static_cast<size_t>(smem_per_block), static_cast<size_t>(smem_per_sm),
                   static_cast<int>(arch), static_cast<size_t>(reserved_smem_per_block)};
}

std::vector<at::Tensor> forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                                const std::optional<at::Tensor>& delta_bias, bool delta_softplus, int64_t height,
                                int64_t width, bool out_fp32, bool save_carries) {
  require_cuda(u);
  const c10::DeviceGuard guard(u.device());
  return forward_impl<NvrtcBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_fp32,
                                    save_carries);
}

std::vector<at::Tensor> backward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                 const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                                 const std::optional<at::Tensor>& delta_bias, bool delta_softplus, int64_t height,
                                 int64_t width, const at::Tensor& dy, const at::Tensor& carry_h,
                                 const at::Tensor& carry_v) {
  require_cuda(u);
  const c10::DeviceGuard guard(u.device());
  return backward_impl<NvrtcBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy, carry_h,
                                     carry_v);
}

at::Tensor cross_forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
                         const at::Tensor& C, const std::optional<at::Tensor>& D,
                         const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                         const std::vector<int64_t>& routes, bool out_fp32) {
  require_cuda(u);
  const c10::DeviceGuard guard(u.device());
  return cross_forward_impl<NvrtcBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32);
}

std::vector<at::Tensor> cross_backward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                       const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                                       const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                       const std::vector<int64_t>& routes, const at::Tensor& dy) {
  require_cuda(u);
  const c10::DeviceGuard guard(u.device());
  return cross_backward_impl<NvrtcBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy);
}

// The launch shapes of a plan, for the tests of the Python launcher: what forward_shape /
// backward_shape give for the main (sequential or final) pass of the planned launch.
pybind11::dict launch_shapes(int64_t batch, int64_t dim, int64_t groups, int64_t nstate, int64_t height,
                             int64_t width, int64_t device) {
  Geometry g = plan_geometry(batch, dim, groups, nstate, height, width);
  DeviceLimits dev{};
  {
    const std::lock_guard<std::mutex> lock(g_mutex);
    const auto found = g_limits.find(static_cast<int>(device));
    TORCH_CHECK(found != g_limits.end(), "launch_shapes: no device limits for GPU ", device);
    dev = found->second;
  }
  Params p{};
  p.g = g;
  p.k = plan_launch(g, dev);
  pybind11::dict d;
  for (const bool fwd : {true, false}) {
    p.pass = (fwd ? p.k.tile_parallel : p.k.bwd_tile_parallel) ? kFinal : kSequential;
    const LaunchShape s = fwd ? forward_shape(p) : backward_shape(p);
    d[fwd ? "forward" : "backward"] = pybind11::make_tuple(pybind11::make_tuple(s.grid[0], s.grid[1], s.grid[2]),
                                                           s.threads, s.smem, variant_name(s.variant));
  }
  d["params_bytes"] = sizeof(Params);
  d["carry_scan_bytes"] = sizeof(CarryScan);
  return d;
}

}  // namespace
}  // namespace scan2d
}  // namespace vmamba2d

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace s = vmamba2d::scan2d;
  m.def("set_launcher", &s::set_launcher, "the Python callable every kernel launch goes to");
  m.def("set_device_limits", &s::set_device_limits, "SM count and shared memory of a GPU, for the planner");
  m.def("forward", &s::forward, "2D selective scan forward (NVRTC kernels)");
  m.def("backward", &s::backward, "2D selective scan backward (NVRTC kernels)");
  m.def("cross_forward", &s::cross_forward, "four-route 2D selective scan forward (NVRTC kernels)");
  m.def("cross_backward", &s::cross_backward, "four-route 2D selective scan backward (NVRTC kernels)");
  m.def("launch_shapes", &s::launch_shapes, "grid / threads / smem / variant of a plan's main passes");
}
