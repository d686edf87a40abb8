// ATen-facing part of the four-route op (vmamba2d/ops/compiled/cross_ops.py) on the tiled kernel, shared
// by the CUDA entry points and the host emulation:
//   cross_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32) -> y
//   cross_backward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy)
//       -> [du, ddelta, dA, dB, dC, dD, ddelta_bias]
// Shapes as the CPU extension's: u (batch, dim, H, W); delta (batch, K, dim, H, W); A (K * dim, N);
// B / C (batch, K, N, H, W); D / delta_bias (K * dim,); y / du / dy (batch, dim, H, W); routes: K
// route codes (vmamba2d/ops/routes.py). One launch per route, in route order on one stream, of the
// route variant (Variant::kRoute): the kernel scans the route's grid exactly as the single-route
// kernel scans a map and only its global addressing maps route positions to map positions
// (RouteAddressing), so no route-order copy of u, delta, B, C, y or du is made. y and du are fp32
// sums over the routes: the first route stores every cell, each later one adds its value to the
// cell (one thread owns a cell in a launch, launches run in order: bitwise deterministic).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "scan2d_driver.h"

namespace vmamba2d {
namespace scan2d {

struct CrossShape {
  int64_t batch, dim, routes, nstate, height, width;
  int64_t length() const { return height * width; }
};

// Route code bits (vmamba2d/ops/routes.py: Route.code).
constexpr int64_t kRouteFromRight = 1;
constexpr int64_t kRouteFromBottom = 2;
constexpr int64_t kRouteColumnsFirst = 4;
constexpr int64_t kRouteFlat = 8;

template <class Backend>
CrossShape check_cross_inputs(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                              const at::Tensor& B, const at::Tensor& C, const OptTensor& D,
                              const OptTensor& delta_bias, const std::vector<int64_t>& routes) {
  const char* op = "cross_selective_scan_2d (cuda kernel): ";
  TORCH_CHECK_VALUE(!routes.empty(), op, "routes must name at least one route");
  for (const int64_t code : routes) {
    TORCH_CHECK_VALUE(code >= 0 && code < 16, op, "routes must be route codes in [0, 16), got ", code);
  }
  TORCH_CHECK_VALUE(u.defined() && u.dim() == 4, op, "u must be (batch, dim, H, W), got ",
                    u.defined() ? u.sizes() : at::IntArrayRef{});
  const int64_t K = static_cast<int64_t>(routes.size());
  TORCH_CHECK_VALUE(A.defined() && A.dim() == 2, op, "A must be (routes * dim, N), got ",
                    A.defined() ? A.sizes() : at::IntArrayRef{});
  const CrossShape s{u.size(0), u.size(1), K, A.size(1), u.size(2), u.size(3)};
  TORCH_CHECK_VALUE(s.height >= 1 && s.width >= 1, op, "u's map must not be empty, got ", u.sizes());
  TORCH_CHECK_VALUE(s.length() < std::numeric_limits<int32_t>::max(), op, "u's map must have H * W < 2^31 - 1 "
                    "cells, got H * W = ", s.length());
  // u: contiguous here (the entry points make a channels-last u contiguous).
  check_tensor<Backend>(u, "u", u);
  element_type(u.scalar_type());
  check_tensor<Backend>(delta, "delta", u);
  check_shape(delta, "delta", {s.batch, K, s.dim, s.height, s.width});
  check_dtype(delta, "delta", u.scalar_type());
  check_tensor<Backend>(A, "A", u);
  check_shape(A, "A", {K * s.dim, s.nstate});
  check_dtype(A, "A", at::kFloat);
  TORCH_CHECK_VALUE(s.nstate >= 1 && s.nstate <= kMaxState, op, "N = ", s.nstate, " states, supported 1..",
                    kMaxState);
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{B, "B"}, {C, "C"}}) {
    check_tensor<Backend>(t, name, u);
    check_shape(t, name, {s.batch, K, s.nstate, s.height, s.width});
    check_dtype(t, name, u.scalar_type());
  }
  for (const auto& [t, name] : {std::pair<const OptTensor&, const char*>{D, "D"}, {delta_bias, "delta_bias"}}) {
    if (!t.has_value()) continue;
    check_tensor<Backend>(*t, name, u);
    check_shape(*t, name, {K * s.dim});
    check_dtype(*t, name, at::kFloat);
  }
  TORCH_CHECK_VALUE(s.batch <= std::numeric_limits<int32_t>::max() && s.dim <= 65535, op,
                    "u's batch must be < 2^31 and its dim <= 65535 (the launch grid's limits), got batch = ", s.batch,
                    ", dim = ", s.dim);
  return s;
}

// The addressing of route `code` on an H x W map (RouteAddressing in scan2d_common.h).
inline RouteAddressing route_addressing(const CrossShape& s, int64_t code, bool accumulate) {
  RouteAddressing r{};
  r.active = true;
  r.columns_first = (code & kRouteColumnsFirst) != 0;
  r.from_bottom = (code & kRouteFromBottom) != 0;
  r.from_right = (code & kRouteFromRight) != 0;
  r.reversed = r.from_bottom && r.from_right && !r.columns_first;
  r.linear = !r.columns_first && r.from_bottom == r.from_right;
  r.accumulate = accumulate;
  r.map_h = static_cast<int>(s.height);
  r.map_w = static_cast<int>(s.width);
  r.inner = static_cast<uint32_t>(r.columns_first ? s.height : s.width);
  // p / inner = (p * magic) >> (32 + l) for p < 2^31 with 2^l >= inner and magic =
  // ceil(2^(32 + l) / inner): the rounding error of magic moves p * magic / 2^(32 + l) by less than
  // 1 / inner, so the floor is exact (and p * magic < 2^31 * 2^33 fits into 64 bits).
  int l = 0;
  while ((uint64_t{1} << l) < r.inner) ++l;
  r.shift = 32 + l;
  r.magic = ((uint64_t{1} << r.shift) + r.inner - 1) / r.inner;
  r.delta_planes = s.routes * s.dim;
  r.bc_planes = s.routes * s.nstate;
  return r;
}

// The grid route `code` scans (Route.grid): (1, H * W) flat, (W, H) columns first, else (H, W).
inline std::pair<int64_t, int64_t> route_grid(const CrossShape& s, int64_t code) {
  if (code & kRouteFlat) return {1, s.length()};
  if (code & kRouteColumnsFirst) return {s.width, s.height};
  return {s.height, s.width};
}

// The launch of route k: its geometry and plan, and the inputs at the route's first plane / row.
template <class Backend>
Params route_params(const CrossShape& s, const std::vector<int64_t>& routes, int64_t k, const at::Tensor& u,
                    const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                    const OptTensor& D, const OptTensor& delta_bias, bool softplus) {
  const auto [rows, cols] = route_grid(s, routes[k]);
  Geometry g = plan_geometry(s.batch, s.dim, 1, s.nstate, rows, cols);
  g.route = route_addressing(s, routes[k], k > 0);
  const auto rows_of = [&](const OptTensor& t) -> OptTensor {
    return t.has_value() ? OptTensor(t->narrow(0, k * s.dim, s.dim)) : std::nullopt;
  };
  return base_params(g, plan_launch(g, Backend::limits(u)), u, delta.select(1, k), A.narrow(0, k * s.dim, s.dim),
                     B.select(1, k), C.select(1, k), rows_of(D), rows_of(delta_bias), softplus);
}

// y (batch, dim, H, W): fp32 if out_fp32 else u's dtype, in u's layout (a channels-last u is read
// through one contiguous copy and y written back channels-last).
template <class Backend>
at::Tensor cross_forward_impl(const at::Tensor& u_in, const at::Tensor& delta, const at::Tensor& A,
                              const at::Tensor& B, const at::Tensor& C, const OptTensor& D,
                              const OptTensor& delta_bias, bool softplus, const std::vector<int64_t>& routes,
                              bool out_fp32) {
  const at::Tensor u = u_in.contiguous();
  const CrossShape s = check_cross_inputs<Backend>(u, delta, A, B, C, D, delta_bias, routes);
  at::Tensor y = at::empty(u.sizes(), u.options().dtype(at::kFloat));
  if (u.numel() > 0) {
    Backend::poison(y);
    const ElementType type = element_type(u.scalar_type());
    for (int64_t k = 0; k < s.routes; ++k) {
      Params p = route_params<Backend>(s, routes, k, u, delta, A, B, C, D, delta_bias, softplus);
      p.y = y.data_ptr();
      p.y_fp32 = true;
      run_forward<Backend>(p, type, u, false);
    }
  }
  if (!out_fp32) y = y.to(u.scalar_type());
  return y.contiguous(u_in.suggest_memory_format());
}

// [du, ddelta, dA, dB, dC, dD (undefined without D), ddelta_bias (undefined without it)], each in
// its input's dtype and shape (du in u's layout); dy (batch, dim, H, W) in u's dtype or fp32.
// Device buffers beyond the outputs: an fp32 du, fp32 dB / dC partials, an fp32 copy of a
// 2-byte dy and, for maps of several tiles or 2-byte inputs at N = 1, an fp32 scratch map of u's
// size (the y of the forwards that record the carries, then the backward's parked dt).
template <class Backend>
std::vector<at::Tensor> cross_backward_impl(const at::Tensor& u_in, const at::Tensor& delta, const at::Tensor& A,
                                            const at::Tensor& B, const at::Tensor& C, const OptTensor& D,
                                            const OptTensor& delta_bias, bool softplus,
                                            const std::vector<int64_t>& routes, const at::Tensor& dy_in) {
  const at::Tensor u = u_in.contiguous();
  const CrossShape s = check_cross_inputs<Backend>(u, delta, A, B, C, D, delta_bias, routes);
  TORCH_CHECK_TYPE(dy_in.scalar_type() == u.scalar_type() || dy_in.scalar_type() == at::kFloat,
                   "cross_selective_scan_2d (cuda kernel): dy must be ", u.scalar_type(), " or float32, got ",
                   dy_in.scalar_type());
  // The route backward reads dy as fp32 (one copy of its block phases instead of one per dy type:
  // a third of its compile time): a 2-byte dy is widened once here.
  const at::Tensor dy = dy_in.to(at::kFloat).contiguous();
  check_tensor<Backend>(dy, "dy", u);
  check_shape(dy, "dy", u.sizes());
  const at::TensorOptions f32 = u.options().dtype(at::kFloat);
  at::Tensor du = at::empty(u.sizes(), f32);
  at::Tensor ddelta = at::empty_like(delta);
  at::Tensor dA = at::empty({s.routes * s.dim, s.nstate}, f32);
  at::Tensor dD = D.has_value() ? at::empty({s.routes * s.dim}, f32) : at::Tensor();
  at::Tensor ddb = delta_bias.has_value() ? at::empty({s.routes * s.dim}, f32) : at::Tensor();
  if (u.numel() == 0) {
    for (at::Tensor* t : {&du, &ddelta, &dA, &dD, &ddb}) {
      if (t->defined()) t->zero_();
    }
    return {du.to(u.scalar_type()), ddelta, dA, at::zeros_like(B), at::zeros_like(C), dD, ddb};
  }
  Backend::poison(du);
  Backend::poison(ddelta);
  const ElementType type = element_type(u.scalar_type());
  std::vector<Params> launches;
  int64_t slices = 1;
  for (int64_t k = 0; k < s.routes; ++k) {
    launches.push_back(route_params<Backend>(s, routes, k, u, delta, A, B, C, D, delta_bias, softplus));
    slices = std::max<int64_t>(slices, launches.back().k.slices);
  }
  // dB / dC partials [slices][batch][routes][N][L], in map order; route k adds into its planes of
  // its own slices' partials (the slices it does not have stay 0), summed in slice order below.
  at::Tensor dB_part = at::zeros({slices, s.batch, s.routes, s.nstate, s.length()}, f32);
  at::Tensor dC_part = at::zeros({slices, s.batch, s.routes, s.nstate, s.length()}, f32);
  // Route k's recording forward writes its (unused) y into the scratch map, then route k's backward
  // parks each cell's dt there (2-byte inputs at N = 1: the route's ddelta cells are too narrow,
  // move_route_dt); launches run in order, so each use ends before the next begins.
  const bool parks_in_scratch = s.nstate == 1 && type != ElementType::kFloat32;
  at::Tensor scratch;
  for (int64_t k = 0; k < s.routes; ++k) {
    Params& p = launches[static_cast<size_t>(k)];
    const Geometry& g = p.g;
    const int tiles = g.tiles_h * g.tiles_w;
    if ((tiles > 1 || parks_in_scratch) && !scratch.defined()) scratch = fp32_scratch(u.numel(), u);
    std::vector<at::Tensor> carries;
    if (tiles > 1) {
      Params fp = p;
      fp.g.route.accumulate = false;
      fp.y = scratch.data_ptr();
      fp.y_fp32 = true;
      carries = run_forward<Backend>(fp, type, u, true);
      p.carry_h = carries[0].data_ptr<float>();
      p.carry_v = carries[1].data_ptr<float>();
    }
    at::Tensor grad_carry_v;
    if (tiles > 1) {
      grad_carry_v = fp32_scratch(grad_carry_numel(g), u);
      Backend::poison(grad_carry_v);
      p.grad_carry_v = grad_carry_v.data_ptr<float>();
    }
    // Per-block partials of the route's dA / dD / ddelta_bias rows, as in backward_impl.
    const int64_t part_rows = (p.k.bwd_tile_parallel ? tiles : 1) * g.batch_blocks;
    at::Tensor dA_part = at::empty({part_rows, s.dim, s.nstate}, f32);
    at::Tensor dD_part = at::empty({part_rows, s.dim}, f32);
    at::Tensor ddb_part = at::empty({part_rows, s.dim}, f32);
    for (at::Tensor* t : {&dA_part, &dD_part, &ddb_part}) Backend::poison(*t);
    p.dy = dy.data_ptr();
    p.dy_fp32 = dy.scalar_type() == at::kFloat;
    p.du = du.data_ptr();
    p.ddelta = ddelta.select(1, k).data_ptr();
    p.dt_park = parks_in_scratch ? scratch.data_ptr<float>() : nullptr;
    p.dB_part = dB_part.data_ptr<float>() + k * s.nstate * s.length();
    p.dC_part = dC_part.data_ptr<float>() + k * s.nstate * s.length();
    p.dA_part = dA_part.data_ptr<float>();
    p.dD_part = dD_part.data_ptr<float>();
    p.ddb_part = ddb_part.data_ptr<float>();
    run_backward<Backend>(p, type, u);
    // Fixed-order reductions: bitwise reproducible.
    dA.narrow(0, k * s.dim, s.dim).copy_(dA_part.sum(0));
    if (D.has_value()) dD.narrow(0, k * s.dim, s.dim).copy_(dD_part.sum(0));
    if (delta_bias.has_value()) ddb.narrow(0, k * s.dim, s.dim).copy_(ddb_part.sum(0));
  }
  const auto merged = [&](const at::Tensor& part, const at::Tensor& like) {
    return (slices == 1 ? part[0] : part.sum(0)).view(like.sizes()).to(like.scalar_type());
  };
  return {du.to(u.scalar_type()).contiguous(u_in.suggest_memory_format()),
          ddelta,
          dA,
          merged(dB_part, B),
          merged(dC_part, C),
          dD,
          ddb};
}

}  // namespace scan2d
}  // namespace vmamba2d
