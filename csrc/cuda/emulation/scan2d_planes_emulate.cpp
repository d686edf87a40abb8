// Host emulation of the v4 one-plane-per-lane forward (scan2d_planes.cuh), built by the C++
// compiler alone as a test-only torch extension (tests/support/cuda_emulation_build.py, include path
// csrc/cuda; this folder is outside setup.py's glob of the nvcc-built extension's sources). The
// kernel body runs CTA by CTA on the CPU: CTAs in a chosen order, the threads of a CTA one after
// another in every phase (forward, reversed or shuffled). Checks, each a RuntimeError naming what
// went wrong:
//   * asynchronous copies: issued at one point, the bytes land only at the issuing thread's wait
//     (until then they are in flight: reading or writing them fails); a copy into shared bytes that
//     any thread read or wrote since the last barrier fails (the buffer is still being read); a copy
//     never waited for fails at the end of the CTA; source and destination bounds and alignment;
//   * shared memory: a byte written by one thread and read or written by another with no barrier
//     between them (landed copies count as the issuing thread's writes), bounds;
//   * global memory: bounds, alignment of every vector store, each cell of y written exactly once;
//   * barriers only between per-thread phases, phases not nested.
// y starts filled with NaN so a cell the kernel did not write also shows in the results.
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "emulation/host_emulation.h"
#include "scan2d_planes.cuh"

namespace vmamba2d {
namespace planes {
namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("PL emulation: " + what); }

using emulation::check_scan_inputs;
using emulation::global_bounds_error;
using emulation::Schedule;
using emulation::with_host_element;

// Counters of the last emulation call on this thread: copies issued, y stores of copy_bytes.
thread_local int64_t g_copies = 0;
thread_local int64_t g_wide_stores = 0;

// A bounds-checked global buffer; y carries the writer of each element.
template <class V>
struct HostView {
  V* base = nullptr;
  int64_t extent = 0;
  std::vector<int64_t>* writer = nullptr;  // y only: global thread id of each element's store
};

// The emulation's execution context of one CTA (PlanesDeviceCtx's interface).
class PlanesHostCtx {
 public:
  PlanesHostCtx(int64_t block, int threads, int smem_bytes, Schedule& schedule, int bug)
      : block_(block), threads_(threads), schedule_(schedule), bug_(bug), data_(smem_bytes, 0xA5),
        writer_(smem_bytes, -1), writer_epoch_(smem_bytes, -1), reader_(smem_bytes, -1),
        reader_epoch_(smem_bytes, -1), in_flight_(smem_bytes, -1), defined_(smem_bytes, 0), pending_(threads) {}

  int bug() const { return bug_; }

  template <class F>
  void each_thread(F&& f) {
    if (thread_ >= 0) fail("each_thread nested inside another per-thread phase");
    for (int t : schedule_.permutation(threads_)) {
      thread_ = t;
      f(t);
    }
    thread_ = -1;
  }

  void barrier() {
    if (thread_ >= 0) fail("__syncthreads inside a per-thread phase (not every thread reaches it)");
    ++epoch_;
  }

  template <class V>
  std::remove_const_t<V> read(const HostView<V>& view, int64_t i) const {
    check_global(view, i, 1, "load");
    return view.base[i];
  }

  template <int kBytes, class V>
  void copy_async(int dst, const HostView<V>& src, int64_t at, int bytes) {
    const int t = current("cp.async");
    constexpr int64_t kElem = static_cast<int64_t>(sizeof(V));
    if (bytes <= 0 || bytes > kBytes || bytes % kElem != 0) {
      fail("cp.async of " + std::to_string(bytes) + " source bytes in a " + std::to_string(kBytes) + "-byte copy");
    }
    check_global(src, at, bytes / kElem, "cp.async source");
    if (reinterpret_cast<uintptr_t>(src.base + at) % kBytes != 0) {
      fail("misaligned cp.async source: element " + std::to_string(at) + " is not on a " + std::to_string(kBytes) +
           "-byte boundary");
    }
    check_shared(dst, kBytes, "cp.async destination");
    if (dst % kBytes != 0) fail("misaligned cp.async destination: shared byte " + std::to_string(dst));
    for (int b = dst; b < dst + kBytes; ++b) {
      if (in_flight_[b] >= 0) {
        fail("cp.async by thread " + std::to_string(t) + " into shared byte " + std::to_string(b) +
             ", still in flight from thread " + std::to_string(in_flight_[b]) + "'s copy");
      }
      const bool read_now = reader_epoch_[b] == epoch_ && reader_[b] != kNone;
      const bool written_now = writer_epoch_[b] == epoch_ && writer_[b] >= 0;
      if (read_now || written_now) {
        fail("cp.async by thread " + std::to_string(t) + " into shared byte " + std::to_string(b) + ", " +
             (read_now ? "read" : "written") + " since the last barrier: an overwrite of a buffer still being read");
      }
      in_flight_[b] = t;
    }
    // cp.async zero-fills past `bytes`; the sm_75 path (a load and a shared store) leaves those bytes as
    // they were. The kernel must never read them: they land undefined, and a read of them fails.
    Pending copy{dst, kBytes, bytes, std::vector<unsigned char>(kBytes, 0)};
    std::memcpy(copy.bytes.data(), src.base + at, bytes);
    pending_[t].push_back(std::move(copy));
    ++g_copies;
  }
  void commit() { current("cp.async.commit_group"); }
  // The calling thread's copies land: its writes, in this barrier interval.
  void wait_all() {
    const int t = current("cp.async.wait_group");
    for (const Pending& copy : pending_[t]) {
      std::memcpy(data_.data() + copy.dst, copy.bytes.data(), copy.size);
      for (int b = copy.dst; b < copy.dst + copy.size; ++b) {
        in_flight_[b] = -1;
        writer_[b] = t;
        writer_epoch_[b] = epoch_;
        defined_[b] = b < copy.dst + copy.source_bytes;
      }
    }
    pending_[t].clear();
  }

  template <class T>
  T lds(int at) {
    const int t = current("shared load");
    check_shared(at, sizeof(T), "shared load");
    for (int b = at; b < at + static_cast<int>(sizeof(T)); ++b) {
      if (in_flight_[b] >= 0) {
        fail("thread " + std::to_string(t) + " read shared byte " + std::to_string(b) + " before its cp.async (thread " +
             std::to_string(in_flight_[b]) + ") was waited for");
      }
      if (!defined_[b]) {
        fail("thread " + std::to_string(t) + " read shared byte " + std::to_string(b) +
             ", which no store and no copied source byte defined (a copy's tail past its source bytes, or memory "
             "never written)");
      }
      if (writer_epoch_[b] == epoch_ && writer_[b] >= 0 && writer_[b] != t) {
        fail("shared-memory race: thread " + std::to_string(t) + " read byte " + std::to_string(b) + " written by thread " +
             std::to_string(writer_[b]) + " with no barrier between");
      }
      if (reader_epoch_[b] != epoch_) {
        reader_[b] = t;
        reader_epoch_[b] = epoch_;
      } else if (reader_[b] != t) {
        reader_[b] = kMany;
      }
    }
    T v;
    std::memcpy(&v, data_.data() + at, sizeof(T));
    return v;
  }
  template <class T>
  void sts(int at, T v) {
    const int t = current("shared store");
    check_shared(at, sizeof(T), "shared store");
    for (int b = at; b < at + static_cast<int>(sizeof(T)); ++b) {
      if (in_flight_[b] >= 0) fail("shared store into byte " + std::to_string(b) + " of a copy in flight");
      const bool other_wrote = writer_epoch_[b] == epoch_ && writer_[b] >= 0 && writer_[b] != t;
      const bool other_read = reader_epoch_[b] == epoch_ && reader_[b] != kNone && reader_[b] != t;
      if (other_wrote || other_read) {
        fail("shared-memory race: thread " + std::to_string(t) + " wrote byte " + std::to_string(b) + " " +
             (other_wrote ? "written" : "read") + " by another thread with no barrier between");
      }
      writer_[b] = t;
      writer_epoch_[b] = epoch_;
      defined_[b] = 1;
    }
    std::memcpy(data_.data() + at, &v, sizeof(T));
  }

  template <int kBytes, class V>
  void shared_to_global(const HostView<V>& y, int64_t at, int from) {
    constexpr int64_t kElem = static_cast<int64_t>(sizeof(V));
    static_assert(kBytes % sizeof(V) == 0, "whole elements");
    unsigned char bytes[kBytes];
    for (int b = 0; b < kBytes; ++b) bytes[b] = lds<unsigned char>(from + b);
    check_global(y, at, kBytes / kElem, "store");
    if (reinterpret_cast<uintptr_t>(y.base + at) % kBytes != 0) {
      fail("misaligned " + std::to_string(kBytes) + "-byte global store at element " + std::to_string(at));
    }
    const int64_t who = block_ * threads_ + thread_;
    for (int64_t e = at; e < at + kBytes / kElem; ++e) {
      int64_t& w = (*y.writer)[e];
      if (w >= 0) {
        fail("y element " + std::to_string(e) + " written twice (threads " + std::to_string(w) + " and " +
             std::to_string(who) + ")");
      }
      w = who;
    }
    std::memcpy(y.base + at, bytes, kBytes);
    if (kBytes > kElem) ++g_wide_stores;
  }

  // After the CTA: every copy waited for.
  void finish() const {
    for (int t = 0; t < threads_; ++t) {
      if (!pending_[t].empty()) fail("thread " + std::to_string(t) + " issued cp.async copies it never waited for");
    }
  }

 private:
  struct Pending {
    int dst;
    int size;
    int source_bytes;  // bytes read from global memory; the rest of the copy is undefined on sm_75
    std::vector<unsigned char> bytes;
  };
  static constexpr int kNone = -1;
  static constexpr int kMany = -2;

  int current(const char* what) const {
    if (thread_ < 0) fail(std::string(what) + " outside a per-thread phase");
    return thread_;
  }
  void check_shared(int at, int bytes, const char* what) const {
    if (at < 0 || at + bytes > static_cast<int>(data_.size())) {
      fail(std::string("out-of-bounds ") + what + ": bytes " + std::to_string(at) + " .. " +
           std::to_string(at + bytes - 1) + " of " + std::to_string(data_.size()) + " bytes of shared memory");
    }
  }
  template <class V>
  static void check_global(const HostView<V>& view, int64_t i, int64_t count, const char* what) {
    const std::string bounds = global_bounds_error(view.base, view.extent, i, count, what);
    if (!bounds.empty()) fail(bounds);
  }

  int64_t block_;
  int threads_;
  Schedule& schedule_;
  int bug_;
  int thread_ = -1;
  int epoch_ = 0;
  std::vector<unsigned char> data_;
  std::vector<int> writer_, writer_epoch_, reader_, reader_epoch_, in_flight_;
  std::vector<char> defined_;
  std::vector<std::vector<Pending>> pending_;
};

template <class Raw>
struct HostViews {
  HostView<const Raw> u, delta, B, C;
  HostView<const float> A, bias, skip;
  HostView<Raw> y_t;
  HostView<float> y_f;
};

template <class E, int kH, int kW, int kRoute, int kCopy>
void run_grid(const PlanesParams& p, int grid, int64_t order, int bug, const HostViews<typename E::Raw>& v) {
  const int smem = planes_layout(p, static_cast<int>(sizeof(typename E::Raw))).total;
  Schedule schedule(order);
  for (int block : schedule.permutation(grid)) {
    PlanesHostCtx ctx(block, p.chunk, smem, schedule, bug);
    PlanesForward<E, kH, kW, kRoute, kCopy>::run(ctx, v, p, block, grid);
    ctx.finish();
  }
}

// The emulation's instances: the run-time geometry at each copy width, and, unless `compiled` is
// false, the GPU entry's compiled-in geometries (VMAMBA2D_PL_HEIGHT / _WIDTH / _ROUTE / _COPY) that
// the model and each scan form take: the 7 x 7 plane in all 16 route codes with 16-byte copies and
// route 0 with 8- and 4-byte copies; 1 x 64 (column by column), 64 x 1 and 8 x 8 (line by line) at
// route 0 with 16-byte copies. Another compiled-in geometry is the same code with other constants.
template <class E, int kCopy, int... kRoutes>
bool run_fixed_7x7(const PlanesParams& p, int grid, int64_t order, int bug, const HostViews<typename E::Raw>& v,
                   std::integer_sequence<int, kRoutes...>) {
  return ((p.route == kRoutes ? (run_grid<E, 7, 7, kRoutes, kCopy>(p, grid, order, bug, v), true) : false) || ...);
}

template <class E, int kCopy>
bool run_fixed(const PlanesParams& p, int grid, int64_t order, int bug, const HostViews<typename E::Raw>& v) {
  if (p.height == 7 && p.width == 7) {
    if constexpr (kCopy == 16) {
      return run_fixed_7x7<E, kCopy>(p, grid, order, bug, v, std::make_integer_sequence<int, 16>{});
    } else {
      return run_fixed_7x7<E, kCopy>(p, grid, order, bug, v, std::integer_sequence<int, 0>{});
    }
  }
  if constexpr (kCopy == 16) {
    if (p.route != 0) return false;
    if (p.height == 1 && p.width == 64) return run_grid<E, 1, 64, 0, 16>(p, grid, order, bug, v), true;
    if (p.height == 64 && p.width == 1) return run_grid<E, 64, 1, 0, 16>(p, grid, order, bug, v), true;
    if (p.height == 8 && p.width == 8) return run_grid<E, 8, 8, 0, 16>(p, grid, order, bug, v), true;
  }
  return false;
}

template <class E, int kCopy>
void run_copy(const PlanesParams& p, int grid, int64_t order, int bug, bool compiled,
              const HostViews<typename E::Raw>& v) {
  if (compiled && run_fixed<E, kCopy>(p, grid, order, bug, v)) return;
  run_grid<E, -1, -1, -1, kCopy>(p, grid, order, bug, v);
}

template <class E>
void by_copy(const PlanesParams& p, int grid, int64_t order, int bug, bool compiled,
             const HostViews<typename E::Raw>& v) {
  switch (p.copy_bytes) {
    case 16:
      return run_copy<E, 16>(p, grid, order, bug, compiled, v);
    case 8:
      return run_copy<E, 8>(p, grid, order, bug, compiled, v);
    case 4:
      return run_copy<E, 4>(p, grid, order, bug, compiled, v);
    default:
      fail("copy_bytes: expected 16, 8 or 4, got " + std::to_string(p.copy_bytes));
  }
}

template <class V>
HostView<V> view_of(const at::Tensor& t, int64_t offset_elements, int64_t count) {
  HostView<V> view;
  view.base = static_cast<V*>(t.data_ptr()) + offset_elements;
  view.extent = count;
  return view;
}

// y = the route's 2D selective scan (N = 1) of the inputs, run on the emulated PL kernel: chunks of
// `chunk` maps, `grid` persistent CTAs, copy_bytes per copy, CTAs and threads in `order` (0 as
// is, 1 reversed, >= 2 shuffled with that seed), `bug` one of the injected staging bugs (0: none).
// u: (batch, dim, L); delta: (batch, routes * dim, L); B, C: (batch, routes * groups, 1, L); A:
// (dim, 1); D, delta_bias: (dim,) or None. With routes > 1 (the four-route op's layout) the launch
// reads route route_index's planes of delta, B and C. Returns y (batch, dim, L) in u's type, or
// fp32 with y_fp32.
at::Tensor planes_forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
                          const at::Tensor& C, const std::optional<at::Tensor>& D,
                          const std::optional<at::Tensor>& delta_bias, bool softplus, int64_t height, int64_t width,
                          int64_t route, bool y_fp32, int64_t order, int64_t chunk, int64_t grid, int64_t copy_bytes,
                          int64_t bug, int64_t routes, int64_t route_index, bool compiled_geometry) {
  TORCH_CHECK(route >= 0 && route < 16, "route: expected a route code 0 .. 15, got ", route);
  TORCH_CHECK(height >= 1 && width >= 1 && height * width <= kMaxCells, "height, width: expected a plane of 1 .. ",
              kMaxCells, " cells, got ", height, " x ", width);
  TORCH_CHECK(chunk >= 1 && chunk <= 1024, "chunk: expected 1 .. 1024 threads, got ", chunk);
  TORCH_CHECK(grid >= 1, "grid: expected at least one CTA, got ", grid);
  TORCH_CHECK(copy_bytes == 4 || copy_bytes == 8 || copy_bytes == 16, "copy_bytes: expected 4, 8 or 16, got ",
              copy_bytes);
  TORCH_CHECK(bug >= kBugNone && bug <= kBugRefillWhileRead, "bug: expected 0 .. ", int(kBugRefillWhileRead), ", got ",
              bug);
  TORCH_CHECK(routes >= 1 && route_index >= 0 && route_index < routes, "route_index: expected 0 <= it < routes = ",
              routes, ", got ", route_index);
  const emulation::ScanSizes sizes =
      check_scan_inputs(u, delta, A, B, C, D, delta_bias, height, width, routes, /*param_routes=*/1);
  const int64_t batch = sizes.batch, dim = sizes.dim, length = sizes.length, groups = sizes.groups;
  TORCH_CHECK(batch * dim < (int64_t{1} << 31), "batch * dim: expected fewer than 2^31 maps");
  at::Tensor y = emulation::nan_output(u, sizes, y_fp32);
  PlanesParams p{};
  emulation::fill_scan_params(p, u, delta, A, B, C, D, delta_bias, y, sizes, routes, route_index, height, width,
                              softplus);
  p.route = static_cast<int>(route);
  p.chunk = static_cast<int>(chunk);
  p.copy_bytes = static_cast<int>(copy_bytes);
  // The route's planes of delta, B, C start route_index planes in (the views' extents reach the end
  // of the tensors: the rounding of a copy's start may read before them, never before the tensor).
  const int64_t elem = u.element_size();
  const int64_t delta_off = route_index * dim * length, bc_off = route_index * groups * length;
  TORCH_CHECK(delta_off * elem % copy_bytes == 0 && bc_off * elem % copy_bytes == 0,
              "route_index: the route's planes must start on a copy_bytes boundary");
  for (const void* ptr : {p.u, p.delta, p.B, p.C, static_cast<const void*>(p.y)}) {
    TORCH_CHECK(reinterpret_cast<uintptr_t>(ptr) % copy_bytes == 0, "copy_bytes ", copy_bytes,
                ": every tensor must be aligned to it");
  }
  const int64_t y_count = batch * dim * length;
  std::vector<int64_t> writer(y_count, -1);

  g_copies = 0;
  g_wide_stores = 0;
  auto launch = [&](auto element) {
    using E = decltype(element);
    using Raw = typename E::Raw;
    HostViews<Raw> v;
    v.u = view_of<const Raw>(u, 0, u.numel());
    v.delta = view_of<const Raw>(delta, delta_off, delta.numel() - delta_off);
    v.B = view_of<const Raw>(B, bc_off, B.numel() - bc_off);
    v.C = view_of<const Raw>(C, bc_off, C.numel() - bc_off);
    v.A = view_of<const float>(A, 0, dim);
    if (delta_bias) v.bias = view_of<const float>(*delta_bias, 0, dim);
    if (D) v.skip = view_of<const float>(*D, 0, dim);
    if (p.y_fp32) {  // y's type, as the launch sets it (fill_scan_params)
      v.y_f = view_of<float>(y, 0, y_count);
      v.y_f.writer = &writer;
    } else {
      v.y_t = view_of<Raw>(y, 0, y_count);
      v.y_t.writer = &writer;
    }
    by_copy<E>(p, static_cast<int>(grid), order, static_cast<int>(bug), compiled_geometry, v);
  };
  with_host_element(u.scalar_type(), launch);
  const int64_t missing = std::count(writer.begin(), writer.end(), int64_t{-1});
  if (missing) fail(std::to_string(missing) + " cells of y were written by no thread");
  return y;
}

// The checker on one synthetic CTA of two threads, one rule per case (a case that breaks its rule
// must fail; "copied_bytes" must pass): thread 0 copies 6 source bytes of a 16-byte piece, waits, a
// barrier follows, then thread 1 reads
//   "copied_bytes"   the 6 copied bytes;
//   "copy_tail"      byte 6, past the copy's source bytes (zero on sm_80+, stale on sm_75);
//   "never_written"  a byte of shared memory no store and no copy wrote.
void planes_checker_self_check(const std::string& scenario) {
  if (scenario != "copied_bytes" && scenario != "copy_tail" && scenario != "never_written") {
    TORCH_CHECK(false, "scenario: expected copied_bytes, copy_tail or never_written, got ", scenario);
  }
  alignas(16) static const unsigned short source[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const HostView<const unsigned short> view{source, 8, nullptr};
  Schedule schedule(0);
  PlanesHostCtx ctx(0, 2, 64, schedule, kBugNone);
  ctx.each_thread([&](int t) {
    if (t == 0) {
      ctx.copy_async<16>(16, view, 0, 6);
      ctx.commit();
      ctx.wait_all();
    }
  });
  ctx.barrier();
  ctx.each_thread([&](int t) {
    if (t != 1) return;
    if (scenario == "copied_bytes") {
      for (int b = 16; b < 22; ++b) (void)ctx.lds<unsigned char>(b);
    } else if (scenario == "copy_tail") {
      (void)ctx.lds<unsigned char>(22);
    } else {
      (void)ctx.lds<unsigned char>(40);
    }
  });
  ctx.finish();
}

// Bytes of dynamic shared memory of a launch (planes_layout(...).total), for the launcher's mirror.
int64_t planes_smem_bytes(int64_t batch, int64_t dim, int64_t groups, int64_t height, int64_t width,
                          int64_t delta_planes, int64_t bc_planes, int64_t chunk, int64_t copy_bytes, int64_t elem,
                          bool y_fp32) {
  PlanesParams p{};
  p.batch = static_cast<int>(batch);
  p.dim = static_cast<int>(dim);
  p.groups = static_cast<int>(groups);
  p.height = static_cast<int>(height);
  p.width = static_cast<int>(width);
  p.delta_planes = delta_planes;
  p.bc_planes = bc_planes;
  p.chunk = static_cast<int>(chunk);
  p.copy_bytes = static_cast<int>(copy_bytes);
  p.y_fp32 = y_fp32 ? 1 : 0;
  return planes_layout(p, static_cast<int>(elem)).total;
}

}  // namespace
}  // namespace planes
}  // namespace vmamba2d

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace vmamba2d::planes;
  m.doc() = "Host emulation of the v4 one-plane-per-lane scan kernel (tests only)";
  m.def("planes_forward", &planes_forward, "PL forward on the host emulation", pybind11::arg("u"),
        pybind11::arg("delta"), pybind11::arg("A"), pybind11::arg("B"), pybind11::arg("C"), pybind11::arg("D"),
        pybind11::arg("delta_bias"), pybind11::arg("softplus"), pybind11::arg("height"), pybind11::arg("width"),
        pybind11::arg("route"), pybind11::arg("y_fp32"), pybind11::arg("order"), pybind11::arg("chunk"),
        pybind11::arg("grid"), pybind11::arg("copy_bytes"), pybind11::arg("bug") = 0, pybind11::arg("routes") = 1,
        pybind11::arg("route_index") = 0, pybind11::arg("compiled_geometry") = true);
  m.def("planes_smem_bytes", &planes_smem_bytes, "planes_layout(...).total of a launch", pybind11::arg("batch"),
        pybind11::arg("dim"), pybind11::arg("groups"), pybind11::arg("height"), pybind11::arg("width"),
        pybind11::arg("delta_planes"), pybind11::arg("bc_planes"), pybind11::arg("chunk"),
        pybind11::arg("copy_bytes"), pybind11::arg("elem"), pybind11::arg("y_fp32"));
  m.def("planes_checker_self_check", &planes_checker_self_check,
        "one synthetic CTA per checker rule (raises where the rule catches the case)", pybind11::arg("scenario"));
  m.def("planes_counters", [] { return std::make_pair(g_copies, g_wide_stores); },
        "(copies issued, copy_bytes-wide y stores) of the last planes_forward call on this thread");
}
