// Scaffolding shared by the host emulations of the CUDA kernels (selective_scan_2d_emulate.cpp for
// v3, emulation/scan2d_*_emulate.cpp for the v4 kernels): the order in which blocks, warps, threads
// and lanes run, the element types' host traits, and the checks of the CPU tensors a test passes.
// Host only (C++ compiler and torch); include it as "emulation/host_emulation.h" with csrc/cuda on
// the include path. Each emulation keeps its own execution context and race detector: what a
// context records follows the memory its kernel uses (shared words, shared bytes with copies in
// flight, global cells).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace vmamba2d {
namespace emulation {

// The visiting order of `count` blocks / warps / threads / lanes: order 0 as they are, 1 reversed,
// >= 2 shuffled by a generator seeded with `order` (one generator per Schedule, drawn from in call
// order, so a launch's whole sequence of orders follows from its seed).
class Schedule {
 public:
  explicit Schedule(int64_t order) : order_(order), rng_(static_cast<uint64_t>(order)) {}

  template <class Index>
  std::vector<Index> permutation(Index count) {
    std::vector<Index> idx(static_cast<size_t>(count));
    std::iota(idx.begin(), idx.end(), Index{0});
    if (order_ == 1) {
      std::reverse(idx.begin(), idx.end());
    } else if (order_ >= 2) {
      std::shuffle(idx.begin(), idx.end(), rng_);
    }
    return idx;
  }

 private:
  int64_t order_;
  std::mt19937_64 rng_;
};

// The element traits the v4 kernels take (E: Raw, the storage type; to_float / from_float, round
// to nearest even; widen, a lane's row to fp32), host forms of the device file's: widen is exact in
// every type, so element by element.
template <class Traits, class Raw>
struct HostWiden {
  template <int kN>
  static void widen(const Raw (&in)[kN], float (&out)[kN]) {
    for (int k = 0; k < kN; ++k) out[k] = Traits::to_float(in[k]);
  }
};

struct HostF32 : HostWiden<HostF32, float> {
  using Raw = float;
  static float to_float(float v) { return v; }
  static float from_float(float v) { return v; }
};

struct HostF16 : HostWiden<HostF16, uint16_t> {
  using Raw = uint16_t;
  static float to_float(uint16_t v) { return static_cast<float>(c10::Half(v, c10::Half::from_bits())); }
  static uint16_t from_float(float v) { return c10::Half(v).x; }
};

struct HostBF16 : HostWiden<HostBF16, uint16_t> {
  using Raw = uint16_t;
  static float to_float(uint16_t v) { return static_cast<float>(c10::BFloat16(v, c10::BFloat16::from_bits())); }
  static uint16_t from_float(float v) { return c10::BFloat16(v).x; }
};

// Runs f(HostF32{}), f(HostF16{}) or f(HostBF16{}) for a tensor type (fp32 / fp16 / bf16).
template <class F>
void with_host_element(at::ScalarType type, F&& f) {
  if (type == at::kFloat) {
    f(HostF32{});
  } else if (type == at::kHalf) {
    f(HostF16{});
  } else {
    TORCH_CHECK(type == at::kBFloat16, "u: expected float32, float16 or bfloat16, got ", type);
    f(HostBF16{});
  }
}

// Why a global access of `count` elements from element i of a buffer (`base`, `extent` elements)
// is out of bounds, or "" when it is not.
inline std::string global_bounds_error(const void* base, int64_t extent, int64_t i, int64_t count,
                                       const char* what) {
  if (base == nullptr || extent == 0) return std::string(what) + " from a buffer the launch did not provide";
  if (i < 0 || i + count > extent) {
    return std::string("out-of-bounds global ") + what + ": elements " + std::to_string(i) + " .. " +
           std::to_string(i + count - 1) + " of a buffer of " + std::to_string(extent);
  }
  return {};
}

inline void check_cpu_input(const at::Tensor& t, const char* name, at::ScalarType type, int64_t dims) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == type && t.dim() == dims, name,
              ": expected a contiguous CPU tensor of ", c10::toString(type), " with ", dims, " dimensions, got ",
              t.scalar_type(), " of shape ", t.sizes());
}

// The sizes of an N = 1 scan's inputs.
struct ScanSizes {
  int64_t batch, dim, length, groups;
};

// Checks the CPU inputs of an N = 1 scan over `routes` routes' planes and returns their sizes:
// u (batch, dim, L) in fp32 / fp16 / bf16; delta (batch, routes * dim, L) and B, C (batch, routes *
// groups, 1, L) in u's type; A (param_routes * dim, 1), D and delta_bias (param_routes * dim,) or
// None in fp32 (param_routes: 1 where the launch reads one route's parameters, routes where it reads
// every route's); H * W = L.
inline ScanSizes check_scan_inputs(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                   const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                                   const std::optional<at::Tensor>& delta_bias, int64_t height, int64_t width,
                                   int64_t routes, int64_t param_routes) {
  const at::ScalarType type = u.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16,
              "u: expected float32, float16 or bfloat16, got ", type);
  check_cpu_input(u, "u", type, 3);
  check_cpu_input(delta, "delta", type, 3);
  check_cpu_input(B, "B", type, 4);
  check_cpu_input(C, "C", type, 4);
  check_cpu_input(A, "A", at::kFloat, 2);
  const int64_t batch = u.size(0), dim = u.size(1), length = u.size(2);
  TORCH_CHECK(height >= 1 && width >= 1 && height * width == length, "height, width: expected H * W = ", length,
              ", got ", height, " x ", width);
  TORCH_CHECK(delta.size(0) == batch && delta.size(1) == routes * dim && delta.size(2) == length,
              "delta: expected (batch, routes * dim, L) = (", batch, ", ", routes * dim, ", ", length, "), got ",
              delta.sizes());
  TORCH_CHECK(B.size(0) == batch && B.size(1) % routes == 0 && B.size(2) == 1 && B.size(3) == length &&
                  B.sizes() == C.sizes(),
              "B, C: expected (batch, routes * groups, 1, L) each with routes = ", routes, ", got ", B.sizes(),
              " and ", C.sizes());
  const int64_t groups = B.size(1) / routes;
  TORCH_CHECK(groups >= 1 && dim % groups == 0, "B: groups ", groups, " must divide dim ", dim);
  const int64_t params = param_routes * dim;
  TORCH_CHECK(A.size(0) == params && A.size(1) == 1, "A: expected (", params, ", 1), got ", A.sizes());
  if (D) check_cpu_input(*D, "D", at::kFloat, 1);
  if (delta_bias) check_cpu_input(*delta_bias, "delta_bias", at::kFloat, 1);
  TORCH_CHECK(!D || D->size(0) == params, "D: expected (", params, ",), got ", D->sizes());
  TORCH_CHECK(!delta_bias || delta_bias->size(0) == params, "delta_bias: expected (", params, ",), got ",
              delta_bias->sizes());
  return {batch, dim, length, groups};
}

// y of a launch over checked inputs, (batch, dim, L) in u's type or fp32, filled with NaN so a cell
// the kernel did not write shows in the results too.
inline at::Tensor nan_output(const at::Tensor& u, const ScanSizes& sizes, bool y_fp32) {
  return at::full({sizes.batch, sizes.dim, sizes.length}, std::numeric_limits<float>::quiet_NaN(),
                  u.options().dtype(y_fp32 ? at::kFloat : u.scalar_type()));
}

// The fields the v4 kernels' parameter blocks (RowsParams, PlanesParams) share, over inputs
// check_scan_inputs accepted: the launch reads route route_index's planes of delta, B and C (plane
// strides routes * dim and routes * groups) and writes y.
template <class Params>
void fill_scan_params(Params& p, const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                      const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                      const std::optional<at::Tensor>& delta_bias, const at::Tensor& y, const ScanSizes& sizes,
                      int64_t routes, int64_t route_index, int64_t height, int64_t width, bool softplus, bool y_fp32) {
  const int64_t elem = u.element_size();
  p.u = u.data_ptr();
  p.delta = static_cast<const char*>(delta.data_ptr()) + route_index * sizes.dim * sizes.length * elem;
  p.B = static_cast<const char*>(B.data_ptr()) + route_index * sizes.groups * sizes.length * elem;
  p.C = static_cast<const char*>(C.data_ptr()) + route_index * sizes.groups * sizes.length * elem;
  p.A = A.data_ptr<float>();
  p.D = D ? D->data_ptr<float>() : nullptr;
  p.delta_bias = delta_bias ? delta_bias->data_ptr<float>() : nullptr;
  p.y = y.data_ptr();
  p.delta_planes = routes * sizes.dim;
  p.bc_planes = routes * sizes.groups;
  p.batch = static_cast<int>(sizes.batch);
  p.dim = static_cast<int>(sizes.dim);
  p.groups = static_cast<int>(sizes.groups);
  p.height = static_cast<int>(height);
  p.width = static_cast<int>(width);
  p.softplus = softplus ? 1 : 0;
  p.y_fp32 = y_fp32 ? 1 : 0;
}

}  // namespace emulation
}  // namespace vmamba2d
