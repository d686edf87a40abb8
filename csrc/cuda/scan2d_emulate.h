// Host emulation of the CUDA kernel (selective_scan_2d_emulate.cpp): the same block code run
// thread by thread on the CPU, for testing the kernel's logic on machines without a GPU.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace vmamba2d {
namespace scan2d {

at::Tensor emulate_forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                           const at::Tensor& B, const at::Tensor& C,
                           const std::optional<at::Tensor>& D,
                           const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                           int64_t height, int64_t width, bool out_fp32);

std::vector<at::Tensor> emulate_backward(const at::Tensor& u, const at::Tensor& delta,
                                         const at::Tensor& A, const at::Tensor& B,
                                         const at::Tensor& C, const std::optional<at::Tensor>& D,
                                         const std::optional<at::Tensor>& delta_bias,
                                         bool delta_softplus, int64_t height, int64_t width,
                                         const at::Tensor& dy, bool deterministic);

}  // namespace scan2d
}  // namespace vmamba2d
