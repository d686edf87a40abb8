// Python bindings of the CPU scan (the extension module vmamba2d._C_cpu, or its JIT build).
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "scan_2d_isa.h"
#include "scan_2d_ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "vmamba2d: 2D selective scan, CPU kernel (single-route and four-route forward and backward)";
  m.def("forward", &vmamba2d::cpu::forward, "2D selective scan forward -> y (batch, dim, L)",
        pybind11::arg("u"), pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"),
        pybind11::arg("D"), pybind11::arg("delta_bias"), pybind11::arg("delta_softplus"), pybind11::arg("height"),
        pybind11::arg("width"), pybind11::arg("out_fp32"));
  m.def(
      "openmp",
      [] {
#ifdef _OPENMP
        return true;
#else
        return false;
#endif
      },
      "Whether this build parallelises with OpenMP (without it at::parallel_for runs serially)");
  m.def(
      "isa", [] { return std::string(vmamba2d::cpu::best_channel_kernels<float>().isa); },
      "The instruction-set build of the kernel this CPU runs: 'avx512', 'avx2' or 'baseline'");
  m.def(
      "channel_lanes", [] { return vmamba2d::cpu::best_channel_kernels<float>().cross_forward_lanes != nullptr; },
      "Whether the four-route forward and backward run one channel per vector lane (float32 channels-last maps "
      "with delta_proj_weight; the AVX-512 build, unless VMAMBA2D_CPU_LANES=0) instead of one channel's plane at a "
      "time");
  m.def("backward", &vmamba2d::cpu::backward,
        "2D selective scan backward -> [du, ddelta, dA, dB, dC, dD or None, ddelta_bias or None]",
        pybind11::arg("u"), pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"),
        pybind11::arg("D"), pybind11::arg("delta_bias"), pybind11::arg("delta_softplus"), pybind11::arg("height"),
        pybind11::arg("width"), pybind11::arg("dy"));
  m.def("cross_forward", &vmamba2d::cpu::cross_forward,
        "Four-route 2D selective scan forward -> y (batch, dim, H, W), the routes' outputs summed in order "
        "(with delta_proj_weight (K, dim, R): delta is low-rank (batch, K, R, H, W), projected in the kernel)",
        pybind11::arg("u"), pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"),
        pybind11::arg("D"), pybind11::arg("delta_bias"), pybind11::arg("delta_softplus"), pybind11::arg("routes"),
        pybind11::arg("out_fp32"), pybind11::arg("delta_proj_weight") = pybind11::none());
  m.def("cross_backward", &vmamba2d::cpu::cross_backward,
        "Four-route 2D selective scan backward -> [du, ddelta, dA, dB, dC, dD or None, ddelta_bias or None] "
        "(with delta_proj_weight: ddelta of the low-rank delta, and ddelta_proj_weight appended)",
        pybind11::arg("u"), pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"),
        pybind11::arg("D"), pybind11::arg("delta_bias"), pybind11::arg("delta_softplus"), pybind11::arg("routes"),
        pybind11::arg("dy"), pybind11::arg("delta_proj_weight") = pybind11::none());
}
