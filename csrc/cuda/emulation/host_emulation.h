// Scaffolding shared by the host emulations of the CUDA kernels (selective_scan_2d_emulate.cpp for
// v3, emulation/scan2d_*_emulate.cpp for the v4 kernels): the order in which blocks, warps, threads
// and lanes run, the element types' host traits, and the checks of the CPU tensors a test passes.
// Host only (C++ compiler and torch); include it as "emulation/host_emulation.h" with csrc/cuda on
// the include path. Each emulation keeps its own race detector: what it records follows the memory
// its kernel uses (shared words, shared bytes with copies in flight, global cells); the RS
// emulations (forward, backward) share the warp context HostWarpCtx.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
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

// A bounds-checked view of a global buffer (`extent` elements from `base`) from element `origin`
// on; a writable buffer's view carries its shadow, the record of the lanes that wrote and read it.
template <class V, class Shadow>
struct GlobalView {
  V* base = nullptr;
  int64_t extent = 0;
  Shadow* shadow = nullptr;
  int64_t origin = 0;
};

// The host form of one warp of RowsDeviceCtx (scan2d_rows_device.cuh), the context the RS kernels
// run in: per-lane phases that run the 32 lanes one after another in the schedule's order, shuffles
// between those phases, and global memory through views. Every global access must come from inside
// a per-lane phase, stay in bounds and, as a vector, be aligned to its bytes (at most 16); it is
// reported to the buffer's shadow (read / write(element, global lane id)), and a store needs one.
// Derived gives the shadow of a writable buffer, shadow_of(ptr, count), and whatever else its
// kernels use; kFail throws the emulation's error. vector_accesses, unless null, counts the vector
// accesses.
template <class Derived, class Shadow, void (*kFail)(const std::string&)>
class HostWarpCtx {
 public:
  static constexpr int kLanes = 32;
  template <class V>
  using View = GlobalView<V, Shadow>;

  HostWarpCtx(int64_t warp, Schedule& schedule, int64_t* vector_accesses)
      : warp_(warp), schedule_(schedule), vector_accesses_(vector_accesses) {}

  int slot(int lane) const { return lane; }

  template <class F>
  void each_lane(F&& f) {
    if (lane_ >= 0) kFail("each_lane nested inside another per-lane phase");
    for (int64_t lane : schedule_.permutation(int64_t{kLanes})) {
      lane_ = static_cast<int>(lane);
      f(lane_);
    }
    lane_ = -1;
  }

  template <class V>
  View<V> global(V* ptr, int64_t count) const {
    View<V> view{ptr, count, nullptr};
    if constexpr (!std::is_const_v<V>) view.shadow = static_cast<const Derived*>(this)->shadow_of(ptr, count);
    return view;
  }
  template <class V>
  View<V> offset(const View<V>& view, int64_t at) const {
    View<V> moved = view;
    moved.origin += at;
    return moved;
  }
  template <class V>
  View<V> pin(const View<V>& view) const {
    return view;
  }
  int pin(int v) const { return v; }

  template <class V>
  std::remove_const_t<V> read(const View<V>& view, int64_t at) const {
    std::remove_const_t<V> v;
    load<1>(view, at, &v);
    return v;
  }
  template <int kCount, class V>
  void load(const View<V>& view, int64_t at, std::remove_const_t<V>* dst) const {
    const int64_t i = view.origin + at;
    check(view, i, kCount, "load");
    if (view.shadow != nullptr) {
      for (int k = 0; k < kCount; ++k) view.shadow->read(i + k, thread());
    }
    std::memcpy(dst, view.base + i, kCount * sizeof(V));
  }
  template <int kCount, class V>
  void store(const View<V>& view, int64_t at, const V* src) const {
    static_assert(!std::is_const_v<V>, "store into a read-only buffer");
    const int64_t i = view.origin + at;
    check(view, i, kCount, "store");
    if (view.shadow == nullptr) kFail("store into a buffer that is not an output");
    for (int k = 0; k < kCount; ++k) view.shadow->write(i + k, thread());
    std::memcpy(view.base + i, src, kCount * sizeof(V));
  }
  template <int kCount, class V>
  void store_if(bool pred, const View<V>& view, int64_t at, const V* src) const {
    if (pred) store<kCount>(view, at, src);
  }

  void shfl_up(float (&out)[kLanes], const float (&in)[kLanes], int delta) const {
    warp_phase("__shfl_up_sync");
    for (int l = 0; l < kLanes; ++l) out[l] = l >= delta ? in[l - delta] : in[l];
  }
  void shfl_down(float (&out)[kLanes], const float (&in)[kLanes], int delta) const {
    warp_phase("__shfl_down_sync");
    for (int l = 0; l < kLanes; ++l) out[l] = l + delta < kLanes ? in[l + delta] : in[l];
  }

 protected:
  // The lane of the per-lane phase running now; -1 between phases.
  int lane() const { return lane_; }
  void warp_phase(const char* what) const {
    if (lane_ >= 0) kFail(std::string(what) + " inside a per-lane phase (not every lane of the warp reaches it)");
  }

 private:
  int64_t thread() const {
    if (lane_ < 0) kFail("global memory touched outside a per-lane phase");
    return warp_ * kLanes + lane_;
  }
  template <class V>
  void check(const View<V>& view, int64_t i, int count, const char* what) const {
    const std::string bounds = global_bounds_error(view.base, view.extent, i, count, what);
    if (!bounds.empty()) kFail(bounds);
    const size_t bytes = count * sizeof(V);
    const size_t align = bytes > 16 ? 16 : bytes;
    if (reinterpret_cast<uintptr_t>(view.base + i) % align != 0) {
      kFail(std::string("misaligned vector ") + what + ": element " + std::to_string(i) + " is not on a " +
            std::to_string(align) + "-byte boundary");
    }
    if (count > 1 && vector_accesses_ != nullptr) ++*vector_accesses_;
  }

  int64_t warp_;
  Schedule& schedule_;
  int64_t* vector_accesses_;
  int lane_ = -1;
};

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
// every route's); H * W = L. delta_planes >= 0: delta holds that many planes a route instead of dim
// (the low-rank step sizes, (batch, routes * R, L)), the rest as above.
inline ScanSizes check_scan_inputs(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                   const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                                   const std::optional<at::Tensor>& delta_bias, int64_t height, int64_t width,
                                   int64_t routes, int64_t param_routes, int64_t delta_planes = -1) {
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
  const int64_t planes = delta_planes < 0 ? dim : delta_planes;
  TORCH_CHECK(delta.size(0) == batch && delta.size(1) == routes * planes && delta.size(2) == length,
              "delta: expected (batch, routes * ", delta_planes < 0 ? "dim" : "R", ", L) = (", batch, ", ",
              routes * planes, ", ", length, "), got ", delta.sizes());
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
// strides routes * dim and routes * groups) and writes y. y_fp32 follows y's type, as the launchers
// set it (an fp32 y, also of fp32 inputs, takes the kernels' fp32-output instance, as on the GPU).
template <class Params>
void fill_scan_params(Params& p, const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                      const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                      const std::optional<at::Tensor>& delta_bias, const at::Tensor& y, const ScanSizes& sizes,
                      int64_t routes, int64_t route_index, int64_t height, int64_t width, bool softplus) {
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
  p.y_fp32 = y.scalar_type() == at::kFloat ? 1 : 0;
}

}  // namespace emulation
}  // namespace vmamba2d
