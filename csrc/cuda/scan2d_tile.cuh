// Shared pieces of the tiled 2D selective scan v3 (docs/scan.md, docs/kernels.md). The forward and
// backward blocks (scan2d_forward.cuh, scan2d_backward.cuh) are written once for two execution
// contexts:
//   * DeviceCtx (scan2d_device.cuh, the .cu files): one CUDA thread per (warp, lane);
//     each_thread / each_warp / each_lane run the body for the calling thread only, barrier() is
//     __syncthreads(), sync_warp() is __syncwarp(), global views are raw pointers, shared views
//     32-bit offsets into the block's dynamic shared memory (SharedWindowView).
//   * HostCtx (selective_scan_2d_emulate.cpp): one CPU thread runs every (warp, lane) of a block in
//     a chosen order (forward, reversed, shuffled), views are bounds-checked and every shared
//     access is recorded by a race detector, so the very code the GPU runs is tested on the CPU.
// Rules that keep the two equivalent: no barrier inside each_thread / each_warp; shared or global
// memory is touched only inside each_thread / each_lane; state that lives across each_lane calls is
// indexed by ctx.lane_slot(lane), across each_thread calls by ctx.thread_slot(t); threads of one
// phase exchange data only across a barrier (block) or a sync_warp (warp) -- the emulation's race
// detector enforces the last rule.
//
// Structure: every global access of u, delta, B, C, dy, y, du, ddelta, dB, dC happens in a block
// phase (each_quad: all threads, one quad of kQuad consecutive cells of a tile row per step, one
// 16-byte (fp32) / 8-byte (fp16, bf16) vector access when the four cells are consecutive in memory
// and aligned -- ctx.vector_aligned / load_vector / store_vector, whose host model checks alignment
// and bounds --, else one scalar access per real cell: map edges, pack boundaries, rows of a width
// that is not a multiple of 4, misaligned base pointers; load_cells / store_cells). The one-state
// forward loads a quad's planes of all its channels together (load_quads in scan2d_forward.cuh:
// every vector load of the quad before the first use). A block owns several channels of one
// group, so each B / C quad is loaded once for all of them. The scans run in warp phases on shared
// tiles only: a lane owns a tile row (horizontal) or a tile column (vertical). Only y, the
// gradients and the per-state tile carries (kTile floats per tile edge) go to global memory.
// When the maps are too few to fill the GPU, the tiles of a map run in parallel (ForwardPass in
// scan2d_common.h): the scan is linear in the carries, so edges computed with zero carry-in plus
// the product of Abar along each edge line give every tile's true carries after a short sequential
// scan over tiles (carry_scan_block).
#pragma once

#include <math.h>

#include <type_traits>

#include "scan2d_common.h"
#include "scan2d_math.cuh"

namespace vmamba2d {
namespace scan2d {

// Conversion of the kernel's element type to / from fp32; the .cu files specialise it for the
// CUDA half types, the host emulation uses c10's (both convert with round-to-nearest-even).
template <class T>
struct Element {
  static SS2D_HD SS2D_INLINE float load(T v) { return static_cast<float>(v); }
  static SS2D_HD SS2D_INLINE T store(float v) { return T(v); }
};


// d softplus(z) / dz = sigmoid(z) = 1 - exp(-dt) with dt = softplus(z) >= 0, in a few instructions:
// below dt = 2^-5 the series dt - dt^2/2 + dt^3/6 - dt^4/24 (no cancellation; truncation <= dt^4 /
// 120 relative), else 1 - exp2f(-dt * log2(e)) with exp(-dt) <= 0.97, so its error (2 ulp for exp2f)
// grows at most 31-fold: relative error below 1e-5 (was -expm1f(-dt), ~30 instructions); checked
// on the host build by tests/ops/compiled/test_scan_cuda.py.
SS2D_HD SS2D_INLINE float softplus_grad_from_value(float dt) {
  const float series = dt * (1.f - dt * (0.5f - dt * (1.f / 6.f - dt * (1.f / 24.f))));
  return dt < 0.03125f ? series : 1.f - exp2f(-dt * kLog2e);
}

// Bit k set: tile row/column k starts a new map (packed mode), so scans restart there.
SS2D_HD SS2D_INLINE uint32_t segment_starts(int segment) {
  uint32_t mask = 0;
  for (int k = segment; k < kTile; k += segment) mask |= 1u << k;
  return mask;
}

SS2D_HD SS2D_INLINE int small_div(int x, uint32_t magic) {
  return static_cast<int>((static_cast<uint32_t>(x) * magic) >> 16);
}

SS2D_HD SS2D_INLINE int64_t carry_index(int64_t map, int slots, int slot, int nstate, int n, int k) {
  return ((map * slots + slot) * nstate + n) * kTile + k;
}

SS2D_HD SS2D_INLINE int group_of(const Geometry& g, int d) { return d / (g.dim / g.groups); }

SS2D_HD SS2D_INLINE int tile_offset(int r, int c) { return r * kStride + c; }

// Route kernels: extents of delta and of B / C from the route's first plane on (RouteAddressing).
SS2D_HD inline int64_t route_delta_numel(const Geometry& g) {
  return ((g.batch - 1) * g.route.delta_planes + g.dim) * g.length;
}
SS2D_HD inline int64_t route_bc_numel(const Geometry& g) {
  return ((g.batch - 1) * g.route.bc_planes + g.nstate) * g.length;
}

// A plane of a [batch][planes][length] tensor: channel d of u / delta / y / du / ddelta
// (planes = dim) or state n of group grp in B / C (planes = groups * N, plane = grp * N + n).
struct Plane {
  int64_t planes;
  int64_t plane;
};

// Where the quad (r, c0 .. c0 + kQuad - 1) of tile (ti, tj) lives, worked out once per quad and
// tile phase and shared by every plane the phase accesses there (B, C of each state, u, delta, y,
// ... of each channel): the batch entry and map position of its first cell, which cells are real,
// and for each cell how many pack boundaries (packed small maps) lie between it and the first.
// Cell k is then, in a plane, at the first cell's offset + k, moved packs_k batch entries on and
// packs_k * seg_w columns back: no per-cell division or validity test at the accesses.
struct QuadPlace {
  int64_t batch;
  int64_t pos;
  uint32_t real;   // bit k: cell c0 + k is a real cell
  uint32_t packs;  // 2 bits per cell k (bits 2k, 2k + 1): pack boundaries between cell 0 and k
  int shift[kQuad];  // route kernels' scalar path: route_shift of each cell (place<true>)
};

SS2D_HD SS2D_INLINE QuadPlace quad_place(const Geometry& g, int bb, int ti, int tj, int r, int c0) {
  // Tile row r lies in pack row pr, map row `row`; cell c0 + k in pack column pc_k, map column
  // col_k; its batch entry is first + pc_k. The row part is shared by the four cells.
  const int pr = small_div(r, g.magic_h);
  const int row = ti * kTile + r - pr * g.seg_h;
  const int64_t first = (static_cast<int64_t>(bb) * g.pack_rows + pr) * g.pack_cols;
  const bool row_real = pr < g.pack_rows && row < g.height;
  const int entries_left = static_cast<int>(g.batch - first < kTile ? g.batch - first : kTile);
  const int first_pack = small_div(c0, g.magic_w);
  const int first_col = tj * kTile + c0 - first_pack * g.seg_w;
  QuadPlace at{first + first_pack, static_cast<int64_t>(row) * g.width + first_col, 0u, 0u, {}};
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) {
    const int pc = small_div(c0 + k, g.magic_w);
    const int col = tj * kTile + c0 + k - pc * g.seg_w;
    const bool real = row_real && pc < g.pack_cols && pc < entries_left && col < g.width;
    at.real |= real ? 1u << k : 0u;
    at.packs |= static_cast<uint32_t>(pc - first_pack) << (2 * k);
  }
  return at;
}

// All four cells real and in one map row: consecutive in memory.
SS2D_HD SS2D_INLINE bool one_row(const QuadPlace& at) { return at.real == (1u << kQuad) - 1 && at.packs == 0; }

SS2D_HD SS2D_INLINE int64_t quad_offset(const Geometry& g, const Plane& pl, const QuadPlace& at) {
  return (at.batch * pl.planes + pl.plane) * g.length + at.pos;
}

// Route kernels (Variant::kRoute, the template flag kRouted of the access helpers below): the
// map position of route position p (0 <= p < L) minus p. Added to a cell's offset in route
// coordinates it gives the cell's offset in the map: every plane starts at a multiple of L, so
// one shift serves all the planes of a cell.
SS2D_HD SS2D_INLINE int64_t route_shift(const Geometry& g, int64_t p) {
  const RouteAddressing& r = g.route;
  const int64_t a = static_cast<int64_t>((static_cast<uint64_t>(p) * r.magic) >> r.shift);  // p / inner
  const int64_t b = p - a * r.inner;
  int64_t row = r.columns_first ? b : a;
  int64_t col = r.columns_first ? a : b;
  if (r.from_bottom) row = r.map_h - 1 - row;
  if (r.from_right) col = r.map_w - 1 - col;
  return row * r.map_w + col - p;
}

// A vector quad of a linear route (g.route.linear, vector path only: one route row, so at.pos ..
// at.pos + kQuad - 1 in one route row): the shift of its vector access, whose elements are the
// quad's cells in map order -- the same order on the identity route, reversed on the reversed
// route, whose access starts at the map position L - kQuad - at.pos of the quad's last cell.
SS2D_HD SS2D_INLINE int64_t vector_shift(const Geometry& g, const QuadPlace& at) {
  return g.route.reversed ? g.length - kQuad - 2 * at.pos : 0;
}

// quad_place, on a route kernel with each cell's route_shift worked out once for all the planes
// the quad's accesses touch.
template <bool kRouted>
SS2D_HD SS2D_INLINE QuadPlace place(const Geometry& g, int bb, int ti, int tj, int r, int c0) {
  QuadPlace at = quad_place(g, bb, ti, tj, r, c0);
  if constexpr (kRouted) {
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) {
      const int packs = static_cast<int>((at.packs >> (2 * k)) & 3u);
      at.shift[k] = static_cast<int>(route_shift(g, at.pos + k - packs * g.seg_w));
    }
  }
  return at;
}

template <bool kRouted = false>
SS2D_HD SS2D_INLINE int64_t cell_offset(const Geometry& g, const Plane& pl, const QuadPlace& at, int64_t first,
                                        int k) {
  const int64_t packs = (at.packs >> (2 * k)) & 3u;
  const int64_t off = first + k + packs * (pl.planes * g.length - g.seg_w);
  if constexpr (kRouted) return off + at.shift[k];
  return off;
}

// Element k of a vector quad's kQuad values in route order: e[k], or on a reversed route (whose
// vector holds the cells in map order) e[kQuad - 1 - k]. Both indices are compile-time constants
// after unrolling (a run-time index would put the array into local memory).
template <bool kRouted, class E>
SS2D_HD SS2D_INLINE E route_element(const Geometry& g, const E (&e)[kQuad], int k) {
  if constexpr (kRouted) {
    // Both values first: a conditional of the two elements themselves selects an address into the
    // array, which puts it into local memory.
    const E forward = e[k], reversed = e[kQuad - 1 - k];
    return g.route.reversed ? reversed : forward;
  }
  return e[k];
}

// Whether the quad at off (route coordinates) takes one vector access in this plane: all four
// cells real and in one map row (route row), on a route kernel also a linear route, and the
// access's address aligned.
template <bool kRouted, class Ctx, class View>
SS2D_HD SS2D_INLINE bool vector_at_offset(const Ctx& ctx, const Geometry& g, const View& view, const QuadPlace& at,
                                          int64_t off) {
  if constexpr (kRouted) return one_row(at) && g.route.linear && ctx.vector_aligned(view, off + vector_shift(g, at));
  return one_row(at) && ctx.vector_aligned(view, off);
}

// A quad cell by cell (one scalar access per real cell; 0 on padding cells): the path of quads
// that are not one aligned map row.
template <class T, bool kRouted = false, class View>
SS2D_HD SS2D_INLINE void load_cells(const Geometry& g, const View& src, const Plane& pl, const QuadPlace& at,
                                    int64_t off, float (&out)[kQuad]) {
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) {
    out[k] = ((at.real >> k) & 1u) ? Element<T>::load(src[cell_offset<kRouted>(g, pl, at, off, k)])  // scalar fallback
                                   : 0.f;
  }
}

template <class V, bool kRouted = false, class View>
SS2D_HD SS2D_INLINE void store_cells(const Geometry& g, const View& dst, const Plane& pl, const QuadPlace& at,
                                     int64_t off, const float (&vals)[kQuad]) {
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) {
    if ((at.real >> k) & 1u) {
      dst[cell_offset<kRouted>(g, pl, at, off, k)] = Element<V>::store(vals[k]);  // scalar fallback
    }
  }
}

// Loads a quad as fp32 into out (0 on padding cells); returns the mask of real cells (bit k: cell
// c0 + k). `vector`: the caller's decision that the quad at off is one map row and aligned (for
// every plane it accesses there: see vector_planes): one vector access, else one scalar access
// per real cell (map edges, pack boundaries, misaligned rows).
// kRouted (route kernels): off is the quad's offset in route coordinates; the accesses go to the
// cells' map positions (route_shift, vector_shift).
template <class T, bool kRouted = false, class Ctx, class View>
SS2D_HD SS2D_INLINE uint32_t load_quad(const Ctx& ctx, const Geometry& g, const View& src, const Plane& pl,
                                       const QuadPlace& at, bool vector, int64_t off, float (&out)[kQuad]) {
  if (vector) {
    const Vec4<T> v = ctx.load_vector(src, kRouted ? off + vector_shift(g, at) : off);
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) out[k] = Element<T>::load(route_element<kRouted>(g, v.v, k));
    return (1u << kQuad) - 1;  // a vector quad is one map row: all real, known at compile time
  }
  load_cells<T, kRouted>(g, src, pl, at, off, out);
  return at.real;
}

// The same, deciding for this plane alone.
template <class T, bool kRouted = false, class Ctx, class View>
SS2D_HD SS2D_INLINE uint32_t load_quad(const Ctx& ctx, const Geometry& g, const View& src, const Plane& pl,
                                       const QuadPlace& at, float (&out)[kQuad]) {
  const int64_t off = quad_offset(g, pl, at);
  return load_quad<T, kRouted>(ctx, g, src, pl, at, vector_at_offset<kRouted>(ctx, g, src, at, off), off, out);
}

// Stores the real cells of a quad (element type V: T, or fp32 for an fp32 y); `vector` as in
// load_quad.
template <class V, bool kRouted = false, class Ctx, class View>
SS2D_HD SS2D_INLINE void store_quad(const Ctx& ctx, const Geometry& g, const View& dst, const Plane& pl,
                                    const QuadPlace& at, bool vector, int64_t off, const float (&vals)[kQuad]) {
  if (vector) {
    Vec4<V> v;
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) v.v[k] = Element<V>::store(route_element<kRouted>(g, vals, k));
    ctx.store_vector(dst, kRouted ? off + vector_shift(g, at) : off, v);
    return;
  }
  store_cells<V, kRouted>(g, dst, pl, at, off, vals);
}

template <class V, bool kRouted = false, class Ctx, class View>
SS2D_HD SS2D_INLINE void store_quad(const Ctx& ctx, const Geometry& g, const View& dst, const Plane& pl,
                                    const QuadPlace& at, const float (&vals)[kQuad]) {
  const int64_t off = quad_offset(g, pl, at);
  store_quad<V, kRouted>(ctx, g, dst, pl, at, vector_at_offset<kRouted>(ctx, g, dst, at, off), off, vals);
}

// Adds vals to the real cells of a quad of an fp32 buffer (the dB / dC partials): one vector
// read-modify-write when `vector` (as in load_quad), else per real cell.
template <bool kRouted = false, class Ctx, class View>
SS2D_HD SS2D_INLINE void add_quad(const Ctx& ctx, const Geometry& g, const View& dst, const Plane& pl,
                                  const QuadPlace& at, bool vector, int64_t off, const float (&vals)[kQuad]) {
  if (vector) {
    const int64_t at_off = kRouted ? off + vector_shift(g, at) : off;
    Vec4<float> v = ctx.load_vector(dst, at_off);
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) v.v[k] += route_element<kRouted>(g, vals, k);
    ctx.store_vector(dst, at_off, v);
    return;
  }
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) {
    if ((at.real >> k) & 1u) dst[cell_offset<kRouted>(g, pl, at, off, k)] += vals[k];  // scalar fallback
  }
}

template <bool kRouted = false, class Ctx, class View>
SS2D_HD SS2D_INLINE void add_quad(const Ctx& ctx, const Geometry& g, const View& dst, const Plane& pl,
                                  const QuadPlace& at, const float (&vals)[kQuad]) {
  const int64_t off = quad_offset(g, pl, at);
  add_quad<kRouted>(ctx, g, dst, pl, at, vector_at_offset<kRouted>(ctx, g, dst, at, off), off, vals);
}

// Whether every plane of the views' tensors starts aligned to the vector width: their bases are
// aligned and a plane's length is a multiple of kQuad. Then a quad in one map row that starts at a
// multiple of kQuad (vector_quad) is aligned in all of them: one decision per quad for all planes.
template <class Ctx, class... Views>
SS2D_HD SS2D_INLINE bool vector_planes(const Ctx& ctx, const Geometry& g, const Views&... views) {
  return g.length % kQuad == 0 && (ctx.vector_aligned(views, 0) && ...);
}

SS2D_HD SS2D_INLINE bool vector_quad(const QuadPlace& at) { return one_row(at) && at.pos % kQuad == 0; }

// Block phases walk the quads of a tile: thread t takes quads t, t + nthreads, ... (quad q: row
// q / kQuadsPerRow, first column quad_column(q)); a warp-wide access covers kQuadRowStep whole
// rows, and the shared-tile stride kTile + 1 keeps the per-cell shared accesses free of bank
// conflicts. Every block phase of a kernel uses this same thread -> cell map, so a block phase may
// rewrite cells an earlier block phase read without a barrier in between.
SS2D_HD SS2D_INLINE int quad_column(int quad) { return (quad & (kQuadsPerRow - 1)) * kQuad; }
SS2D_HD SS2D_INLINE int quad_row(int quad) { return quad >> kQuadsPerRowShift; }

template <class Ctx, class F>
SS2D_HD SS2D_INLINE void each_quad(Ctx& ctx, F&& f) {
  ctx.each_thread([&](int t) {
    for (int q = t; q < kTileQuads; q += ctx.nthreads()) f(t, quad_row(q), quad_column(q));
  });
}

SS2D_HD SS2D_INLINE float dt_of(const Params& p, float delta, float bias, bool real) {
  const float z = delta + bias;
  const float sp = softplus(z);  // on every cell, then selected (no branch around the exps)
  const float v = p.softplus ? sp : z;
  return real ? v : 0.f;
}

// Channel d's plane of delta / ddelta: u's (dim planes per batch entry), or on a route kernel one
// of delta_planes.
template <bool kRouted>
SS2D_HD SS2D_INLINE Plane delta_plane(const Geometry& g, int d) {
  return Plane{kRouted ? g.route.delta_planes : g.dim, d};
}

// The B / C planes of a group, worked out once per block: state n is plane first + n.
struct GroupPlanes {
  int64_t planes;
  int64_t first;
  SS2D_HD Plane operator()(int n) const { return Plane{planes, first + n}; }
};

SS2D_HD SS2D_INLINE GroupPlanes group_planes(const Geometry& g, int group) {
  return GroupPlanes{static_cast<int64_t>(g.groups) * g.nstate, static_cast<int64_t>(group) * g.nstate};
}

// What warp w of a block works on in a state round: channel d0 + channel (map `map` of the
// carry buffers) and state `state`; inactive in a last round with fewer states than warps.
struct WarpTask {
  bool active;
  int channel;
  int state;
  int64_t map;
};

SS2D_HD SS2D_INLINE WarpTask warp_task(const Geometry& g, int nstate, int bb, int d0, int wpc, int round,
                                       int w) {
  WarpTask task;
  task.channel = w / wpc;
  task.state = round * wpc + w % wpc;
  task.active = task.state < nstate;
  task.map = static_cast<int64_t>(bb) * g.dim + d0 + task.channel;
  return task;
}

}  // namespace scan2d
}  // namespace vmamba2d
