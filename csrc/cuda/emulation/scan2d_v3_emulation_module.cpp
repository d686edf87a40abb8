// Test-only extension: the v3 CUDA kernels' host emulation, race detector and launch planner,
// built by the C++ compiler alone (tests/support/cuda_emulation_build.py), so the CPU tests need no nvcc.
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include "scan2d_emulation_bindings.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Host emulation of the 2D selective scan CUDA kernels (v3), for tests.";
  vmamba2d::scan2d::define_emulation_bindings(m);
}
