// Runs scan2d_kernel.cuh on the CPU: every block of the grid in turn, and inside a block every
// (warp, lane) in turn between barriers, in forward, reversed or shuffled order. Checks, each a
// std::runtime_error (RuntimeError in Python) naming what went wrong:
//   * shared-memory races: every access is recorded with its thread, barrier interval and the
//     thread's warp-sync interval; a read-after-write, write-after-read or write-after-write
//     between two threads that neither a barrier nor (same warp) a __syncwarp orders is a race;
//     so is a read of shared memory that no thread of the block wrote first;
//   * out-of-bounds shared or global accesses (every view knows its extent);
//   * the GPU primitives' preconditions: __syncthreads only where every thread of the block
//     reaches it (not inside a per-thread or per-warp phase), __syncwarp only where all 32 lanes
//     of the warp reach it (not inside a per-lane phase), shared arrays aligned for their type.
// Shared memory and all scratch buffers start filled with NaN so a read of anything the kernel did
// not write first also shows up in the results.
#include "scan2d_emulate.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "emulation/host_emulation.h"
#include "scan2d_driver.h"
#include "scan2d_kernel.cuh"
#include "scan2d_routes.h"

namespace vmamba2d {
namespace scan2d {

// The host's bf16 widens a backward vector quad from its 32-bit words like the GPU's bf16 does
// (scan2d_backward.cuh), so the emulation runs that path too.
template <>
struct WidenedByBits<c10::BFloat16> : std::true_type {};

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("selective_scan_2d emulation: " + what);
}

// Vector global accesses (loads and stores) of the running emulation call, for the tests that
// prove the vector path is taken (emulation_vector_accesses).
thread_local int64_t g_vector_accesses = 0;
// Bit v: a forward block of the running emulation call ran Variant v (emulation_forward_variants).
thread_local uint32_t g_forward_variants = 0;

// Who is running: a thread (with its barrier interval and its warp's __syncwarp interval), or
// the block / a warp as a whole.
struct Access {
  int thread = -1;
  int64_t epoch = -1;
  int64_t warp_epoch = -1;
};

// Shadow state of one block's shared memory, one entry per 4-byte word.
class Shadow {
 public:
  Shadow(size_t bytes, int nthreads, bool enabled)
      : enabled_(enabled), words_(enabled ? bytes / 4 : 0), warp_epoch_(nthreads / kTile, 0) {}

  int thread = -1;  // the running thread, -1 outside a per-thread phase
  int64_t epoch = 0;

  void sync_warp(int warp) { ++warp_epoch_[warp]; }

  void read(size_t word) {
    if (!enabled_) return;
    const Access now = current();
    Word& w = words_[word];
    if (w.writer.thread < 0) fail(describe("read of shared memory no thread wrote first", word, now, now));
    if (!ordered(w.writer, now)) fail(describe("shared-memory race (read after write)", word, w.writer, now));
    size_t keep = 0;
    bool seen = false;
    for (Access& r : w.readers) {
      if (r.epoch < epoch) continue;  // ordered before every later access
      if (r.thread == now.thread) {
        r = now;
        seen = true;
      }
      w.readers[keep++] = r;
    }
    w.readers.resize(keep);
    if (!seen) w.readers.push_back(now);
  }

  void write(size_t word) {
    if (!enabled_) return;
    const Access now = current();
    Word& w = words_[word];
    if (w.writer.thread >= 0 && !ordered(w.writer, now)) {
      fail(describe("shared-memory race (write after write)", word, w.writer, now));
    }
    for (const Access& r : w.readers) {
      if (!ordered(r, now)) fail(describe("shared-memory race (write after read)", word, r, now));
    }
    w.readers.clear();
    w.writer = now;
  }

 private:
  struct Word {
    Access writer;
    std::vector<Access> readers;
  };

  Access current() const {
    if (thread < 0) fail("shared memory touched outside a per-thread / per-lane phase");
    return Access{thread, epoch, warp_epoch_[thread / kTile]};
  }

  static bool ordered(const Access& before, const Access& after) {
    return before.thread == after.thread || before.epoch < after.epoch ||
           (before.thread / kTile == after.thread / kTile && before.warp_epoch < after.warp_epoch);
  }

  static std::string describe(const char* what, size_t word, const Access& a, const Access& b) {
    std::ostringstream s;
    s << what << " at shared byte " << word * 4 << ": thread " << a.thread << " (warp "
      << a.thread / kTile << ", barrier interval " << a.epoch << ", warp-sync interval "
      << a.warp_epoch << ") and thread " << b.thread << " (warp " << b.thread / kTile
      << ", barrier interval " << b.epoch << ", warp-sync interval " << b.warp_epoch << ")";
    return s.str();
  }

  bool enabled_;
  std::vector<Word> words_;
  std::vector<int64_t> warp_epoch_;
};

// A checked reference to one shared element: reads and writes go through the shadow.
template <class V>
class SharedRef {
 public:
  SharedRef(V* slot, size_t word, Shadow* shadow) : slot_(slot), word_(word), shadow_(shadow) {}
  operator V() const {
    shadow_->read(word_);
    return *slot_;
  }
  SharedRef& operator=(V v) {
    shadow_->write(word_);
    *slot_ = v;
    return *this;
  }
  SharedRef& operator=(const SharedRef& other) { return *this = static_cast<V>(other); }
  SharedRef& operator+=(V v) { return *this = static_cast<V>(*this) + v; }

 private:
  V* slot_;
  size_t word_;
  Shadow* shadow_;
};

// A view of a shared array of `extent` elements (plus an offset into it), bounds-checked.
template <class V>
class SharedView {
  static_assert(sizeof(V) == 4, "the shadow tracks 4-byte words");

 public:
  SharedView(V* base, int64_t extent, size_t word0, Shadow* shadow, int64_t offset = 0)
      : base_(base), extent_(extent), word0_(word0), shadow_(shadow), offset_(offset) {}
  SharedView operator+(int64_t k) const { return SharedView(base_, extent_, word0_, shadow_, offset_ + k); }
  SharedRef<V> operator[](int64_t i) const {
    const int64_t at = offset_ + i;
    if (at < 0 || at >= extent_) {
      fail("out-of-bounds shared access: element " + std::to_string(at) + " of an array of " +
           std::to_string(extent_));
    }
    return SharedRef<V>(base_ + at, word0_ + static_cast<size_t>(at), shadow_);
  }

 private:
  V* base_;
  int64_t extent_;
  size_t word0_;
  Shadow* shadow_;
  int64_t offset_;
};

// A view of a global buffer of `extent` elements, bounds-checked.
template <class V>
class GlobalView {
  using Value = std::remove_const_t<V>;

 public:
  class Ref {
   public:
    explicit Ref(V* slot) : slot_(slot) {}
    operator Value() const { return *slot_; }
    Ref& operator=(Value v) {
      *slot_ = v;
      return *this;
    }
    Ref& operator=(const Ref& other) { return *this = static_cast<Value>(other); }
    Ref& operator+=(Value v) { return *this = static_cast<Value>(*this) + v; }

   private:
    V* slot_;
  };

  GlobalView(V* base, int64_t extent) : base_(base), extent_(extent) {}
  Ref operator[](int64_t i) const {
    if (base_ == nullptr) fail("access to a global buffer the launch did not provide");
    if (i < 0 || i >= extent_) {
      fail("out-of-bounds global access: element " + std::to_string(i) + " of a buffer of " +
           std::to_string(extent_));
    }
    return Ref(base_ + i);
  }

  // The view of elements k .. extent - 1 (element i of it is element k + i of this one).
  GlobalView offset(int64_t k) const {
    if (base_ == nullptr) fail("offset view of a global buffer the launch did not provide");
    if (k < 0 || k > extent_) {
      fail("offset view out of bounds: element " + std::to_string(k) + " of a buffer of " + std::to_string(extent_));
    }
    return GlobalView(base_ + k, extent_ - k);
  }

  // The address test the kernel makes before a vector access (no access, so no bounds check).
  bool vector_aligned(int64_t i) const {
    return reinterpret_cast<uintptr_t>(base_ + i) % sizeof(Vec4<Value>) == 0;
  }
  // A vector access of elements i .. i + kQuad - 1 with the GPU's preconditions checked: the
  // buffer exists, all kQuad elements are inside it, the address is aligned to the vector width.
  Vec4<Value> load_vector(int64_t i) const {
    Vec4<Value> v;
    std::memcpy(v.v, check_vector(i), sizeof(v.v));
    ++g_vector_accesses;
    return v;
  }
  void store_vector(int64_t i, const Vec4<Value>& v) const {
    static_assert(!std::is_const_v<V>, "vector store into a read-only buffer");
    std::memcpy(check_vector(i), v.v, sizeof(v.v));
    ++g_vector_accesses;
  }

 private:
  V* check_vector(int64_t i) const {
    if (base_ == nullptr) fail("vector access to a global buffer the launch did not provide");
    if (i < 0 || i + kQuad > extent_) {
      fail("out-of-bounds vector global access: elements " + std::to_string(i) + " .. " +
           std::to_string(i + kQuad - 1) + " of a buffer of " + std::to_string(extent_));
    }
    const auto address = reinterpret_cast<uintptr_t>(base_ + i);
    if (address % sizeof(Vec4<Value>) != 0) {
      fail("misaligned vector global access: element " + std::to_string(i) + " at address " +
           std::to_string(address) + " is not a multiple of " + std::to_string(sizeof(Vec4<Value>)) +
           " bytes");
    }
    return base_ + i;
  }

  V* base_;
  int64_t extent_;
};

using emulation::Schedule;

class HostCtx {
 public:
  static constexpr int kLaneSlots = kTile;
  static constexpr int kThreadSlots = kBlockThreads;

  HostCtx(int nwarps, Schedule& schedule, Shadow& shadow, int64_t drop_barrier)
      : nwarps_(nwarps), schedule_(schedule), shadow_(shadow), drop_barrier_(drop_barrier) {}

  int nthreads() const { return nwarps_ * kTile; }
  int nwarps() const { return nwarps_; }
  int lane_slot(int lane) const { return lane; }
  int thread_slot(int t) const { return t; }

  template <class V>
  SharedView<V> shared(char* smem, size_t byte_offset, int64_t count) const {
    if (byte_offset % alignof(V) != 0) fail("misaligned shared array");
    return SharedView<V>(reinterpret_cast<V*>(smem + byte_offset), count, byte_offset / 4, &shadow_);
  }
  template <class V>
  GlobalView<V> global(V* ptr, int64_t count) const {
    return GlobalView<V>(ptr, count);
  }
  template <class V>
  GlobalView<V> offset_view(const GlobalView<V>& view, int64_t k) const {
    return view.offset(k);
  }
  // DeviceCtx's vector primitives; GlobalView checks their preconditions.
  template <class V>
  bool vector_aligned(const GlobalView<V>& view, int64_t off) const {
    return view.vector_aligned(off);
  }
  template <class V>
  auto load_vector(const GlobalView<V>& view, int64_t off) const {
    return view.load_vector(off);
  }
  template <class V>
  void store_vector(const GlobalView<V>& view, int64_t off, const Vec4<std::remove_const_t<V>>& v) const {
    view.store_vector(off, v);
  }

  template <class F>
  void each_thread(F&& f) {
    enter("each_thread");
    for (int t : schedule_.permutation(nthreads())) {
      shadow_.thread = t;
      f(t);
    }
    shadow_.thread = -1;
    scope_ = Scope::kBlock;
  }
  template <class F>
  void each_warp(F&& f) {
    enter("each_warp");
    for (int w : schedule_.permutation(nwarps_)) {
      warp_ = w;
      f(w);
    }
    warp_ = -1;
    scope_ = Scope::kBlock;
  }
  template <class F>
  void each_lane(F&& f) {
    if (scope_ != Scope::kWarp) fail("each_lane outside a per-warp phase");
    scope_ = Scope::kLane;
    for (int lane : schedule_.permutation(kTile)) {
      shadow_.thread = warp_ * kTile + lane;
      f(lane);
    }
    shadow_.thread = -1;
    scope_ = Scope::kWarp;
  }
  void barrier() {
    if (scope_ != Scope::kBlock) {
      fail("__syncthreads inside a per-thread / per-warp phase (not reached by every thread)");
    }
    if (barriers_++ == drop_barrier_) return;
    ++shadow_.epoch;
  }
  void sync_warp() {
    if (scope_ != Scope::kWarp) fail("__syncwarp outside a per-warp phase (lanes diverged)");
    shadow_.sync_warp(warp_);
  }

 private:
  enum class Scope { kBlock, kWarp, kLane, kThread };

  void enter(const char* what) {
    if (scope_ != Scope::kBlock) fail(std::string(what) + " nested inside another phase");
    scope_ = std::strcmp(what, "each_warp") == 0 ? Scope::kWarp : Scope::kThread;
  }

  int nwarps_;
  Schedule& schedule_;
  Shadow& shadow_;
  int64_t drop_barrier_;
  int64_t barriers_ = 0;
  Scope scope_ = Scope::kBlock;
  int warp_ = -1;
};

template <class Block>
void run_grid(int grid_x, int grid_y, int grid_z, int nwarps, size_t smem_bytes,
              const EmulationOptions& opt, Block&& block) {
  Schedule schedule(opt.order);
  const int per_z = grid_x * grid_y;
  const std::vector<int> order = schedule.permutation(per_z * grid_z);
  for (int id : order) {
    std::vector<char> smem(smem_bytes);
    std::memset(smem.data(), 0xff, smem_bytes);  // NaN floats
    Shadow shadow(smem_bytes, nwarps * kTile, opt.race_check);
    HostCtx ctx(nwarps, schedule, shadow, opt.drop_barrier);
    const int xy = id % per_z;
    block(ctx, xy % grid_x, xy / grid_x, id / per_z, smem.data());
  }
}

template <template <class> class Kernel, class Ctx>
void dispatch(ElementType type, Ctx& ctx, const Params& p, int bx, int by, int bz, char* smem) {
  switch (type) {
    case ElementType::kFloat32:
      Kernel<float>::run(ctx, p, bx, by, bz, smem);
      break;
    case ElementType::kFloat16:
      Kernel<c10::Half>::run(ctx, p, bx, by, bz, smem);
      break;
    case ElementType::kBFloat16:
      Kernel<c10::BFloat16>::run(ctx, p, bx, by, bz, smem);
      break;
  }
}

// The options of the running emulation call (the Backend interface is static).
thread_local EmulationOptions g_options;

template <class T>
struct ForwardKernel {
  static void run(HostCtx& ctx, const Params& p, int bx, int by, int bz, char* smem) {
    const Variant v = kernel_variant(p, p.k.fwd_wpc);
    g_forward_variants |= 1u << static_cast<int>(v);
    // The one-state variants' code differs on the register-carry archs (forward_block's
    // kRegisterCarry).
    const bool register_carry = register_carry_arch(static_cast<int>(g_options.arch));
    if (v == Variant::kOneStateSequential && register_carry) {
      forward_block<T, Variant::kOneStateSequential, true>(ctx, p, bx, by, bz, smem);
    } else if (v == Variant::kOneStateSequential) {
      forward_block<T, Variant::kOneStateSequential, false>(ctx, p, bx, by, bz, smem);
    } else if (v == Variant::kOneStateRoute && register_carry) {
      forward_block<T, Variant::kOneStateRoute, true>(ctx, p, bx, by, bz, smem);
    } else if (v == Variant::kOneStateRoute) {
      forward_block<T, Variant::kOneStateRoute, false>(ctx, p, bx, by, bz, smem);
    } else if (v == Variant::kRoute) {
      forward_block<T, Variant::kRoute>(ctx, p, bx, by, bz, smem);
    } else {
      forward_block<T, Variant::kGeneral>(ctx, p, bx, by, bz, smem);
    }
  }
};

template <class T>
struct BackwardKernel {
  static void run(HostCtx& ctx, const Params& p, int bx, int by, int bz, char* smem) {
    const Variant v = kernel_variant(p, p.k.bwd_wpc);
    if (v == Variant::kOneStateSequential) {
      backward_block<T, Variant::kOneStateSequential>(ctx, p, bx, by, bz, smem);
    } else if (v == Variant::kOneStateRoute) {
      backward_block<T, Variant::kOneStateRoute>(ctx, p, bx, by, bz, smem);
    } else if (v == Variant::kRoute) {
      backward_block<T, Variant::kRoute>(ctx, p, bx, by, bz, smem);
    } else {
      backward_block<T, Variant::kGeneral>(ctx, p, bx, by, bz, smem);
    }
  }
};


struct HostBackend {
  static constexpr bool kCuda = false;

  // The planned device as the caller described it: SMs, opt-in shared memory per block and per SM,
  // the arch of the code it runs.
  static DeviceLimits limits(const at::Tensor&) {
    return DeviceLimits{static_cast<int>(g_options.sm_count),
                        static_cast<size_t>(g_options.smem_per_block),
                        static_cast<size_t>(g_options.smem_per_sm), static_cast<int>(g_options.arch),
                        reserved_smem_per_block(static_cast<int>(g_options.arch))};
  }

  static void forward(const Params& p, ElementType type) {
    const int nwarps = p.k.fwd_channels * p.k.fwd_wpc;
    const size_t smem =
        forward_layout(p.k.fwd_channels, p.k.fwd_wpc, p.g.nstate, p.g.route.active, p.k.fwd_carry_in_registers).total;
    const int tiles = p.pass == kSequential ? 1 : p.g.tiles_h * p.g.tiles_w;
    run_grid(p.g.batch_blocks, p.g.dim / p.k.fwd_channels, tiles, nwarps, smem, g_options,
             [&](HostCtx& ctx, int bx, int by, int bz, char* s) {
               dispatch<ForwardKernel>(type, ctx, p, bx, by, bz, s);
             });
  }

  static void carry_scan(const Params& p, const CarryScan& scan) {
    const int64_t blocks = (carry_scan_lines(p.g, scan.rows) + kBlockThreads - 1) / kBlockThreads;
    run_grid(static_cast<int>(blocks), 1, 1, kMaxWarps, 0, g_options,
             [&](HostCtx& ctx, int bx, int, int, char*) { carry_scan_block(ctx, p, bx, scan); });
  }

  static void backward(const Params& p, ElementType type) {
    const size_t smem = backward_layout(p.k.bwd_channels, p.k.bwd_wpc, p.g.nstate).total;
    const int tiles = p.pass == kSequential ? 1 : p.g.tiles_h * p.g.tiles_w;
    run_grid(p.g.batch_blocks, p.g.groups * p.k.slices, tiles, p.k.bwd_channels * p.k.bwd_wpc, smem, g_options,
             [&](HostCtx& ctx, int bx, int by, int bz, char* s) {
               dispatch<BackwardKernel>(type, ctx, p, bx, by, bz, s);
             });
  }

  static void poison(at::Tensor& t) { t.fill_(std::numeric_limits<float>::quiet_NaN()); }
};

struct OptionsScope {
  explicit OptionsScope(const EmulationOptions& o) {
    TORCH_CHECK_VALUE(o.sm_count >= 1, "emulation: sm_count must be >= 1, got ", o.sm_count);
    TORCH_CHECK_VALUE(o.smem_per_block >= 48 * 1024, "emulation: smem_per_block must be >= 48 KiB (",
                      48 * 1024, " bytes, every GPU's default), got ", o.smem_per_block);
    TORCH_CHECK_VALUE(o.smem_per_sm >= o.smem_per_block, "emulation: smem_per_sm (", o.smem_per_sm,
                      ") must be >= smem_per_block (", o.smem_per_block, ")");
    g_options = o;
    g_vector_accesses = 0;
    g_forward_variants = 0;
  }
  ~OptionsScope() { g_options = EmulationOptions{}; }
};

// Tiny synthetic blocks that each break (or keep) one rule, for the tests of the checker itself.
void run_scenario(const std::string& scenario) {
  constexpr int kWarps = 2;
  constexpr int kWords = 64;
  std::vector<char> smem(kWords * 4);
  Schedule schedule(0);
  Shadow shadow(smem.size(), kWarps * kTile, true);
  HostCtx ctx(kWarps, schedule, shadow, -1);
  auto s = ctx.shared<float>(smem.data(), 0, kWords);
  std::vector<float> buffer(4, 0.f);
  auto gview = ctx.global(buffer.data(), 4);
  auto fill = [&] {
    ctx.each_thread([&](int t) {
      if (t < kWords) s[t] = static_cast<float>(t);
    });
    ctx.barrier();
  };
  if (scenario == "ordered_by_barrier") {
    fill();
    ctx.each_thread([&](int t) { buffer[0] += s[(t + 1) % kWords]; });
  } else if (scenario == "read_after_write_across_warps") {
    fill();
    ctx.each_warp([&](int w) {
      ctx.each_lane([&](int lane) {
        if (lane == 0 && w == 0) s[0] = 1.f;
        if (lane == 0 && w == 1) buffer[0] = s[0];
      });
    });
  } else if (scenario == "read_after_write_in_warp") {
    fill();
    ctx.each_warp([&](int w) {
      ctx.each_lane([&](int lane) { s[w * kTile + lane] = 1.f; });
      ctx.each_lane([&](int lane) { buffer[0] = s[w * kTile + (lane + 1) % kTile]; });
    });
  } else if (scenario == "ordered_by_syncwarp") {
    fill();
    ctx.each_warp([&](int w) {
      ctx.each_lane([&](int lane) { s[w * kTile + lane] = 1.f; });
      ctx.sync_warp();
      ctx.each_lane([&](int lane) { buffer[0] = s[w * kTile + (lane + 1) % kTile]; });
    });
  } else if (scenario == "write_after_read") {
    fill();
    ctx.each_thread([&](int t) { buffer[0] = s[0] + static_cast<float>(t); });
    ctx.each_thread([&](int t) {
      if (t == 5) s[0] = 2.f;
    });
  } else if (scenario == "write_after_write") {
    fill();
    ctx.each_thread([&](int t) { s[1] = static_cast<float>(t); });
  } else if (scenario == "uninitialised_read") {
    ctx.each_thread([&](int t) { buffer[0] = s[t % kWords]; });
  } else if (scenario == "out_of_bounds_shared") {
    fill();
    ctx.each_thread([&](int t) { buffer[0] = s[t + 1]; });
  } else if (scenario == "out_of_bounds_global") {
    ctx.each_thread([&](int t) { gview[t % 5] = 1.f; });
  } else if (scenario == "barrier_inside_warp_phase") {
    ctx.each_warp([&](int) { ctx.barrier(); });
  } else if (scenario == "syncwarp_inside_lane_phase") {
    ctx.each_warp([&](int) { ctx.each_lane([&](int) { ctx.sync_warp(); }); });
  } else if (scenario == "aligned_vector_access") {
    alignas(16) float data[2 * kQuad] = {};
    auto v = ctx.global(static_cast<float*>(data), 2 * kQuad);
    if (!ctx.vector_aligned(v, kQuad)) fail("vector_aligned rejects an aligned address");
    ctx.store_vector(v, kQuad, ctx.load_vector(v, 0));
  } else if (scenario == "misaligned_vector_load") {
    alignas(16) float data[2 * kQuad] = {};
    auto v = ctx.global(static_cast<const float*>(data), 2 * kQuad);
    if (ctx.vector_aligned(v, 1)) fail("vector_aligned accepts a misaligned address");
    ctx.load_vector(v, 1);
  } else if (scenario == "out_of_bounds_vector_load") {
    alignas(16) float data[2 * kQuad] = {};
    auto v = ctx.global(static_cast<const float*>(data), 2 * kQuad - 1);
    ctx.load_vector(v, kQuad);
  } else if (scenario == "misaligned_vector_store") {
    alignas(16) c10::Half data[2 * kQuad] = {};
    auto v = ctx.global(static_cast<c10::Half*>(data), 2 * kQuad);
    ctx.store_vector(v, 2, Vec4<c10::Half>{});
  } else if (scenario == "offset_view") {
    // Element i of the view from k on is element k + i, for scalar and vector accesses alike.
    alignas(16) float data[3 * kQuad] = {};
    auto whole = ctx.global(static_cast<float*>(data), 3 * kQuad);
    auto view = ctx.offset_view(whole, kQuad);
    view[1] = 7.f;
    if (static_cast<float>(whole[kQuad + 1]) != 7.f) fail("an offset view's element is not the buffer's");
    if (!ctx.vector_aligned(view, kQuad)) fail("vector_aligned rejects an aligned address of an offset view");
    ctx.store_vector(view, kQuad, ctx.load_vector(view, 0));
    if (static_cast<float>(whole[2 * kQuad + 1]) != 7.f) fail("an offset view's vector access moved other elements");
    if (ctx.vector_aligned(ctx.offset_view(whole, 1), 0)) fail("vector_aligned accepts a misaligned offset view");
  } else if (scenario == "offset_view_past_the_end") {
    auto v = ctx.global(buffer.data(), 4);
    ctx.offset_view(v, 5);
  } else if (scenario == "out_of_bounds_through_offset_view") {
    auto v = ctx.offset_view(ctx.global(buffer.data(), 4), 3);
    ctx.each_thread([&](int t) { v[t % 2] = 1.f; });
  } else if (scenario == "offset_view_of_missing_buffer") {
    ctx.offset_view(ctx.global(static_cast<const float*>(nullptr), 0), 0);
  } else if (scenario == "misaligned_shared_array") {
    ctx.shared<float>(smem.data(), 2, 4);
  } else {
    TORCH_CHECK_VALUE(false, "unknown emulation self-check scenario '", scenario, "'");
  }
}

}  // namespace

std::vector<at::Tensor> emulate_forward(const at::Tensor& u, const at::Tensor& delta,
                                        const at::Tensor& A, const at::Tensor& B,
                                        const at::Tensor& C, const std::optional<at::Tensor>& D,
                                        const std::optional<at::Tensor>& delta_bias,
                                        bool delta_softplus, int64_t height, int64_t width,
                                        bool out_fp32, bool save_carries,
                                        const EmulationOptions& options) {
  const OptionsScope scope(options);
  return forward_impl<HostBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width,
                                   out_fp32, save_carries);
}

std::vector<at::Tensor> emulate_backward(const at::Tensor& u, const at::Tensor& delta,
                                         const at::Tensor& A, const at::Tensor& B,
                                         const at::Tensor& C, const std::optional<at::Tensor>& D,
                                         const std::optional<at::Tensor>& delta_bias,
                                         bool delta_softplus, int64_t height, int64_t width,
                                         const at::Tensor& dy, const at::Tensor& carry_h,
                                         const at::Tensor& carry_v, const EmulationOptions& options) {
  const OptionsScope scope(options);
  return backward_impl<HostBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, height,
                                    width, dy, carry_h, carry_v);
}

at::Tensor emulate_cross_forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                 const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                                 const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                 const std::vector<int64_t>& routes, bool out_fp32, const EmulationOptions& options) {
  const OptionsScope scope(options);
  return cross_forward_impl<HostBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32);
}

std::vector<at::Tensor> emulate_cross_backward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                               const at::Tensor& B, const at::Tensor& C,
                                               const std::optional<at::Tensor>& D,
                                               const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                               const std::vector<int64_t>& routes, const at::Tensor& dy,
                                               const EmulationOptions& options) {
  const OptionsScope scope(options);
  return cross_backward_impl<HostBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy);
}

void emulation_self_check(const std::string& scenario) { run_scenario(scenario); }

int64_t emulation_vector_accesses() { return g_vector_accesses; }

std::vector<std::string> emulation_forward_variants() {
  std::vector<std::string> names;
  for (const Variant v : {Variant::kGeneral, Variant::kOneStateSequential, Variant::kRoute, Variant::kOneStateRoute}) {
    if (g_forward_variants & (1u << static_cast<int>(v))) names.emplace_back(variant_name(v));
  }
  return names;
}

at::Tensor kernel_softplus(const at::Tensor& z) {
  TORCH_CHECK_VALUE(z.is_cpu() && z.scalar_type() == at::kFloat,
                    "_softplus: z must be a float32 CPU tensor, got ", z.scalar_type(), " on ", z.device());
  const at::Tensor in = z.contiguous();
  at::Tensor out = at::empty_like(in);
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < in.numel(); ++i) dst[i] = softplus(src[i]);
  return out;
}

at::Tensor kernel_softplus_grad_from_value(const at::Tensor& dt) {
  TORCH_CHECK_VALUE(dt.is_cpu() && dt.scalar_type() == at::kFloat,
                    "_softplus_grad_from_value: dt must be a float32 CPU tensor, got ", dt.scalar_type(),
                    " on ", dt.device());
  const at::Tensor in = dt.contiguous();
  at::Tensor out = at::empty_like(in);
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < in.numel(); ++i) dst[i] = softplus_grad_from_value(src[i]);
  return out;
}

at::Tensor kernel_sigmoid_from_softplus(const at::Tensor& z) {
  TORCH_CHECK_VALUE(z.is_cpu() && z.scalar_type() == at::kFloat,
                    "_sigmoid_from_softplus: z must be a float32 CPU tensor, got ", z.scalar_type(), " on ",
                    z.device());
  const at::Tensor in = z.contiguous();
  at::Tensor out = at::empty_like(in);
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < in.numel(); ++i) dst[i] = sigmoid_from_softplus(src[i], softplus(src[i]));
  return out;
}

}  // namespace scan2d
}  // namespace vmamba2d
