// ATen-facing part of the 2D scan kernel, shared by the CUDA entry points and the host emulation:
// argument checks, the tiling plan, output / scratch allocation and the launch sequence.
// A Backend provides:
//   static constexpr bool kCuda;                       tensors must be CUDA (else CPU) tensors
//   static int backward_warps(int nstate);             warps per backward block
//   static void forward(const Params&, ElementType, int nwarps, size_t smem_bytes);
//   static void backward(const Params&, ElementType, int nwarps, size_t smem_bytes);
//   static void poison(at::Tensor&);                   fill never-read-before-written scratch
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "scan2d_common.h"

namespace vmamba2d {
namespace scan2d {

using OptTensor = std::optional<at::Tensor>;

inline ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ElementType::kFloat32;
    case at::kHalf:
      return ElementType::kFloat16;
    case at::kBFloat16:
      return ElementType::kBFloat16;
    default:
      TORCH_CHECK_TYPE(false, "selective_scan_2d (cuda kernel): u must be float32, float16 or "
                              "bfloat16, got ", t);
  }
  return ElementType::kFloat32;
}

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Per axis: a map extent larger than a tile is cut into tiles (scanned in order, with carries);
// an extent that fits into a tile is packed several times across it (maps of consecutive batch
// entries, one per segment). E.g. 7x7 maps: 4x4 maps per tile; 1xL maps: 32 maps stacked in the
// tile rows, the columns tiled along L.
inline void plan_axis(int64_t extent, int& pack, int& segment, int& tiles) {
  if (extent <= kTile) {
    pack = static_cast<int>(kTile / extent);
    segment = static_cast<int>(extent);
    tiles = 1;
  } else {
    pack = 1;
    segment = kTile;
    tiles = ceil_div(extent, kTile);
  }
}

inline Geometry plan_geometry(int64_t batch, int64_t dim, int64_t groups, int64_t nstate,
                              int64_t height, int64_t width) {
  Geometry g{};
  g.batch = static_cast<int>(batch);
  g.dim = static_cast<int>(dim);
  g.groups = static_cast<int>(groups);
  g.nstate = static_cast<int>(nstate);
  g.height = static_cast<int>(height);
  g.width = static_cast<int>(width);
  g.length = height * width;
  plan_axis(width, g.pack_cols, g.seg_w, g.tiles_w);
  plan_axis(height, g.pack_rows, g.seg_h, g.tiles_h);
  // No more maps per tile than the slot tables hold or the batch has.
  const int64_t batch_or_1 = std::max<int64_t>(batch, 1);
  g.pack_cols = static_cast<int>(std::min<int64_t>({g.pack_cols, kMaxPack, batch_or_1}));
  g.pack_rows = static_cast<int>(std::min<int64_t>(
      {g.pack_rows, kMaxPack / g.pack_cols, ceil_div(batch_or_1, g.pack_cols)}));
  g.batch_blocks = ceil_div(batch, static_cast<int64_t>(g.pack_rows) * g.pack_cols);
  return g;
}

inline int forward_warps(int nstate) { return std::min(kMaxWarps, nstate); }

template <class Backend>
void check_tensor(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.defined(), "selective_scan_2d (cuda kernel): ", name, " is undefined");
  TORCH_CHECK(t.is_contiguous(), "selective_scan_2d (cuda kernel): ", name, " must be contiguous");
  if (Backend::kCuda) {
    TORCH_CHECK(t.is_cuda(), "selective_scan_2d (cuda kernel): ", name, " must be a CUDA tensor, got ",
                t.device());
  } else {
    TORCH_CHECK(t.is_cpu(), "selective_scan_2d (emulation): ", name, " must be a CPU tensor, got ",
                t.device());
  }
  TORCH_CHECK(t.device() == like.device(), "selective_scan_2d (cuda kernel): ", name, " is on ",
              t.device(), " but u is on ", like.device());
}

inline void check_shape(const at::Tensor& t, const char* name, at::IntArrayRef expected) {
  TORCH_CHECK_VALUE(t.sizes() == expected, "selective_scan_2d (cuda kernel): ", name,
                    " must have shape ", expected, ", got ", t.sizes());
}

inline void check_dtype(const at::Tensor& t, const char* name, at::ScalarType expected) {
  TORCH_CHECK_TYPE(t.scalar_type() == expected, "selective_scan_2d (cuda kernel): ", name,
                   " must be ", expected, ", got ", t.scalar_type());
}

// Validates everything and returns the plan.
template <class Backend>
Geometry check_inputs(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                      const at::Tensor& B, const at::Tensor& C, const OptTensor& D,
                      const OptTensor& delta_bias, int64_t height, int64_t width) {
  check_tensor<Backend>(u, "u", u);
  TORCH_CHECK_VALUE(u.dim() == 3, "selective_scan_2d (cuda kernel): u must be (batch, dim, L), got ",
                    u.sizes());
  const int64_t batch = u.size(0), dim = u.size(1), length = u.size(2);
  TORCH_CHECK_VALUE(height >= 1 && width >= 1 && height * width == length,
                    "selective_scan_2d (cuda kernel): height * width must equal L = ", length,
                    ", got height=", height, " width=", width);
  TORCH_CHECK_VALUE(length < std::numeric_limits<int32_t>::max(),
                    "selective_scan_2d (cuda kernel): L = ", length, " is too large");
  element_type(u.scalar_type());
  check_tensor<Backend>(delta, "delta", u);
  check_shape(delta, "delta", u.sizes());
  check_dtype(delta, "delta", u.scalar_type());
  check_tensor<Backend>(A, "A", u);
  TORCH_CHECK_VALUE(A.dim() == 2 && A.size(0) == dim,
                    "selective_scan_2d (cuda kernel): A must be (dim, N), got ", A.sizes());
  check_dtype(A, "A", at::kFloat);
  const int64_t nstate = A.size(1);
  TORCH_CHECK_VALUE(nstate >= 1 && nstate <= kMaxState, "selective_scan_2d (cuda kernel): N = ",
                    nstate, " states, supported 1..", kMaxState);
  check_tensor<Backend>(B, "B", u);
  TORCH_CHECK_VALUE(B.dim() == 4, "selective_scan_2d (cuda kernel): B must be (batch, groups, N, L), got ",
                    B.sizes());
  const int64_t groups = B.size(1);
  TORCH_CHECK_VALUE(groups >= 1 && dim % groups == 0, "selective_scan_2d (cuda kernel): groups = ",
                    groups, " must divide dim = ", dim);
  check_shape(B, "B", {batch, groups, nstate, length});
  check_dtype(B, "B", u.scalar_type());
  check_tensor<Backend>(C, "C", u);
  check_shape(C, "C", {batch, groups, nstate, length});
  check_dtype(C, "C", u.scalar_type());
  if (D.has_value()) {
    check_tensor<Backend>(*D, "D", u);
    check_shape(*D, "D", {dim});
    check_dtype(*D, "D", at::kFloat);
  }
  if (delta_bias.has_value()) {
    check_tensor<Backend>(*delta_bias, "delta_bias", u);
    check_shape(*delta_bias, "delta_bias", {dim});
    check_dtype(*delta_bias, "delta_bias", at::kFloat);
  }
  const Geometry g = plan_geometry(batch, dim, groups, nstate, height, width);
  TORCH_CHECK_VALUE(dim <= 65535, "selective_scan_2d (cuda kernel): dim = ", dim,
                    " exceeds the grid limit 65535");
  return g;
}

inline Params base_params(const Geometry& g, const at::Tensor& u, const at::Tensor& delta,
                          const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                          const OptTensor& D, const OptTensor& delta_bias, bool softplus) {
  Params p{};
  p.g = g;
  p.softplus = softplus;
  p.u = u.data_ptr();
  p.delta = delta.data_ptr();
  p.B = B.data_ptr();
  p.C = C.data_ptr();
  p.A = A.data_ptr<float>();
  p.D = D.has_value() ? D->data_ptr<float>() : nullptr;
  p.delta_bias = delta_bias.has_value() ? delta_bias->data_ptr<float>() : nullptr;
  p.channels_per_block = 1;
  p.atomic_bc = true;
  return p;
}

inline at::Tensor fp32_scratch(int64_t numel, const at::Tensor& like) {
  return at::empty({numel}, like.options().dtype(at::kFloat));
}

// y = forward(...): (batch, dim, L), fp32 when out_fp32 else u's dtype.
template <class Backend>
at::Tensor forward_impl(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                        const at::Tensor& B, const at::Tensor& C, const OptTensor& D,
                        const OptTensor& delta_bias, bool softplus, int64_t height, int64_t width,
                        bool out_fp32) {
  const Geometry g = check_inputs<Backend>(u, delta, A, B, C, D, delta_bias, height, width);
  at::Tensor y = at::empty(u.sizes(), u.options().dtype(out_fp32 ? at::kFloat : u.scalar_type()));
  if (u.numel() == 0) return y;
  Backend::poison(y);
  Params p = base_params(g, u, delta, A, B, C, D, delta_bias, softplus);
  p.y = y.data_ptr();
  p.y_fp32 = y.scalar_type() == at::kFloat;
  at::Tensor carry_v;
  if (g.tiles_h > 1) {
    const int64_t blocks = static_cast<int64_t>(g.batch_blocks) * g.dim;
    carry_v = fp32_scratch(blocks * g.tiles_w * g.nstate * kTile, u);
    Backend::poison(carry_v);
    p.carry_v = carry_v.data_ptr<float>();
  }
  const int nwarps = forward_warps(g.nstate);
  Backend::forward(p, element_type(u.scalar_type()), nwarps,
                   smem_layout(false, nwarps, g.nstate).total);
  return y;
}

// [du, ddelta, dA, dB, dC, dD (undefined without D), ddelta_bias (undefined without it)].
// deterministic: one block per (batch block, group) walks the group's channels in order and owns
// its dB / dC entries (no atomics); otherwise one block per channel with fp32 atomics.
template <class Backend>
std::vector<at::Tensor> backward_impl(const at::Tensor& u, const at::Tensor& delta,
                                      const at::Tensor& A, const at::Tensor& B,
                                      const at::Tensor& C, const OptTensor& D,
                                      const OptTensor& delta_bias, bool softplus, int64_t height,
                                      int64_t width, const at::Tensor& dy, bool deterministic) {
  const Geometry g = check_inputs<Backend>(u, delta, A, B, C, D, delta_bias, height, width);
  check_tensor<Backend>(dy, "dy", u);
  check_shape(dy, "dy", u.sizes());
  TORCH_CHECK_TYPE(dy.scalar_type() == u.scalar_type() || dy.scalar_type() == at::kFloat,
                   "selective_scan_2d (cuda kernel): dy must be ", u.scalar_type(),
                   " or float32, got ", dy.scalar_type());
  const at::TensorOptions f32 = u.options().dtype(at::kFloat);
  at::Tensor dD = D.has_value() ? at::zeros({g.dim}, f32) : at::Tensor();
  at::Tensor ddb = delta_bias.has_value() ? at::zeros({g.dim}, f32) : at::Tensor();
  if (u.numel() == 0) {
    return {at::zeros_like(u), at::zeros_like(delta), at::zeros_like(A), at::zeros_like(B),
            at::zeros_like(C), dD, ddb};
  }
  at::Tensor du = at::empty_like(u);
  at::Tensor ddelta = at::empty_like(delta);
  Backend::poison(du);
  Backend::poison(ddelta);
  at::Tensor dB = at::zeros(B.sizes(), f32);
  at::Tensor dC = at::zeros(C.sizes(), f32);
  at::Tensor dA_part = at::empty({g.batch_blocks, g.dim, g.nstate}, f32);
  at::Tensor dD_part = at::empty({g.batch_blocks, g.dim}, f32);
  at::Tensor ddb_part = at::empty({g.batch_blocks, g.dim}, f32);
  Backend::poison(dA_part);
  Backend::poison(dD_part);
  Backend::poison(ddb_part);

  const ElementType type = element_type(u.scalar_type());
  Params p = base_params(g, u, delta, A, B, C, D, delta_bias, softplus);
  const int tiles = g.tiles_h * g.tiles_w;
  at::Tensor carry_v, carry_h, grad_carry_v;
  if (tiles > 1) {
    // Pass 1: the forward scan records the carries into every tile (no y).
    const int64_t blocks = static_cast<int64_t>(g.batch_blocks) * g.dim;
    carry_v = fp32_scratch(blocks * tiles * g.nstate * kTile, u);
    carry_h = fp32_scratch(blocks * tiles * g.nstate * kTile, u);
    grad_carry_v = fp32_scratch(blocks * g.tiles_w * g.nstate * kTile, u);
    Backend::poison(carry_v);
    Backend::poison(carry_h);
    Backend::poison(grad_carry_v);
    Params rec = p;
    rec.record = true;
    rec.carry_v = carry_v.data_ptr<float>();
    rec.carry_h = carry_h.data_ptr<float>();
    const int fwarps = forward_warps(g.nstate);
    Backend::forward(rec, type, fwarps, smem_layout(false, fwarps, g.nstate).total);
    p.carry_v = rec.carry_v;
    p.carry_h = rec.carry_h;
    p.grad_carry_v = grad_carry_v.data_ptr<float>();
  }
  // Pass 2: reverse scans.
  p.dy = dy.data_ptr();
  p.dy_fp32 = dy.scalar_type() == at::kFloat;
  p.du = du.data_ptr();
  p.ddelta = ddelta.data_ptr();
  p.dB = dB.data_ptr<float>();
  p.dC = dC.data_ptr<float>();
  p.dA_part = dA_part.data_ptr<float>();
  p.dD_part = dD_part.data_ptr<float>();
  p.ddb_part = ddb_part.data_ptr<float>();
  p.channels_per_block = deterministic ? g.dim / g.groups : 1;
  p.atomic_bc = !deterministic;
  const int nwarps = Backend::backward_warps(g.nstate);
  Backend::backward(p, type, nwarps, smem_layout(true, nwarps, g.nstate).total);

  at::Tensor dA = dA_part.sum(0);
  if (D.has_value()) dD = dD_part.sum(0);
  if (delta_bias.has_value()) ddb = ddb_part.sum(0);
  return {du, ddelta, dA, dB.to(B.scalar_type()), dC.to(C.scalar_type()), dD, ddb};
}

}  // namespace scan2d
}  // namespace vmamba2d
