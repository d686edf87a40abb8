// Host emulation of the v4 row-streaming forward (scan2d_rows.cuh), built by the C++ compiler
// alone as a test-only torch extension (tests/support/cuda_emulation_build.py, include path csrc/cuda; this
// folder is outside setup.py's glob of the nvcc-built extension's sources). The kernel body runs
// warp by warp on the CPU: warps in a chosen order, the 32 lanes of a warp one after another in
// every phase (forward, reversed or shuffled), the shuffles moving values between the lanes'
// slots. Checks, each a RuntimeError naming what went wrong:
//   * global accesses: bounds, the alignment of every vector access, and races -- a cell written by
//     two lanes, or written by one lane and read by another (the kernel has no barrier, so any such
//     pair is unordered on a GPU); after the launch every cell of y must have been written once;
//   * shuffles only between per-lane phases (where every lane of the warp reaches them), per-lane
//     phases not nested.
// y starts filled with NaN so a cell the kernel did not write also shows in the results.
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "emulation/host_emulation.h"
#include "scan2d_rows.cuh"

namespace vmamba2d {
namespace rows {
namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("RS emulation: " + what); }

using emulation::check_scan_inputs;
using emulation::Schedule;
using emulation::with_host_element;

// Vector accesses (more than one element) of the last emulation call on this thread.
thread_local int64_t g_vector_accesses = 0;
// The scan steps the last emulation call's kernel was compiled for on this thread (-1: run time).
thread_local int g_last_steps = -1;

// Who wrote / read each element of a writable buffer (global lane ids; -1 none). `writes`: how
// often each element must be written, all by one lane (2: the four-route kernel's read-modify-write
// of y by the lane that wrote it in the first sweep).
class GlobalShadow {
 public:
  explicit GlobalShadow(int64_t extent, int writes = 1)
      : writer_(extent, -1), reader_(extent, -1), count_(extent, 0), writes_(writes) {}

  void read(int64_t i, int64_t lane) {
    if (writer_[i] >= 0 && writer_[i] != lane) fail(race("read after write", i, writer_[i], lane));
    reader_[i] = reader_[i] == -1 || reader_[i] == lane ? lane : kMany;
  }
  void write(int64_t i, int64_t lane) {
    if (writer_[i] == lane && count_[i] >= writes_) {
      fail("global element " + std::to_string(i) + " written " + (writes_ == 1 ? std::string("twice") : std::to_string(count_[i] + 1) + " times") +
           " by lane " + describe(lane));
    }
    if (writer_[i] >= 0 && writer_[i] != lane) fail(race("write after write", i, writer_[i], lane));
    if (reader_[i] != -1 && reader_[i] != lane) fail(race("write after read", i, reader_[i], lane));
    writer_[i] = lane;
    ++count_[i];
  }
  // Elements written fewer than `writes` times.
  int64_t unwritten() const {
    return std::count_if(count_.begin(), count_.end(), [&](int c) { return c < writes_; });
  }

 private:
  static constexpr int64_t kMany = -2;
  static std::string describe(int64_t lane) {
    if (lane == kMany) return "(several)";
    return std::to_string(lane) + " (warp " + std::to_string(lane / kWarpLanes) + ", lane " +
           std::to_string(lane % kWarpLanes) + ")";
  }
  static std::string race(const char* what, int64_t i, int64_t a, int64_t b) {
    return std::string("global-memory race (") + what + ") at element " + std::to_string(i) + ": lane " + describe(a) +
           " and lane " + describe(b) + ", with no ordering between them";
  }
  std::vector<int64_t> writer_;
  std::vector<int64_t> reader_;
  std::vector<int> count_;
  int writes_;
};

// The emulation's execution context of one warp (RowsDeviceCtx's interface): every writable buffer
// is y, recorded in one shadow; vector accesses are counted in g_vector_accesses.
class RowsHostCtx : public emulation::HostWarpCtx<RowsHostCtx, GlobalShadow, fail> {
 public:
  RowsHostCtx(int64_t warp, Schedule& schedule, GlobalShadow* y_shadow)
      : HostWarpCtx(warp, schedule, &g_vector_accesses), y_shadow_(y_shadow) {}

  GlobalShadow* shadow_of(const void*, int64_t) const { return y_shadow_; }

  void shfl_idx(float (&out)[kLanes], const float (&in)[kLanes], const int (&src)[kLanes]) const {
    warp_phase("__shfl_sync");
    float taken[kLanes];
    for (int l = 0; l < kLanes; ++l) taken[l] = in[src[l] & (kLanes - 1)];
    std::memcpy(out, taken, sizeof(taken));
  }

 private:
  GlobalShadow* y_shadow_;
};

// The instances whose scan steps the GPU entry compiles in (VMAMBA2D_RS_STEPS) that the emulation
// compiles in too, as (vec, load, prefetch, steps): those of the model's and the benchmarks' map
// widths 56 / 28 / 14 / 7 with aligned tensors. Single route: MODEL_ROWS_PLANS
// (vmamba2d/ops/compiled/cuda_kernels.py; rows_plan's V = 4, 4, 2, 1 fp32, 8, 4, 2, 1 fp16 / bf16)
// at the plan's P = 1 and the tuner's P = 2 where it offers it (rows_plan.py, tuning_candidates:
// V <= 2), each in every route variant; four routes: cross_plan's V = 2, 2, 2, 1 fp32 and 4, 4, 2, 1
// fp16 / bf16 (rows_plan.py) at the plan's prefetch depth (P = 2 for fp16 / bf16 at every V, fp32 at V = 1;
// else 1) and at P = 1 for every V (the pinned one-row-ahead instance the benchmark times beside the plan's).
// Another plan is the same code with other constants; steps = -1 takes rows_scan_steps at run time.
struct StepsPlan {
  int vec, load, prefetch, steps;
};
constexpr StepsPlan kRowsStepsPlans[] = {{8, 8, 1, 3}, {4, 4, 1, 4}, {4, 4, 1, 3}, {2, 2, 1, 3},
                                         {2, 2, 2, 3}, {1, 1, 1, 3}, {1, 1, 2, 3}};
constexpr StepsPlan kCrossStepsPlans[] = {{4, 4, 2, 4}, {4, 4, 2, 3}, {4, 4, 1, 4}, {4, 4, 1, 3},
                                          {2, 2, 1, 5}, {2, 2, 1, 4}, {2, 2, 1, 3}, {2, 2, 2, 3},
                                          {1, 1, 1, 3}, {1, 1, 2, 3}};

template <size_t kN>
constexpr bool steps_compiled(const StepsPlan (&plans)[kN], int vec, int load, int prefetch, int steps) {
  for (const StepsPlan& plan : plans) {
    if (plan.vec == vec && plan.load == load && plan.prefetch == prefetch && plan.steps == steps) return true;
  }
  return false;
}

// The rows a launch loads ahead: even orders run the plan's P = 1 (rows_plan.py, prefetch_rows),
// odd orders P = 2 (a tuner's option), at every V: the tests' runs across orders thereby also hold
// the prefetch depth numerics-neutral. The four-route kernel's depth is an argument (its plan's).
int prefetch_of(int64_t order) { return order % 2 == 0 ? 1 : 2; }

// The GPU entry's guard (rows_forward_kernel, scan2d_rows_device.cuh): a kernel compiled for fewer
// scan steps than the launch's segments need traps.
void check_compiled_steps(int steps, const RowsParams& p) {
  if (steps >= 0 && (1 << steps) < p.seg_lanes) {
    fail("a kernel compiled for " + std::to_string(steps) + " scan steps launched with " +
         std::to_string(p.seg_lanes) + " lanes per map (the GPU entry traps)");
  }
}


// The steps a launch runs with: `requested` if given (-1: the run-time form), else the plan's
// rows_scan_steps(seg_lanes) compiled in where the table has that instance, the run-time form where not.
template <size_t kN>
int launch_steps(const StepsPlan (&plans)[kN], int vec, int load, int prefetch, const RowsParams& p,
                 const std::optional<int64_t>& requested) {
  if (requested) {
    TORCH_CHECK(*requested >= -1 && *requested <= kScanSteps, "steps: expected -1 (run time) or 0 .. ", kScanSteps,
                ", got ", *requested);
    return static_cast<int>(*requested);
  }
  const int steps = rows_scan_steps(p.seg_lanes);
  return steps_compiled(plans, vec, load, prefetch, steps) ? steps : -1;
}

template <class E, int kV, int kLoad, Order kOrder, bool kFromRight, int kPrefetch, int kSteps>
void run_items(const RowsParams& p, int64_t order, GlobalShadow* shadow) {
  check_compiled_steps(kSteps, p);
  Schedule schedule(order);
  for (int64_t item : schedule.permutation(rows_items(p))) {
    RowsHostCtx ctx(item, schedule, shadow);
    RowsForward<E, kV, kLoad, kOrder, kFromRight, kPrefetch, kSteps>::run(ctx, p, item);
  }
}

// Runs the instance compiled for `steps` scan steps if the table has it; false if not.
template <class E, int kV, int kLoad, Order kOrder, bool kFromRight, int kPrefetch, int... kSteps>
bool run_compiled(const RowsParams& p, int steps, int64_t order, GlobalShadow* shadow,
                  std::integer_sequence<int, kSteps...>) {
  const auto one = [&](auto fixed) {
    constexpr int kFixed = decltype(fixed)::value;
    if constexpr (steps_compiled(kRowsStepsPlans, kV, kLoad, kPrefetch, kFixed)) {
      if (steps == kFixed) {
        run_items<E, kV, kLoad, kOrder, kFromRight, kPrefetch, kFixed>(p, order, shadow);
        return true;
      }
    }
    return false;
  };
  return (one(std::integral_constant<int, kSteps>{}) || ...);
}

// steps: -1 the run-time form; >= 0 the instance compiled for that many steps (the table must have
// it for this vec, load and the order's prefetch).
template <class E, int kV, int kLoad, Order kOrder, bool kFromRight, int kPrefetch>
void run_prefetch(const RowsParams& p, int steps, int64_t order, GlobalShadow* shadow) {
  if (steps < 0) return run_items<E, kV, kLoad, kOrder, kFromRight, kPrefetch, -1>(p, order, shadow);
  if (!run_compiled<E, kV, kLoad, kOrder, kFromRight, kPrefetch>(p, steps, order, shadow,
                                                                 std::make_integer_sequence<int, kScanSteps + 1>{})) {
    fail("no instance compiled for vec " + std::to_string(kV) + ", load " + std::to_string(kLoad) + ", prefetch " +
         std::to_string(kPrefetch) + ", " + std::to_string(steps) + " scan steps (kRowsStepsPlans)");
  }
}

template <class E, int kV, int kLoad, Order kOrder, bool kFromRight>
void run_launch(const RowsParams& p, int steps, int64_t order, GlobalShadow* shadow) {
  if (prefetch_of(order) == 1) return run_prefetch<E, kV, kLoad, kOrder, kFromRight, 1>(p, steps, order, shadow);
  run_prefetch<E, kV, kLoad, kOrder, kFromRight, 2>(p, steps, order, shadow);
}

template <class E, int kV, int kLoad>
void by_route(const RowsParams& p, int route, int steps, int64_t order, GlobalShadow* shadow) {
  const bool right = route & kRouteFromRight;
  switch (rows_order(route)) {
    case Order::kRowsFirst:
      return right ? run_launch<E, kV, kLoad, Order::kRowsFirst, true>(p, steps, order, shadow)
                   : run_launch<E, kV, kLoad, Order::kRowsFirst, false>(p, steps, order, shadow);
    case Order::kColumnsFirst:
      return right ? run_launch<E, kV, kLoad, Order::kColumnsFirst, true>(p, steps, order, shadow)
                   : run_launch<E, kV, kLoad, Order::kColumnsFirst, false>(p, steps, order, shadow);
    case Order::kFlat:
      return right ? run_launch<E, kV, kLoad, Order::kFlat, true>(p, steps, order, shadow)
                   : run_launch<E, kV, kLoad, Order::kFlat, false>(p, steps, order, shadow);
  }
}

template <class E, int kV>
void by_load(const RowsParams& p, int load, int route, int steps, int64_t order, GlobalShadow* shadow) {
  if constexpr (kV > 1) {
    if (load == kV) return by_route<E, kV, kV>(p, route, steps, order, shadow);
  }
  by_route<E, kV, 1>(p, route, steps, order, shadow);
}

template <class E>
void by_vec(const RowsParams& p, int vec, int load, int route, int steps, int64_t order, GlobalShadow* shadow) {
  switch (vec) {
    case 1:
      return by_load<E, 1>(p, load, route, steps, order, shadow);
    case 2:
      return by_load<E, 2>(p, load, route, steps, order, shadow);
    case 4:
      return by_load<E, 4>(p, load, route, steps, order, shadow);
    case 8:
      if constexpr (sizeof(typename E::Raw) == 2) return by_load<E, 8>(p, load, route, steps, order, shadow);
      [[fallthrough]];
    default:
      fail("no kernel with " + std::to_string(vec) + " columns per lane for this type");
  }
}

// y = the route's 2D selective scan (N = 1) of the inputs, run on the emulated RS kernel with vec
// columns per lane and load elements per access (a RowsPlan of vmamba2d/ops/compiled/rows_plan.py;
// the layout follows from them). u: (batch, dim, L); delta: (batch, routes * dim, L); B, C: (batch,
// routes * groups, 1, L); A: (dim, 1); D, delta_bias: (dim,) or None. With routes > 1 (the four-route
// op's layout) the launch reads route route_index's planes of delta, B and C (RowsParams'
// delta_planes / bc_planes strides). Returns y (batch, dim, L) in u's type, or fp32 with y_fp32.
at::Tensor rows_forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
                        const at::Tensor& C, const std::optional<at::Tensor>& D,
                        const std::optional<at::Tensor>& delta_bias, bool softplus, int64_t height, int64_t width,
                        int64_t route, bool y_fp32, int64_t order, int64_t vec, int64_t load, int64_t routes,
                        int64_t route_index, const std::optional<int64_t>& steps) {
  TORCH_CHECK(routes >= 1 && route_index >= 0 && route_index < routes, "route_index: expected 0 <= it < routes = ",
              routes, ", got ", route_index);
  TORCH_CHECK(rows_route_supported(static_cast<int>(route)), "route ", route, ": not a row stream (use v3)");
  TORCH_CHECK(vec == 1 || vec == 2 || vec == 4 || (vec == 8 && u.element_size() == 2),
              "vec: expected 1, 2, 4 (or 8 for 2-byte types), got ", vec);
  TORCH_CHECK((width + vec - 1) / vec <= kWarpLanes, "vec ", vec, " puts a row of ", width, " on more than 32 lanes");
  TORCH_CHECK(load == 1 || (load == vec && width % vec == 0), "load ", load, ": 1, or vec where vec divides W");
  const emulation::ScanSizes sizes =
      check_scan_inputs(u, delta, A, B, C, D, delta_bias, height, width, routes, /*param_routes=*/1);
  at::Tensor y = emulation::nan_output(u, sizes, y_fp32);
  RowsParams p{};
  emulation::fill_scan_params(p, u, delta, A, B, C, D, delta_bias, y, sizes, routes, route_index, height, width,
                              softplus);
  p.seg_lanes = static_cast<int>((width + vec - 1) / vec);
  p.maps_per_warp = kWarpLanes / p.seg_lanes;
  p.from_bottom = (route & kRouteFromBottom) ? 1 : 0;

  const int run_steps =
      launch_steps(kRowsStepsPlans, static_cast<int>(vec), static_cast<int>(load), prefetch_of(order), p, steps);
  g_last_steps = run_steps;
  g_vector_accesses = 0;
  GlobalShadow shadow(y.numel());
  with_host_element(u.scalar_type(), [&](auto element) {
    by_vec<decltype(element)>(p, static_cast<int>(vec), static_cast<int>(load), static_cast<int>(route), run_steps,
                              order, &shadow);
  });
  if (const int64_t missing = shadow.unwritten()) {
    fail(std::to_string(missing) + " cells of y were written by no lane");
  }
  return y;
}

template <class E, int kV, int kLoad, int kPrefetch, int kSteps, bool kFold>
void run_cross_items(const RowsFoldParams& fold, int64_t order, GlobalShadow* shadow) {
  const RowsParams& p = fold.rows;
  check_compiled_steps(kSteps, p);
  Schedule schedule(order);
  for (int64_t item : schedule.permutation(rows_items(p))) {
    RowsHostCtx ctx(item, schedule, shadow);
    if constexpr (kFold) {
      CrossRowsForward<E, kV, kLoad, kSteps, true>::run(ctx, fold, item);
    } else {
      CrossRowsForward<E, kV, kLoad, kSteps, false, kPrefetch>::run(ctx, p, item);
    }
  }
}

template <class E, int kV, int kLoad, int kPrefetch, bool kFold, int... kSteps>
bool run_cross_compiled(const RowsFoldParams& p, int steps, int64_t order, GlobalShadow* shadow,
                        std::integer_sequence<int, kSteps...>) {
  const auto one = [&](auto fixed) {
    constexpr int kFixed = decltype(fixed)::value;
    if constexpr (steps_compiled(kCrossStepsPlans, kV, kLoad, kPrefetch, kFixed)) {
      if (steps == kFixed) {
        run_cross_items<E, kV, kLoad, kPrefetch, kFixed, kFold>(p, order, shadow);
        return true;
      }
    }
    return false;
  };
  return (one(std::integral_constant<int, kSteps>{}) || ...);
}

template <class E, int kV, int kLoad, int kPrefetch, bool kFold>
void run_cross_depth(const RowsFoldParams& p, int steps, int64_t order, GlobalShadow* shadow) {
  if (steps < 0) return run_cross_items<E, kV, kLoad, kPrefetch, -1, kFold>(p, order, shadow);
  if (!run_cross_compiled<E, kV, kLoad, kPrefetch, kFold>(p, steps, order, shadow,
                                                          std::make_integer_sequence<int, kScanSteps + 1>{})) {
    fail("no four-route instance compiled for vec " + std::to_string(kV) + ", load " + std::to_string(kLoad) +
         ", prefetch " + std::to_string(kPrefetch) + ", " + std::to_string(steps) + " scan steps (kCrossStepsPlans)");
  }
}

// The four-route kernel's prefetch depths the emulation has: the plan's 1 and 2 (the folding instance: 1).
template <class E, int kV, int kLoad, bool kFold>
void run_cross(const RowsFoldParams& p, int prefetch, int steps, int64_t order, GlobalShadow* shadow) {
  switch (prefetch) {
    case 1:
      return run_cross_depth<E, kV, kLoad, 1, kFold>(p, steps, order, shadow);
    case 2:
      if constexpr (!kFold) return run_cross_depth<E, kV, kLoad, 2, kFold>(p, steps, order, shadow);
      break;
  }
  fail("no four-route instance with prefetch " + std::to_string(prefetch) + (kFold ? " (folding: 1)" : ""));
}

template <class E, bool kFold>
void cross_by_vec(const RowsFoldParams& p, int vec, int load, int prefetch, int steps, int64_t order,
                  GlobalShadow* shadow) {
  const bool vector = load == vec && vec > 1;
  switch (vec) {
    case 1:
      return run_cross<E, 1, 1, kFold>(p, prefetch, steps, order, shadow);
    case 2:
      return vector ? run_cross<E, 2, 2, kFold>(p, prefetch, steps, order, shadow)
                    : run_cross<E, 2, 1, kFold>(p, prefetch, steps, order, shadow);
    case 4:
      return vector ? run_cross<E, 4, 4, kFold>(p, prefetch, steps, order, shadow)
                    : run_cross<E, 4, 1, kFold>(p, prefetch, steps, order, shadow);
    default:
      fail("no four-route kernel with " + std::to_string(vec) + " columns per lane");
  }
}

// The checks of a folded call: the weight (4, dim, R) fp32 contiguous on the CPU, the low-rank delta
// (batch, 4 * R, L) in u's type, then check_scan_inputs' for the four-route layout with R planes of
// delta a route and one group (B, C (batch, 4, 1, L)). Returns the sizes and R.
std::pair<emulation::ScanSizes, int64_t> check_folded_inputs(
    const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
    const std::optional<at::Tensor>& D, const std::optional<at::Tensor>& delta_bias, const at::Tensor& weight,
    int64_t height, int64_t width) {
  TORCH_CHECK(weight.device().is_cpu() && weight.is_contiguous() && weight.scalar_type() == at::kFloat &&
                  weight.dim() == 3,
              "delta_proj_weight: expected a contiguous CPU float32 tensor (4, dim, R), got ", weight.scalar_type(),
              " of shape ", weight.sizes());
  TORCH_CHECK(u.dim() == 3 && weight.size(0) == 4 && weight.size(1) == u.size(1) && weight.size(2) >= 1,
              "delta_proj_weight: expected (4, dim, R) with dim = ", u.dim() == 3 ? u.size(1) : -1,
              " and R >= 1, got ", weight.sizes());
  const int64_t rank = weight.size(2);
  TORCH_CHECK(delta.device().is_cpu() && delta.is_contiguous() && delta.scalar_type() == u.scalar_type() &&
                  delta.dim() == 3 && delta.size(0) == u.size(0) && delta.size(1) == 4 * rank &&
                  delta.size(2) == u.size(2),
              "delta: with delta_proj_weight, expected the low-rank (batch, 4 * R, L) = (", u.size(0), ", ", 4 * rank,
              ", ", u.size(2), ") in u's type ", u.scalar_type(), ", got ", delta.scalar_type(), " of shape ",
              delta.sizes());
  const emulation::ScanSizes sizes =
      check_scan_inputs(u, delta, A, B, C, D, delta_bias, height, width, /*routes=*/4, /*param_routes=*/4, rank);
  TORCH_CHECK(sizes.groups == 1, "B, C: expected (batch, 4, 1, L) = (", sizes.batch, ", 4, 1, ", sizes.length,
              ") each, got ", B.sizes(), " and ", C.sizes());
  return {sizes, rank};
}

// y = the four-route (CROSS_ROUTES) 2D selective scan at N = 1, summed over the routes, on the
// emulated four-route kernel (CrossRowsForward) with vec columns per lane (vec | W) and load
// elements per access. u: (batch, dim, L); delta: (batch, 4 * dim, L); B, C: (batch, 4 * groups, 1,
// L); A: (4 * dim, 1); D, delta_bias: (4 * dim,) or None. With delta_proj_weight (4, dim, R) fp32
// the folding instance runs (kFold): delta is the low-rank (batch, 4 * R, L). prefetch: the rows of u
// and delta the kernel holds ahead (1 or 2; 1 when folding). Each cell of y must be
// written exactly twice, both times by one lane. Returns y (batch, dim, L) in u's type, or fp32
// with y_fp32.
at::Tensor rows_cross_forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
                              const at::Tensor& C, const std::optional<at::Tensor>& D,
                              const std::optional<at::Tensor>& delta_bias, bool softplus, int64_t height,
                              int64_t width, bool y_fp32, int64_t order, int64_t vec, int64_t load,
                              const std::optional<int64_t>& steps,
                              const std::optional<at::Tensor>& delta_proj_weight, int64_t prefetch) {
  TORCH_CHECK(vec == 1 || vec == 2 || vec == 4, "vec: expected 1, 2 or 4, got ", vec);
  TORCH_CHECK(width % vec == 0 && width / vec <= kWarpLanes, "vec ", vec, ": must divide W = ", width,
              " with W / vec <= 32 lanes");
  TORCH_CHECK(load == 1 || load == vec, "load ", load, ": 1 or vec");
  const bool fold = delta_proj_weight.has_value();
  TORCH_CHECK(prefetch >= 1 && prefetch <= 2 && (!fold || prefetch == 1), "prefetch: expected 1 or 2 (1 with ",
              "delta_proj_weight), got ", prefetch);
  const auto [sizes, rank] =
      fold ? check_folded_inputs(u, delta, A, B, C, D, delta_bias, *delta_proj_weight, height, width)
           : std::pair{check_scan_inputs(u, delta, A, B, C, D, delta_bias, height, width, /*routes=*/4,
                                         /*param_routes=*/4),
                       int64_t{0}};
  at::Tensor y = emulation::nan_output(u, sizes, y_fp32);
  RowsParams p{};
  emulation::fill_scan_params(p, u, delta, A, B, C, D, delta_bias, y, sizes, /*routes=*/4, /*route_index=*/0, height,
                              width, softplus);
  // The kernel steps the low-rank planes with 32-bit element offsets (CrossRowsForward::project_row).
  TORCH_CHECK(!fold || 4 * rank * sizes.length < (int64_t{1} << 31), "delta: 4 * R * L = ", 4 * rank * sizes.length,
              " low-rank elements per sample exceed the folding kernel's 32-bit offsets");
  if (fold) p.delta_planes = 4 * rank;
  p.seg_lanes = static_cast<int>(width / vec);
  p.maps_per_warp = kWarpLanes / p.seg_lanes;
  // (the plain instance reads .rows only)
  const RowsFoldParams args{p, fold ? delta_proj_weight->data_ptr<float>() : nullptr, static_cast<int>(rank)};

  const int depth = static_cast<int>(prefetch);
  const int run_steps =
      launch_steps(kCrossStepsPlans, static_cast<int>(vec), static_cast<int>(load), depth, p, steps);
  g_last_steps = run_steps;
  g_vector_accesses = 0;
  GlobalShadow shadow(y.numel(), 2);
  with_host_element(u.scalar_type(), [&](auto element) {
    if (fold) {
      cross_by_vec<decltype(element), true>(args, static_cast<int>(vec), static_cast<int>(load), depth, run_steps,
                                            order, &shadow);
    } else {
      cross_by_vec<decltype(element), false>(args, static_cast<int>(vec), static_cast<int>(load), depth, run_steps,
                                             order, &shadow);
    }
  });
  if (const int64_t missing = shadow.unwritten()) {
    fail(std::to_string(missing) + " cells of y were not written twice (once per sweep)");
  }
  return y;
}

// One synthetic warp that breaks (or keeps) a rule of the checker; throws when the checker objects.
// Scenarios: two_lanes_store_one_cell, store_twice, shuffle_inside_lane_phase, nested_lane_phase,
// out_of_bounds_load, misaligned_vector_load, store_outside_lane_phase (throw); one_store_per_lane
// (passes).
void rows_self_check(const std::string& scenario) {
  alignas(16) float data[2 * kWarpLanes + 4] = {};
  GlobalShadow shadow(2 * kWarpLanes);
  Schedule schedule(3);
  RowsHostCtx ctx(0, schedule, &shadow);
  const auto out = ctx.global(static_cast<float*>(data), 2 * kWarpLanes);
  const auto in = ctx.global(static_cast<const float*>(data), 2 * kWarpLanes);
  float values[kWarpLanes] = {}, moved[kWarpLanes];
  float one = 1.f;
  float four[4];
  if (scenario == "one_store_per_lane") {
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane, &one); });
  } else if (scenario == "two_lanes_store_one_cell") {
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane / 2, &one); });
  } else if (scenario == "store_twice") {
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane, &one); });
    ctx.each_lane([&](int lane) { ctx.store<1>(out, lane, &one); });
  } else if (scenario == "shuffle_inside_lane_phase") {
    ctx.each_lane([&](int) { ctx.shfl_up(moved, values, 1); });
  } else if (scenario == "nested_lane_phase") {
    ctx.each_lane([&](int) { ctx.each_lane([](int) {}); });
  } else if (scenario == "out_of_bounds_load") {
    ctx.each_lane([&](int lane) { ctx.load<4>(in, 2 * kWarpLanes - 4 + 4 * (lane == 5), four); });
  } else if (scenario == "misaligned_vector_load") {
    ctx.each_lane([&](int lane) { ctx.load<4>(in, lane == 7 ? 2 : 0, four); });
  } else if (scenario == "store_outside_lane_phase") {
    ctx.store<1>(out, 0, &one);
  } else {
    fail("unknown self-check scenario " + scenario);
  }
}

}  // namespace
}  // namespace rows
}  // namespace vmamba2d

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace vmamba2d::rows;
  m.doc() = "Host emulation of the v4 row-streaming scan kernels (tests only)";
  m.def("rows_forward", &rows_forward, "RS forward on the host emulation", pybind11::arg("u"),
        pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"), pybind11::arg("D"),
        pybind11::arg("delta_bias"), pybind11::arg("softplus"), pybind11::arg("height"), pybind11::arg("width"),
        pybind11::arg("route"), pybind11::arg("y_fp32"), pybind11::arg("order"), pybind11::arg("vec"),
        pybind11::arg("load"), pybind11::arg("routes") = 1, pybind11::arg("route_index") = 0,
        pybind11::arg("steps") = std::nullopt);
  m.def("rows_cross_forward", &rows_cross_forward, "four-route RS forward on the host emulation",
        pybind11::arg("u"), pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"),
        pybind11::arg("D"), pybind11::arg("delta_bias"), pybind11::arg("softplus"), pybind11::arg("height"),
        pybind11::arg("width"), pybind11::arg("y_fp32"), pybind11::arg("order"), pybind11::arg("vec"),
        pybind11::arg("load"), pybind11::arg("steps") = std::nullopt,
        pybind11::arg("delta_proj_weight") = std::nullopt, pybind11::arg("prefetch") = 1);
  m.def("rows_vector_accesses", [] { return g_vector_accesses; },
        "vector global accesses of the last rows_forward call on this thread");
  m.def("rows_self_check", &rows_self_check, "run one checker scenario", pybind11::arg("scenario"));
  m.def("rows_last_steps", [] { return g_last_steps; },
        "scan steps the last rows_forward / rows_cross_forward call's kernel was compiled for (-1: run time)");
  m.def("rows_scan_steps", [](int64_t seg_lanes) { return rows_scan_steps(static_cast<int>(seg_lanes)); },
        "rows_scan_steps(seg_lanes) of scan2d_rows_common.h: the scan steps a segment needs",
        pybind11::arg("seg_lanes"));
  const auto plans = [](const auto& table) {
    std::vector<std::tuple<int, int, int, int>> out;
    for (const StepsPlan& plan : table) out.emplace_back(plan.vec, plan.load, plan.prefetch, plan.steps);
    return out;
  };
  m.def("rows_compiled_steps_plans",
        [plans] { return std::make_pair(plans(kRowsStepsPlans), plans(kCrossStepsPlans)); },
        "(single-route, four-route) (vec, load, prefetch, steps) instances run with the steps compiled in");
}
