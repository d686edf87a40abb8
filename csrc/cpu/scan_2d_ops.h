// The CPU scan's tensor-level entry points (bound to Python in scan_2d_bindings.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace vmamba2d {
namespace cpu {

// Single-route 2D scan (scan_2d_cpu.cpp): u, delta (batch, dim, L); A (dim, N);
// B, C (batch, groups, N, L); D, delta_bias (dim,) or None; L = height * width.
at::Tensor forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
                   const at::Tensor& C, const std::optional<at::Tensor>& D,
                   const std::optional<at::Tensor>& delta_bias, bool delta_softplus, int64_t height, int64_t width,
                   bool out_fp32);
std::vector<std::optional<at::Tensor>> backward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                                const at::Tensor& B, const at::Tensor& C,
                                                const std::optional<at::Tensor>& D,
                                                const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                                int64_t height, int64_t width, const at::Tensor& dy);

// Four-route scan (scan_2d_cross_cpu.cpp): u (batch, dim, H, W); delta (batch, K, dim, H, W);
// A (K * dim, N); B, C (batch, K, N, H, W); D, delta_bias (K * dim,) or None; routes: K route codes.
// With delta_proj_weight (K, dim, R), delta is low-rank (batch, K, R, H, W) and projected in the
// kernel; the backward's ddelta is then the full-rank (batch, K, dim, H, W) gradient.
at::Tensor cross_forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
                         const at::Tensor& C, const std::optional<at::Tensor>& D,
                         const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                         const std::vector<int64_t>& routes, bool out_fp32,
                         const std::optional<at::Tensor>& delta_proj_weight);
std::vector<std::optional<at::Tensor>> cross_backward(const at::Tensor& u, const at::Tensor& delta,
                                                      const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                                                      const std::optional<at::Tensor>& D,
                                                      const std::optional<at::Tensor>& delta_bias,
                                                      bool delta_softplus, const std::vector<int64_t>& routes,
                                                      const at::Tensor& dy,
                                                      const std::optional<at::Tensor>& delta_proj_weight);

}  // namespace cpu
}  // namespace vmamba2d
