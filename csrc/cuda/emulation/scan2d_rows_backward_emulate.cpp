// Host emulation of the RS backward (scan2d_rows_backward.cuh) and of the forwards that save its
// band carries (RowsForward::run_saving, one route; CrossRowsCarries, VMamba's four cross routes),
// built by the C++ compiler alone as a test-only torch extension
// (tests/support/cuda_emulation_build.py: build_emulation; include path csrc/cuda). Warps
// run in a chosen order (forward, reversed or shuffled), the 32 lanes of a warp one after another in
// every per-lane phase in that order, the shuffles move values between the lanes' slots. Checks, each
// a RuntimeError naming what went wrong:
//   * global accesses: bounds, the alignment of every vector access, writes only into the launch's
//     outputs, each output element written exactly once, by one lane, and read by no other lane;
//     after the launch every output element must have been written;
//   * the band buffer: a lane touches only its own slots, and never reads a slot before writing it;
//   * shuffles only between per-lane phases, per-lane phases not nested, global and band accesses
//     only inside them.
// Outputs start as NaN, so an element the kernel did not write also shows in the results.
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "emulation/host_emulation.h"
#include "scan2d_rows_backward.cuh"

namespace vmamba2d {
namespace rows {
namespace {

using emulation::Schedule;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("RS backward emulation: " + what); }

// One output buffer's writer per element (global lane id; -1: none yet).
class OutputShadow {
 public:
  OutputShadow(std::string name, int64_t extent) : name_(std::move(name)), writer_(extent, -1) {}

  void write(int64_t i, int64_t lane) {
    if (writer_[i] >= 0) {
      fail(name_ + " element " + std::to_string(i) + " written twice (lanes " + std::to_string(writer_[i]) + " and " +
           std::to_string(lane) + ")");
    }
    writer_[i] = lane;
  }
  void read(int64_t i, int64_t lane) const {
    if (writer_[i] >= 0 && writer_[i] != lane) {
      fail("global-memory race: " + name_ + " element " + std::to_string(i) + " written by lane " +
           std::to_string(writer_[i]) + " and read by lane " + std::to_string(lane));
    }
  }
  void check_complete() const {
    const auto missing = std::count(writer_.begin(), writer_.end(), int64_t{-1});
    if (missing) fail(std::to_string(missing) + " elements of " + name_ + " were written by no lane");
  }
  // A buffer of `parts` parts `stride` elements apart, each `count` long (one route's planes of a
  // multi-route layout): every element of a part written, none between the parts.
  void check_parts(int64_t parts, int64_t stride, int64_t count) const {
    for (int64_t i = 0; i < static_cast<int64_t>(writer_.size()); ++i) {
      const bool inside = i % stride < count && i / stride < parts;
      if (inside && writer_[i] < 0) fail(name_ + " element " + std::to_string(i) + " was written by no lane");
      if (!inside && writer_[i] >= 0) {
        fail(name_ + " element " + std::to_string(i) + ", outside the route's planes, written by lane " +
             std::to_string(writer_[i]));
      }
    }
  }

 private:
  std::string name_;
  std::vector<int64_t> writer_;
};

// The launch's output buffers by their first byte.
using Outputs = std::map<const void*, OutputShadow*>;

// The execution context of one warp (RowsBackwardDeviceCtx's interface: RowsDeviceCtx's plus the
// band buffer); a writable buffer must be one of the launch's outputs.
class BackwardHostCtx : public emulation::HostWarpCtx<BackwardHostCtx, OutputShadow, fail> {
 public:
  BackwardHostCtx(int64_t warp, Schedule& schedule, const Outputs& outputs, int band_slots)
      : HostWarpCtx(warp, schedule, nullptr), outputs_(outputs), band_(static_cast<size_t>(band_slots) * kLanes, 0.f),
        band_written_(band_.size(), false) {}

  OutputShadow* shadow_of(const void* ptr, int64_t count) const {
    if (ptr == nullptr || count <= 0) return nullptr;
    const auto it = outputs_.find(ptr);
    if (it == outputs_.end()) fail("a writable pointer that is none of the launch's outputs");
    return it->second;
  }
  int64_t fresh(int64_t v) const { return v; }

  // A read-only view of one of the launch's outputs (du_sum where du is du_sum itself) carries the
  // output's shadow too: a read of a cell another lane wrote is a race.
  template <class V>
  auto global(V* ptr, int64_t count) const {
    auto view = HostWarpCtx::global(ptr, count);
    if constexpr (std::is_const_v<V>) {
      const auto it = outputs_.find(static_cast<const void*>(ptr));
      if (ptr != nullptr && count > 0 && it != outputs_.end()) view.shadow = it->second;
    }
    return view;
  }

  float band_get(int t, int lane) const {
    const size_t i = band_index(t, lane, "read");
    if (!band_written_[i]) {
      fail("band slot " + std::to_string(t) + " of lane " + std::to_string(lane) + " read before written");
    }
    return band_[i];
  }
  void band_put(int t, int lane, float v) {
    const size_t i = band_index(t, lane, "write");
    band_[i] = v;
    band_written_[i] = true;
  }

 private:
  size_t band_index(int t, int lane, const char* what) const {
    if (this->lane() < 0) fail(std::string("band buffer ") + what + " outside a per-lane phase");
    if (lane != this->lane()) {
      fail(std::string("band buffer ") + what + " of lane " + std::to_string(lane) + " by lane " +
           std::to_string(this->lane()));
    }
    const size_t i = static_cast<size_t>(t) * kLanes + lane;
    if (t < 0 || i >= band_.size()) fail("band slot " + std::to_string(t) + " out of range");
    return i;
  }

  const Outputs& outputs_;
  std::vector<float> band_;
  std::vector<bool> band_written_;
};

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType type, at::IntArrayRef shape) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == type && t.sizes() == shape, name,
              ": expected a contiguous CPU tensor of ", c10::toString(type), " shaped ", shape, ", got ",
              t.scalar_type(), " of shape ", t.sizes());
}

struct Shapes {
  int64_t batch, dim, groups, length;
};

// The inputs of one route's pass -- delta, B, C in the layout of `routes` routes (their planes of
// route route_index: no copy), A, D, delta_bias the route's -- and a lane layout of vec columns, load
// elements an access.
Shapes check_inputs(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
                    const at::Tensor& C, const std::optional<at::Tensor>& D,
                    const std::optional<at::Tensor>& delta_bias, int64_t height, int64_t width, int64_t vec,
                    int64_t load, int64_t routes, int64_t route_index) {
  TORCH_CHECK(routes >= 1 && route_index >= 0 && route_index < routes, "route_index: expected [0, ", routes,
              "), got ", route_index);
  const emulation::ScanSizes s =
      emulation::check_scan_inputs(u, delta, A, B, C, D, delta_bias, height, width, routes, 1);
  TORCH_CHECK(vec == 1 || vec == 2 || vec == 4, "vec: expected 1, 2 or 4, got ", vec);
  TORCH_CHECK((width + vec - 1) / vec <= kWarpLanes, "vec ", vec, " puts a row of ", width, " on more than 32 lanes");
  TORCH_CHECK(load == 1 || (load == vec && width % vec == 0), "load ", load, ": 1, or vec where vec divides W");
  return {s.batch, s.dim, s.groups, s.length};
}

at::Tensor nan_filled(at::IntArrayRef shape, const at::Tensor& like, at::ScalarType type) {
  return at::full(shape, std::numeric_limits<float>::quiet_NaN(), like.options().dtype(type));
}

template <class E, int kV, int kLoad, int kPrefetch, Order kOrder, bool kFromRight>
void run_save_with(const RowsParams& p, int64_t order, const Outputs& outputs, float* carries) {
  Schedule schedule(order);
  for (int64_t item : schedule.permutation(rows_items(p))) {
    BackwardHostCtx ctx(item, schedule, outputs, 0);
    RowsForward<E, kV, kLoad, kOrder, kFromRight, kPrefetch, -1, true>::run_saving(ctx, p, item, carries);
  }
}

template <class E, int kV, int kLoad>
struct SaveJob {
  // Route 0: even orders P = 1 (the plan's), odd orders P = 2 (the runs across orders hold P
  // numerics-neutral); the other passes and column orders P = 1 (the prefetch is route-blind code).
  static void run(const RowsParams& p, int64_t order, const Outputs& outputs, float* carries, int route) {
    switch (route & (kRouteColumnsFirst | kRouteFromRight)) {
      case 0:
        if (order % 2 == 0) return run_save_with<E, kV, kLoad, 1, Order::kRowsFirst, false>(p, order, outputs, carries);
        return run_save_with<E, kV, kLoad, 2, Order::kRowsFirst, false>(p, order, outputs, carries);
      case kRouteFromRight:
        return run_save_with<E, kV, kLoad, 1, Order::kRowsFirst, true>(p, order, outputs, carries);
      case kRouteColumnsFirst:
        return run_save_with<E, kV, kLoad, 1, Order::kColumnsFirst, false>(p, order, outputs, carries);
      default:
        return run_save_with<E, kV, kLoad, 1, Order::kColumnsFirst, true>(p, order, outputs, carries);
    }
  }
};

template <class E, int kV, int kLoad, int kSteps, int kMaps, Order kOrder, bool kFromRight, int kFromBottom = -1,
          int kDuF32 = -1>
void run_backward_with(const RowsBackwardParams& p, int64_t order, const Outputs& outputs) {
  Schedule schedule(order);
  for (int64_t item : schedule.permutation(rows_backward_items(p))) {
    BackwardHostCtx ctx(item, schedule, outputs, band_slots<kV>());
    RowsBackward<E, kV, kLoad, kSteps, kMaps, kOrder, kFromRight, kFromBottom, kDuF32>::run(ctx, p, item);
  }
}

// A compiled form as the GPU entry builds it: du's type compiled in too (VMAMBA2D_RSB_DU_F32; fp32
// inputs compile none).
template <class E, int kV, int kLoad, int kSteps, int kMaps, Order kOrder, bool kFromRight, int kFromBottom>
void run_compiled(const RowsBackwardParams& p, int64_t order, const Outputs& outputs) {
  if (!IsFloat<typename E::Raw>::value && p.du_fp32) {
    return run_backward_with<E, kV, kLoad, kSteps, kMaps, kOrder, kFromRight, kFromBottom, 1>(p, order, outputs);
  }
  return run_backward_with<E, kV, kLoad, kSteps, kMaps, kOrder, kFromRight, kFromBottom, 0>(p, order, outputs);
}

template <class E, int kV, int kLoad>
struct BackwardJob {
  // Even orders run the scan steps, maps per warp and row direction compiled in as the GPU entry does
  // (VMAMBA2D_RSB_STEPS / _MAPS / _ROUTE) for the model's segments -- 14 lanes (4 steps, 2 maps: W =
  // 56) and 7 lanes (3 steps, 4 maps: W = 28, 14, 7) --, odd orders take all three at run time: the
  // runs across orders hold the two forms bit-equal. Route 0 has the compiled forms at every lane
  // layout; the other routes at 4 columns a lane with vector accesses (W = 56) and at 2 (W = 14),
  // which keeps the module's build time in check.
  static void run(const RowsBackwardParams& p, int64_t order, const Outputs& outputs, int route) {
    if (route != 0 && order % 2 == 0) {
      if constexpr (kV == 4 && kLoad == 4) {
        if (p.seg_lanes == 14) return compiled<4, 2>(p, order, outputs, route);
      }
      if constexpr (kV == 2 && kLoad == 2) {
        if (p.seg_lanes == 7) return compiled<3, 4>(p, order, outputs, route);
      }
    }
    switch (route & (kRouteColumnsFirst | kRouteFromRight)) {
      case 0:
        if (p.from_bottom) return run_backward_with<E, kV, kLoad, -1, -1, Order::kRowsFirst, false>(p, order, outputs);
        if (order % 2 == 0 && p.seg_lanes == 14) {
          return run_compiled<E, kV, kLoad, 4, 2, Order::kRowsFirst, false, 0>(p, order, outputs);
        }
        if (order % 2 == 0 && p.seg_lanes == 7) {
          return run_compiled<E, kV, kLoad, 3, 4, Order::kRowsFirst, false, 0>(p, order, outputs);
        }
        return run_backward_with<E, kV, kLoad, -1, -1, Order::kRowsFirst, false, 0>(p, order, outputs);
      case kRouteFromRight:
        return run_backward_with<E, kV, kLoad, -1, -1, Order::kRowsFirst, true>(p, order, outputs);
      case kRouteColumnsFirst:
        return run_backward_with<E, kV, kLoad, -1, -1, Order::kColumnsFirst, false>(p, order, outputs);
      default:
        return run_backward_with<E, kV, kLoad, -1, -1, Order::kColumnsFirst, true>(p, order, outputs);
    }
  }

  // A route's instance with the steps, maps, row direction and du type compiled in (the GPU entry's).
  template <int kSteps, int kMaps>
  static void compiled(const RowsBackwardParams& p, int64_t order, const Outputs& outputs, int route) {
    constexpr Order kRows = Order::kRowsFirst;
    constexpr Order kCols = Order::kColumnsFirst;
    switch (route) {
      case 1: return run_compiled<E, kV, kLoad, kSteps, kMaps, kRows, true, 0>(p, order, outputs);
      case 2: return run_compiled<E, kV, kLoad, kSteps, kMaps, kRows, false, 1>(p, order, outputs);
      case 3: return run_compiled<E, kV, kLoad, kSteps, kMaps, kRows, true, 1>(p, order, outputs);
      case 4: return run_compiled<E, kV, kLoad, kSteps, kMaps, kCols, false, 0>(p, order, outputs);
      case 5: return run_compiled<E, kV, kLoad, kSteps, kMaps, kCols, true, 0>(p, order, outputs);
      case 6: return run_compiled<E, kV, kLoad, kSteps, kMaps, kCols, false, 1>(p, order, outputs);
      default: return run_compiled<E, kV, kLoad, kSteps, kMaps, kCols, true, 1>(p, order, outputs);
    }
  }
};

void check_route(int64_t route) {
  TORCH_CHECK(route >= 0 && route < 8, "route: expected a 2D route code in [0, 8), got ", route);
}

// Job<E, kV, kLoad>::run(args...) for the run-time type, vec (1, 2, 4) and load (1 or vec).
template <template <class, int, int> class Job, class E, class... Args>
void by_vec(int64_t vec, int64_t load, const Args&... args) {
  switch (vec) {
    case 1:
      return Job<E, 1, 1>::run(args...);
    case 2:
      return load == 2 ? Job<E, 2, 2>::run(args...) : Job<E, 2, 1>::run(args...);
    default:
      return load == 4 ? Job<E, 4, 4>::run(args...) : Job<E, 4, 1>::run(args...);
  }
}

template <template <class, int, int> class Job, class... Args>
void dispatch(at::ScalarType type, int64_t vec, int64_t load, const Args&... args) {
  emulation::with_host_element(type, [&](auto element) { by_vec<Job, decltype(element)>(vec, load, args...); });
}

// The forward of the N = 1 scan along a 2D route (code 0-7) that also saves the band carries (the
// saving RS entry) on the emulation, with vec columns per lane and load elements per access. u:
// (batch, dim, L); delta: (batch, routes * dim, L); B, C: (batch, routes * groups, 1, L), the pass
// reading route route_index's planes of each (a multi-route op's layout, no copy); A: (dim, 1); D,
// delta_bias: (dim,) or None. Returns (y (batch, dim,
// L) in u's type or fp32 with y_fp32 -- empty without store_y: a null y, the carries only --,
// carries fp32 (batch * dim, rows_carry_rows(H), W)).
std::tuple<at::Tensor, at::Tensor> rows_forward_save(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                                     const at::Tensor& B, const at::Tensor& C,
                                                     const std::optional<at::Tensor>& D,
                                                     const std::optional<at::Tensor>& delta_bias, bool softplus,
                                                     int64_t height, int64_t width, bool y_fp32, int64_t order,
                                                     int64_t vec, int64_t load, int64_t route, bool store_y,
                                                     int64_t routes, int64_t route_index) {
  check_route(route);
  const Shapes s = check_inputs(u, delta, A, B, C, D, delta_bias, height, width, vec, load, routes, route_index);
  const emulation::ScanSizes sizes{s.batch, s.dim, s.length, s.groups};
  at::Tensor y = store_y ? emulation::nan_output(u, sizes, y_fp32) : u.new_empty({0});
  at::Tensor carries = nan_filled({s.batch * s.dim, rows_carry_rows(static_cast<int>(height)), width}, u, at::kFloat);
  RowsParams p{};
  emulation::fill_scan_params(p, u, delta, A, B, C, D, delta_bias, y, sizes, routes, route_index, height, width,
                              softplus);
  p.seg_lanes = static_cast<int>((width + vec - 1) / vec);
  p.maps_per_warp = kWarpLanes / p.seg_lanes;
  p.from_bottom = (route & kRouteFromBottom) ? 1 : 0;
  if (!store_y) p.y = nullptr;
  OutputShadow y_shadow("y", y.numel()), carry_shadow("carries", carries.numel());
  Outputs outputs{{carries.data_ptr(), &carry_shadow}};
  if (store_y) outputs[y.data_ptr()] = &y_shadow;
  float* carry_ptr = carries.numel() > 0 ? carries.data_ptr<float>() : nullptr;
  dispatch<SaveJob>(u.scalar_type(), vec, load, p, order, outputs, carry_ptr, static_cast<int>(route));
  if (store_y) y_shadow.check_complete();
  carry_shadow.check_complete();
  return {y, carries};
}

template <class E, int kV, int kLoad>
struct CrossSaveJob {
  // Even orders at the model's segments run the scan steps compiled in as the GPU entry does
  // (VMAMBA2D_RSB_STEPS: 14 lanes 4 steps, 7 lanes 3), odd orders take them at run time.
  static void run(const RowsParams& p, int64_t order, const Outputs& outputs, float* carries) {
    if (order % 2 == 0 && p.seg_lanes == 14) return with_steps<4>(p, order, outputs, carries);
    if (order % 2 == 0 && p.seg_lanes == 7) return with_steps<3>(p, order, outputs, carries);
    with_steps<-1>(p, order, outputs, carries);
  }

  template <int kSteps>
  static void with_steps(const RowsParams& p, int64_t order, const Outputs& outputs, float* carries) {
    Schedule schedule(order);
    for (int64_t item : schedule.permutation(rows_items(p))) {
      BackwardHostCtx ctx(item, schedule, outputs, 0);
      CrossRowsCarries<E, kV, kLoad, kSteps>::run(ctx, p, item, carries);
    }
  }
};

// The band carries of VMamba's four cross routes in one launch (CrossRowsCarries) on the emulation:
// u (batch, dim, L); delta (batch, 4 * dim, L); B, C (batch, 4 * groups, 1, L); A (4 * dim, 1); D,
// delta_bias (4 * dim,) or None; vec | W. Returns carries fp32 (4, batch * dim, rows_carry_rows(H),
// W), route k of CROSS_ROUTES as rows_forward_save stores it for that route alone.
at::Tensor rows_cross_save(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
                           const at::Tensor& C, const std::optional<at::Tensor>& D,
                           const std::optional<at::Tensor>& delta_bias, bool softplus, int64_t height, int64_t width,
                           int64_t order, int64_t vec, int64_t load) {
  const emulation::ScanSizes sizes =
      emulation::check_scan_inputs(u, delta, A, B, C, D, delta_bias, height, width, 4, 4);
  TORCH_CHECK(vec == 1 || vec == 2 || vec == 4, "vec: expected 1, 2 or 4, got ", vec);
  TORCH_CHECK(width % vec == 0 && width / vec <= kWarpLanes, "vec ", vec, ": expected to divide W = ", width,
              " into at most 32 lanes");
  TORCH_CHECK(load == 1 || load == vec, "load ", load, ": 1, or vec");
  at::Tensor carries =
      nan_filled({4, sizes.batch * sizes.dim, rows_carry_rows(static_cast<int>(height)), width}, u, at::kFloat);
  RowsParams p{};
  emulation::fill_scan_params(p, u, delta, A, B, C, D, delta_bias, u.new_empty({0}), sizes, 4, 0, height, width,
                              softplus);
  p.y = nullptr;
  p.D = nullptr;
  p.seg_lanes = static_cast<int>(width / vec);
  p.maps_per_warp = kWarpLanes / p.seg_lanes;
  OutputShadow shadow("carries", carries.numel());
  Outputs outputs;
  if (carries.numel() > 0) outputs[carries.data_ptr()] = &shadow;
  float* carry_ptr = carries.numel() > 0 ? carries.data_ptr<float>() : nullptr;
  dispatch<CrossSaveJob>(u.scalar_type(), vec, load, p, order, outputs, carry_ptr);
  shadow.check_complete();
  return carries;
}

// The RS backward on the emulation. Inputs as rows_forward_save (delta, B, C in the layout of
// `routes` routes, the pass's planes those of route route_index), dy (batch, dim, L) in u's type or
// fp32, carries as rows_forward_save returns them for the same route, du_sum None or fp32 (batch,
// dim, L) (the running sum the kernel adds to du; du_fp32: du in fp32 -- the GPU entry compiles
// the du type in, the emulation's run-time forms take it at run time; du_in_place: du is du_sum
// itself, as the GPU launcher passes it, its reads race-checked like du's writes). Returns the kernel's outputs unreduced: du
// (batch, dim, L) in u's type or fp32, ddelta (batch, routes * dim, L) in u's type (NaN but for the
// route's planes); dBC_part fp32 (2, batch, groups, chunks,
// L) (dB's partials, dC's); dA_part, dD_part, ddb_part fp32 (batch, dim) (dD_part / ddb_part empty
// without D / delta_bias).
std::vector<at::Tensor> rows_backward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                      const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                                      const std::optional<at::Tensor>& delta_bias, bool softplus, int64_t height,
                                      int64_t width, const at::Tensor& dy, const at::Tensor& carries, int64_t order,
                                      int64_t vec, int64_t load, int64_t route,
                                      const std::optional<at::Tensor>& du_sum, bool du_fp32, int64_t routes,
                                      int64_t route_index, bool du_in_place) {
  check_route(route);
  const Shapes s = check_inputs(u, delta, A, B, C, D, delta_bias, height, width, vec, load, routes, route_index);
  TORCH_CHECK(dy.scalar_type() == u.scalar_type() || dy.scalar_type() == at::kFloat, "dy: expected ",
              u.scalar_type(), " or float32, got ", dy.scalar_type());
  check_tensor(dy, "dy", dy.scalar_type(), {s.batch, s.dim, s.length});
  const int carry_rows = rows_carry_rows(static_cast<int>(height));
  check_tensor(carries, "carries", at::kFloat, {s.batch * s.dim, carry_rows, width});
  const int seg = static_cast<int>((width + vec - 1) / vec);
  const int maps_per_warp = kWarpLanes / seg;
  const int64_t cpg = s.dim / s.groups;
  const int64_t chunks = (cpg + maps_per_warp - 1) / maps_per_warp;
  const at::ScalarType type = u.scalar_type();
  if (du_sum) check_tensor(*du_sum, "du_sum", at::kFloat, {s.batch, s.dim, s.length});
  TORCH_CHECK(!du_in_place || (du_sum && (du_fp32 || type == at::kFloat)),
              "du_in_place: needs du_sum and an fp32 du (du_fp32 or fp32 inputs)");
  at::Tensor du = du_in_place ? *du_sum : nan_filled({s.batch, s.dim, s.length}, u, du_fp32 ? at::kFloat : type);
  at::Tensor ddelta = nan_filled({s.batch, routes * s.dim, s.length}, u, type);
  at::Tensor dBC = nan_filled({2, s.batch, s.groups, chunks, s.length}, u, at::kFloat);
  at::Tensor dA = nan_filled({s.batch, s.dim}, u, at::kFloat);
  at::Tensor dD = nan_filled({D ? s.batch : 0, D ? s.dim : 0}, u, at::kFloat);
  at::Tensor ddb = nan_filled({delta_bias ? s.batch : 0, delta_bias ? s.dim : 0}, u, at::kFloat);
  RowsBackwardParams p{};
  const int64_t elem = u.element_size();
  const int64_t delta_skip = route_index * s.dim * s.length;
  const int64_t bc_skip = route_index * s.groups * s.length * elem;
  p.u = u.data_ptr();
  p.delta = static_cast<const char*>(delta.data_ptr()) + delta_skip * elem;
  p.B = static_cast<const char*>(B.data_ptr()) + bc_skip;
  p.C = static_cast<const char*>(C.data_ptr()) + bc_skip;
  p.delta_planes = routes * s.dim;
  p.bc_planes = routes * s.groups;
  p.A = A.data_ptr<float>();
  p.D = D ? D->data_ptr<float>() : nullptr;
  p.delta_bias = delta_bias ? delta_bias->data_ptr<float>() : nullptr;
  p.dy = dy.data_ptr();
  p.carries = carries.numel() > 0 ? carries.data_ptr<float>() : nullptr;
  p.du = du.data_ptr();
  p.ddelta = static_cast<char*>(ddelta.data_ptr()) + delta_skip * elem;
  p.dBC_part = dBC.data_ptr<float>();
  p.dA_part = dA.data_ptr<float>();
  p.dD_part = D ? dD.data_ptr<float>() : nullptr;
  p.ddb_part = delta_bias ? ddb.data_ptr<float>() : nullptr;
  p.du_sum = du_sum && du_sum->numel() > 0 ? du_sum->data_ptr<float>() : nullptr;
  p.batch = static_cast<int>(s.batch);
  p.dim = static_cast<int>(s.dim);
  p.groups = static_cast<int>(s.groups);
  p.height = static_cast<int>(height);
  p.width = static_cast<int>(width);
  p.seg_lanes = seg;
  p.maps_per_warp = maps_per_warp;
  p.chunks = static_cast<int>(chunks);
  p.softplus = softplus ? 1 : 0;
  p.dy_fp32 = dy.scalar_type() == at::kFloat && type != at::kFloat ? 1 : 0;
  p.from_bottom = (route & kRouteFromBottom) ? 1 : 0;
  p.du_fp32 = du_fp32 && type != at::kFloat ? 1 : 0;

  std::vector<std::pair<at::Tensor, std::string>> named = {
      {du, "du"}, {dBC, "dBC_part"}, {dA, "dA_part"}, {dD, "dD_part"}, {ddb, "ddb_part"}};
  std::vector<std::unique_ptr<OutputShadow>> shadows;
  Outputs outputs;
  for (auto& [t, name] : named) {
    if (t.numel() == 0) continue;
    shadows.push_back(std::make_unique<OutputShadow>(name, t.numel()));
    outputs[t.data_ptr()] = shadows.back().get();
  }
  // ddelta from the route's first plane to the layout's end; the kernel writes the route's planes only.
  OutputShadow ddelta_shadow("ddelta", ddelta.numel() - delta_skip);
  if (ddelta.numel() > 0) outputs[p.ddelta] = &ddelta_shadow;
  dispatch<BackwardJob>(type, vec, load, p, order, outputs, static_cast<int>(route));
  for (const auto& shadow : shadows) shadow->check_complete();
  if (ddelta.numel() > 0) ddelta_shadow.check_parts(s.batch, routes * s.dim * s.length, s.dim * s.length);
  return {du, ddelta, dBC, dA, dD, ddb};
}

// One synthetic warp that breaks (or keeps) a rule of the checker; throws when the checker objects.
// Scenarios: own_slots, one_store_per_lane (pass); other_lanes_slot, read_before_write,
// band_outside_lane_phase, two_lanes_store_one_cell, store_twice, read_of_another_lanes_output,
// read_only_read_of_another_lanes_output (an output read through a read-only view, as du_sum where
// du is du_sum), store_into_an_input (throw); read_only_read_of_own_output (pass).
void rows_backward_self_check(const std::string& scenario) {
  Schedule schedule(3);
  float data[kWarpLanes] = {};
  float input[kWarpLanes] = {};
  OutputShadow shadow("out", kWarpLanes);
  const Outputs outputs{{data, &shadow}};
  BackwardHostCtx ctx(0, schedule, outputs, 2);
  const auto out = ctx.global(static_cast<float*>(data), kWarpLanes);
  float one = 1.f, v;
  if (scenario == "one_store_per_lane") {
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane, &one); });
    shadow.check_complete();
  } else if (scenario == "two_lanes_store_one_cell") {
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane / 2, &one); });
  } else if (scenario == "store_twice") {
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane, &one); });
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane, &one); });
  } else if (scenario == "read_of_another_lanes_output") {
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane, &one); });
    ctx.each_lane([&](int lane) { ctx.load<1>(out, (lane + 1) % kWarpLanes, &v); });
  } else if (scenario == "read_only_read_of_another_lanes_output") {
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane, &one); });
    const auto in = ctx.global(static_cast<const float*>(data), kWarpLanes);
    ctx.each_lane([&](int lane) { ctx.load<1>(in, (lane + 1) % kWarpLanes, &v); });
  } else if (scenario == "read_only_read_of_own_output") {
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane, &one); });
    const auto in = ctx.global(static_cast<const float*>(data), kWarpLanes);
    ctx.each_lane([&](int lane) { ctx.load<1>(in, lane, &v); });
  } else if (scenario == "store_into_an_input") {
    ctx.each_lane([&](int lane) { ctx.store<1>(ctx.global(static_cast<float*>(input), kWarpLanes), lane, &one); });
  } else if (scenario == "own_slots") {
    ctx.each_lane([&](int lane) { ctx.band_put(1, lane, 1.f); });
    ctx.each_lane([&](int lane) { (void)ctx.band_get(1, lane); });
  } else if (scenario == "other_lanes_slot") {
    ctx.each_lane([&](int lane) { ctx.band_put(0, (lane + 1) % kWarpLanes, 1.f); });
  } else if (scenario == "read_before_write") {
    ctx.each_lane([&](int lane) { (void)ctx.band_get(0, lane); });
  } else if (scenario == "band_outside_lane_phase") {
    ctx.band_put(0, 0, 1.f);
  } else {
    fail("unknown self-check scenario " + scenario);
  }
}

}  // namespace
}  // namespace rows
}  // namespace vmamba2d

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace vmamba2d::rows;
  m.doc() = "Host emulation of the RS backward and its carry-saving forward (tests only)";
  m.def("rows_forward_save", &rows_forward_save, "RS forward of a 2D route saving the band carries",
        pybind11::arg("u"), pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"),
        pybind11::arg("D"), pybind11::arg("delta_bias"), pybind11::arg("softplus"), pybind11::arg("height"),
        pybind11::arg("width"), pybind11::arg("y_fp32"), pybind11::arg("order"), pybind11::arg("vec"),
        pybind11::arg("load"), pybind11::arg("route") = 0, pybind11::arg("store_y") = true,
        pybind11::arg("routes") = 1, pybind11::arg("route_index") = 0);
  m.def("rows_backward", &rows_backward, "RS backward (unreduced partials)", pybind11::arg("u"),
        pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"), pybind11::arg("D"),
        pybind11::arg("delta_bias"), pybind11::arg("softplus"), pybind11::arg("height"), pybind11::arg("width"),
        pybind11::arg("dy"), pybind11::arg("carries"), pybind11::arg("order"), pybind11::arg("vec"),
        pybind11::arg("load"), pybind11::arg("route") = 0, pybind11::arg("du_sum") = pybind11::none(),
        pybind11::arg("du_fp32") = false, pybind11::arg("routes") = 1, pybind11::arg("route_index") = 0,
        pybind11::arg("du_in_place") = false);
  m.def("rows_cross_save", &rows_cross_save, "the band carries of the four cross routes in one launch",
        pybind11::arg("u"), pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"),
        pybind11::arg("D"), pybind11::arg("delta_bias"), pybind11::arg("softplus"), pybind11::arg("height"),
        pybind11::arg("width"), pybind11::arg("order"), pybind11::arg("vec"), pybind11::arg("load"));
  m.def("rows_backward_self_check", &rows_backward_self_check, "run one band-buffer checker scenario",
        pybind11::arg("scenario"));
  m.attr("band_rows") = kBandRows;
}
