// The tiled 2D selective scan v3 (docs/scan.md, docs/kernels.md), forward and backward, written once
// for two execution contexts:
//   * DeviceCtx (scan2d_device.cuh, the .cu files): one CUDA thread per (warp, lane);
//     each_thread / each_warp / each_lane run the body for the calling thread only, barrier() is
//     __syncthreads(), sync_warp() is __syncwarp(), shared / global views are raw pointers.
//   * HostCtx (selective_scan_2d_emulate.cpp): one CPU thread runs every (warp, lane) of a block in
//     a chosen order (forward, reversed, shuffled), views are bounds-checked and every shared
//     access is recorded by a race detector, so the very code the GPU runs is tested on the CPU.
// Rules that keep the two equivalent: no barrier inside each_thread / each_warp; shared or global
// memory is touched only inside each_thread / each_lane; state that lives across each_lane calls is
// indexed by ctx.lane_slot(lane), across each_thread calls by ctx.thread_slot(t); threads of one phase exchange data only across a barrier (block)
// or a sync_warp (warp) -- the emulation's race detector enforces the last rule.
//
// Structure: every global access of u, delta, B, C, dy, y, du, ddelta, dB, dC happens in a block
// phase (each_quad: all threads, one quad of kQuad consecutive cells of a tile row per step, one
// 16-byte (fp32) / 8-byte (fp16, bf16) vector access when the four cells are consecutive in memory
// and aligned -- ctx.vector_aligned / load_vector / store_vector, whose host model checks alignment
// and bounds --, else one scalar access per real cell: map edges, pack boundaries, rows of a width
// that is not a multiple of 4, misaligned base pointers). A block owns several channels of one
// group, so each B / C quad is loaded once for all of them. The scans run in warp phases on shared
// tiles only: a lane owns a tile row (horizontal) or a tile column (vertical). Only y, the
// gradients and the per-state tile carries (kTile floats per tile edge) go to global memory.
// When the maps are too few to fill the GPU, the tiles of a map run in parallel (ForwardPass in
// scan2d_common.h): the scan is linear in the carries, so edges computed with zero carry-in plus
// the product of Abar along each edge line give every tile's true carries after a short sequential
// scan over tiles (carry_scan_block).
#pragma once

#include <math.h>

#include "scan2d_common.h"

namespace vmamba2d {
namespace scan2d {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Conversion of the kernel's element type to / from fp32; the .cu files specialise it for the
// CUDA half types, the host emulation uses c10's (both convert with round-to-nearest-even).
template <class T>
struct Element {
  static SS2D_HD SS2D_INLINE float load(T v) { return static_cast<float>(v); }
  static SS2D_HD SS2D_INLINE T store(float v) { return T(v); }
};

// log2(x) for x in [1, 2]: on the GPU one special-function instruction (lg2.approx.f32, absolute
// error <= 2^-22.6 there, PTX ISA) where log2f adds a range reduction around it; libm's log2f on
// the host. (exp2f already compiles to the special-function ex2 with a subnormal fix-up.)
SS2D_HD SS2D_INLINE float log2_1_to_2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return log2f(x);
#endif
}

// torch.nn.functional.softplus with its default threshold 20, in about half the instructions of
// log1pf(expf(z)): softplus(z) = max(z, 0) + log1p(t) with t = exp(-|z|) in (0, 1]. log1p(t) is
// log2(1 + t) * ln 2 where 1 + t keeps enough of t (t >= 2^-5: rounding 1 + t costs <= 2^-24 /
// 0.0308 = 2e-6 relative, lg2.approx <= 2^-22.6 / 0.044 = 4e-6), else the series t - t^2/2 + t^3/3
// - t^4/4 (truncation <= t^4 / 5 <= 2e-7 relative). The rounding of |z| * log2(e) before exp2f
// adds <= |z| * 2^-24 relative in t, 5e-6 at z = -87 (series side). The relative error stays below
// 1e-5 wherever softplus(z) is a normal float (z >= -87); tests/test_scan_cuda.py checks the
// bound on the host build (libm's log2f), the GPU tests the kernel's results.
SS2D_HD SS2D_INLINE float softplus(float z) {
  if (z > 20.f) return z;
  const float t = exp2f(-fabsf(z) * kLog2e);
  const float series = t * (1.f - t * (0.5f - t * (1.f / 3.f - t * 0.25f)));
  const float log1p_t = t < 0.03125f ? series : log2_1_to_2(1.f + t) * kLn2;
  return fmaxf(z, 0.f) + log1p_t;
}

// d softplus(z) / dz = sigmoid(z) = 1 - exp(-dt) with dt = softplus(z) >= 0, in a few instructions:
// below dt = 2^-5 the series dt - dt^2/2 + dt^3/6 - dt^4/24 (no cancellation; truncation <= dt^4 /
// 120 relative), else 1 - exp2f(-dt * log2(e)) with exp(-dt) <= 0.97, so its error (2 ulp for exp2f)
// grows at most 31-fold: relative error below 1e-5 (was -expm1f(-dt), ~30 instructions); checked
// on the host build by tests/test_scan_cuda.py.
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

// Where cell (r, c) of tile (ti, tj) of batch block bb lives: batch entry and position in the map.
struct TileCell {
  bool valid;
  int64_t batch;
  int64_t pos;
};

SS2D_HD SS2D_INLINE TileCell tile_cell(const Geometry& g, int bb, int ti, int tj, int r, int c) {
  const int pr = small_div(r, g.magic_h);
  const int pc = small_div(c, g.magic_w);
  const int row = ti * kTile + r - pr * g.seg_h;
  const int col = tj * kTile + c - pc * g.seg_w;
  TileCell cell;
  cell.batch = static_cast<int64_t>(bb) * g.pack_rows * g.pack_cols + pr * g.pack_cols + pc;
  cell.valid = pr < g.pack_rows && pc < g.pack_cols && cell.batch < g.batch && row < g.height &&
               col < g.width;
  cell.pos = static_cast<int64_t>(row) * g.width + col;
  return cell;
}

SS2D_HD SS2D_INLINE int64_t carry_index(int64_t map, int slots, int slot, int nstate, int n, int k) {
  return ((map * slots + slot) * nstate + n) * kTile + k;
}

SS2D_HD SS2D_INLINE int group_of(const Geometry& g, int d) { return d / (g.dim / g.groups); }

SS2D_HD SS2D_INLINE int tile_offset(int r, int c) { return r * kStride + c; }

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
};

SS2D_HD SS2D_INLINE QuadPlace quad_place(const Geometry& g, int bb, int ti, int tj, int r, int c0) {
  const TileCell first = tile_cell(g, bb, ti, tj, r, c0);
  const int first_pack = small_div(c0, g.magic_w);
  QuadPlace at{first.batch, first.pos, 0u, 0u};
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) {
    at.real |= tile_cell(g, bb, ti, tj, r, c0 + k).valid ? 1u << k : 0u;
    at.packs |= static_cast<uint32_t>(small_div(c0 + k, g.magic_w) - first_pack) << (2 * k);
  }
  return at;
}

// All four cells real and in one map row: consecutive in memory.
SS2D_HD SS2D_INLINE bool one_row(const QuadPlace& at) { return at.real == (1u << kQuad) - 1 && at.packs == 0; }

SS2D_HD SS2D_INLINE int64_t quad_offset(const Geometry& g, const Plane& pl, const QuadPlace& at) {
  return (at.batch * pl.planes + pl.plane) * g.length + at.pos;
}

SS2D_HD SS2D_INLINE int64_t cell_offset(const Geometry& g, const Plane& pl, const QuadPlace& at, int64_t first,
                                        int k) {
  const int64_t packs = (at.packs >> (2 * k)) & 3u;
  return first + k + packs * (pl.planes * g.length - g.seg_w);
}

// Loads a quad as fp32 into out (0 on padding cells); returns the mask of real cells (bit k: cell
// c0 + k). One vector access when the quad is in one map row and aligned; otherwise (map edges,
// pack boundaries, misaligned rows) one scalar access per real cell.
template <class T, class Ctx, class View>
SS2D_HD SS2D_INLINE uint32_t load_quad(const Ctx& ctx, const Geometry& g, const View& src, const Plane& pl,
                                       const QuadPlace& at, float (&out)[kQuad]) {
  const int64_t off = quad_offset(g, pl, at);
  if (one_row(at) && ctx.vector_aligned(src, off)) {
    const Vec4<T> v = ctx.load_vector(src, off);
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) out[k] = Element<T>::load(v.v[k]);
    return at.real;
  }
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) {
    out[k] = ((at.real >> k) & 1u) ? Element<T>::load(src[cell_offset(g, pl, at, off, k)]) : 0.f;
  }
  return at.real;
}

// Stores the real cells of a quad (element type V: T, or fp32 for an fp32 y).
template <class V, class Ctx, class View>
SS2D_HD SS2D_INLINE void store_quad(const Ctx& ctx, const Geometry& g, const View& dst, const Plane& pl,
                                    const QuadPlace& at, const float (&vals)[kQuad]) {
  const int64_t off = quad_offset(g, pl, at);
  if (one_row(at) && ctx.vector_aligned(dst, off)) {
    Vec4<V> v;
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) v.v[k] = Element<V>::store(vals[k]);
    ctx.store_vector(dst, off, v);
    return;
  }
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) {
    if ((at.real >> k) & 1u) dst[cell_offset(g, pl, at, off, k)] = Element<V>::store(vals[k]);
  }
}

// Adds vals to the real cells of a quad of an fp32 buffer (the dB / dC partials): one vector
// read-modify-write where the quad is in one map row and aligned, else per real cell.
template <class Ctx, class View>
SS2D_HD SS2D_INLINE void add_quad(const Ctx& ctx, const Geometry& g, const View& dst, const Plane& pl,
                                  const QuadPlace& at, const float (&vals)[kQuad]) {
  const int64_t off = quad_offset(g, pl, at);
  if (one_row(at) && ctx.vector_aligned(dst, off)) {
    Vec4<float> v = ctx.load_vector(dst, off);
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) v.v[k] += vals[k];
    ctx.store_vector(dst, off, v);
    return;
  }
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) {
    if ((at.real >> k) & 1u) dst[cell_offset(g, pl, at, off, k)] += vals[k];
  }
}

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
  return real ? (p.softplus ? softplus(z) : z) : 0.f;
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

// Forward of one block: batch block bb, channels d0 .. d0 + channels - 1 of one group. Per tile and
// state round:
//   A (block): dt / u quads (first round; kept in tiles when there are more rounds) and the B quad
//      of each of the round's states, loaded once for all channels; per (channel, state) warp:
//      x = dt * B * u and Abar = exp(dt * A[n]) -- the pass's only exp;
//   (barrier) scans (warp w, its channel and state): lane r scans tile row r in place over x
//      (hh = Abar * hh_left + x, carry from the tile on the left), then lane c scans tile column
//      c (h = Abar * h_above + hh, carry from the tile above) -- shared memory only;
//   (barrier) B (block): the C quad of each of the round's states, loaded once for all channels;
//      per channel (a rolled loop) y = D * u in the first round (u from its tile with several
//      rounds, else read again: keeping no y tile between A and B lets six blocks share an SM at
//      N = 1), else y from the y tile; y += C * h; y goes back to its tile, after the last round to
//      global memory.
// Both passes are templates over Variant (scan2d_common.h): the one-state variant folds N = 1,
// one warp per channel and the sequential pass into constants, so its code keeps no state loops
// and no tile-parallel branches.
template <class T, Variant V, class Ctx>
SS2D_HD void forward_block(Ctx& ctx, const Params& p, int bb, int cblock, int tile_z, char* smem) {
  const Geometry& g = p.g;
  constexpr bool kOne = V == Variant::kOneStateSequential;
  const int nstate = kOne ? 1 : g.nstate;
  const int channels = p.k.fwd_channels;
  const int wpc = kOne ? 1 : p.k.fwd_wpc;
  const int pass = kOne ? static_cast<int>(kSequential) : p.pass;
  const int nwarps = channels * wpc;
  const int rounds = state_rounds(nstate, wpc);
  const ForwardLayout l = forward_layout(channels, wpc, nstate);
  const int carried_floats = rounds > 1 ? channels * kTileFloats : 0;
  auto dt_t = ctx.template shared<float>(smem, l.dt, carried_floats);
  auto u_t = ctx.template shared<float>(smem, l.u, carried_floats);
  auto y_t = ctx.template shared<float>(smem, l.y, carried_floats);
  auto x_t = ctx.template shared<float>(smem, l.x, nwarps * kTileFloats);
  auto abar_t = ctx.template shared<float>(smem, l.abar, nwarps * kTileFloats);
  auto hcar = ctx.template shared<float>(smem, l.hcar, channels * nstate * kTile);
  const int64_t n_ud = ud_numel(g), n_bc = bc_numel(g);
  auto u = ctx.global(static_cast<const T*>(p.u), n_ud);
  auto delta = ctx.global(static_cast<const T*>(p.delta), n_ud);
  auto Bg = ctx.global(static_cast<const T*>(p.B), n_bc);
  auto Cg = ctx.global(static_cast<const T*>(p.C), n_bc);
  auto y32 = ctx.global(static_cast<float*>(p.y_fp32 ? p.y : nullptr), n_ud);
  auto yT = ctx.global(static_cast<T*>(p.y_fp32 ? nullptr : p.y), n_ud);
  const int tiles = g.tiles_h * g.tiles_w;
  const int vslots = p.record ? tiles : g.tiles_w;
  auto carry_v = ctx.global(p.carry_v, p.carry_v ? carry_numel(g, p.record) : 0);
  auto carry_h = ctx.global(p.carry_h, p.carry_h ? carry_numel(g, true) : 0);
  auto edge = ctx.global(p.edge, p.edge ? carry_numel(g, true) : 0);
  auto prod = ctx.global(p.prod, p.prod ? carry_numel(g, true) : 0);
  const uint32_t starts_h = segment_starts(g.seg_h);
  const uint32_t starts_w = segment_starts(g.seg_w);
  const int d0 = cblock * channels;
  const GroupPlanes bc_planes = group_planes(g, group_of(g, d0));
  const bool sequential = pass == kSequential;
  const bool edges_only = pass == kRowEdges || pass == kColumnEdges;

  const int first_tile = sequential ? 0 : tile_z;
  for (int tile = first_tile; tile < (sequential ? tiles : tile_z + 1); ++tile) {
    const int ti = tile / g.tiles_w;
    const int tj = tile - ti * g.tiles_w;
    const int vslot_in = p.record ? tile : tj;
    const int vslot_out = p.record ? tile + g.tiles_w : tj;
    for (int round = 0; round < rounds; ++round) {
      each_quad(ctx, [&](int, int r, int c0) {
        const QuadPlace at = quad_place(g, bb, ti, tj, r, c0);
        float bq[kMaxWarps][kQuad];
SS2D_UNROLL
        for (int j = 0; j < kMaxWarps; ++j) {
          if (j < wpc && round * wpc + j < nstate) {
            load_quad<T>(ctx, g, Bg, bc_planes(round * wpc + j), at, bq[j]);
          }
        }
        for (int s = 0; s < channels; ++s) {
          const int d = d0 + s;
          float dt[kQuad], uq[kQuad];
          if (round == 0) {
            const Plane pl{g.dim, d};
            float dq[kQuad];
            const uint32_t real = load_quad<T>(ctx, g, delta, pl, at, dq);
            load_quad<T>(ctx, g, u, pl, at, uq);
            const float bias = p.delta_bias ? p.delta_bias[d] : 0.f;
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              const int e = s * kTileFloats + tile_offset(r, c0 + k);
              dt[k] = dt_of(p, dq[k], bias, (real >> k) & 1u);
              if (rounds > 1) {
                dt_t[e] = dt[k];
                u_t[e] = uq[k];
              }
            }
          } else {
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              const int e = s * kTileFloats + tile_offset(r, c0 + k);
              dt[k] = dt_t[e];
              uq[k] = u_t[e];
            }
          }
SS2D_UNROLL
          for (int j = 0; j < kMaxWarps; ++j) {
            const int n = round * wpc + j;
            if (j >= wpc || n >= nstate) continue;
            const float a2 = p.A[static_cast<int64_t>(d) * nstate + n] * kLog2e;
            const int w = s * wpc + j;
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              const int e = w * kTileFloats + tile_offset(r, c0 + k);
              x_t[e] = dt[k] * uq[k] * bq[j][k];
              abar_t[e] = exp2f(dt[k] * a2);
            }
          }
        }
      });
      ctx.barrier();
      ctx.each_warp([&](int w) {
        const WarpTask task = warp_task(g, nstate, bb, d0, wpc, round, w);
        if (!task.active) return;
        const int s = task.channel, n = task.state;
        const int64_t map = task.map;
        auto x = x_t + w * kTileFloats;
        auto abar = abar_t + w * kTileFloats;
        // Horizontal: hh = Abar * hh_left + x, in place over x.
        ctx.each_lane([&](int r) {
          const int64_t at = carry_index(map, tiles, tile, nstate, n, r);
          float h = 0.f;
          if (sequential) {
            if (tj > 0) h = hcar[(s * nstate + n) * kTile + r];
            if (p.carry_h) carry_h[at] = h;
          } else if (pass != kRowEdges) {
            h = carry_h[at];
          }
          float decay = 1.f;
SS2D_UNROLL
          for (int c = 0; c < kTile; ++c) {
            if ((starts_w >> c) & 1u) h = decay = 0.f;
            const int e = tile_offset(r, c);
            const float a = abar[e];
            h = a * h + x[e];
            decay *= a;
            x[e] = h;
          }
          if (sequential) hcar[(s * nstate + n) * kTile + r] = h;
          if (pass == kRowEdges) {
            edge[at] = h;
            prod[at] = decay;
          }
        });
        if (pass == kRowEdges) return;
        ctx.sync_warp();
        // Vertical: h = Abar * h_above + hh, in place.
        ctx.each_lane([&](int c) {
          float v = 0.f;
          if (sequential) {
            if (ti > 0) {
              v = carry_v[carry_index(map, vslots, vslot_in, nstate, n, c)];
            } else if (p.record) {  // forward_impl allocates carry_v whenever it records
              carry_v[carry_index(map, vslots, vslot_in, nstate, n, c)] = 0.f;
            }
          } else if (pass == kFinal) {
            v = carry_v[carry_index(map, tiles, tile, nstate, n, c)];
          }
          float decay = 1.f;
SS2D_UNROLL
          for (int r = 0; r < kTile; ++r) {
            if ((starts_h >> r) & 1u) v = decay = 0.f;
            const int e = tile_offset(r, c);
            const float a = abar[e];
            v = a * v + x[e];
            decay *= a;
            x[e] = v;
          }
          if (sequential && ti + 1 < g.tiles_h) {
            carry_v[carry_index(map, vslots, vslot_out, nstate, n, c)] = v;
          }
          if (pass == kColumnEdges) {
            const int64_t at = carry_index(map, tiles, tile, nstate, n, c);
            edge[at] = v;
            prod[at] = decay;
          }
        });
      });
      if (edges_only) {
        if (round + 1 < rounds) ctx.barrier();  // the next round's A rewrites x / Abar
        continue;
      }
      ctx.barrier();
      const bool last = round + 1 == rounds;
      each_quad(ctx, [&](int, int r, int c0) {
        const QuadPlace at = quad_place(g, bb, ti, tj, r, c0);
        // The C quads of the round's states, loaded once for all channels (registers indexed by
        // unrolled loops: no local memory).
        float cq[kMaxWarps][kQuad];
SS2D_UNROLL
        for (int j = 0; j < kMaxWarps; ++j) {
          const int n = round * wpc + j;
          if (j < wpc && n < nstate) load_quad<T>(ctx, g, Cg, bc_planes(n), at, cq[j]);
        }
        // One channel per trip (a rolled loop: one copy of the u / y accesses in the code).
SS2D_UNROLL_BY(1)
        for (int s = 0; s < channels; ++s) {
          float yq[kQuad];
          if (round > 0) {
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) yq[k] = y_t[s * kTileFloats + tile_offset(r, c0 + k)];
          } else {
            // y starts at D * u. With one state round u is not kept on chip: its quad is read
            // again (from L2, the block read it in this tile's first phase).
            const float dskip = p.D ? p.D[d0 + s] : 0.f;
            float uq[kQuad] = {0.f, 0.f, 0.f, 0.f};
            if (rounds > 1) {
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) uq[k] = u_t[s * kTileFloats + tile_offset(r, c0 + k)];
            } else if (p.D) {
              load_quad<T>(ctx, g, u, Plane{g.dim, d0 + s}, at, uq);
            }
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) yq[k] = dskip * uq[k];
          }
SS2D_UNROLL
          for (int j = 0; j < kMaxWarps; ++j) {
            if (j >= wpc || round * wpc + j >= nstate) continue;
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              yq[k] += cq[j][k] * x_t[(s * wpc + j) * kTileFloats + tile_offset(r, c0 + k)];
            }
          }
          if (!last) {
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) y_t[s * kTileFloats + tile_offset(r, c0 + k)] = yq[k];
            continue;
          }
          const Plane pl{g.dim, d0 + s};
          if (p.y_fp32) {
            store_quad<float>(ctx, g, y32, pl, at, yq);
          } else {
            store_quad<T>(ctx, g, yT, pl, at, yq);
          }
        }
      });
      // No barrier: the next round's (or tile's) A rewrites only cells this thread itself read.
    }
  }
}

// Backward of one block: the channels of slice `cblock % slices` of group `cblock / slices`,
// `channels` at a time (warp w: channel w / wpc, in round i state i * wpc + w % wpc). Tiles are
// walked in reverse (bottom-right first), or, in the tile-parallel passes, only tile `tile_z` with
// the gradient carries into it from grad_in_v / grad_in_h. Per tile and state round:
//   A (block): the B and C quads of each of the round's states, loaded once for all channels; per
//      channel (a rolled loop) dt, u, dy quads (first round; dt into its channel tile, u and dy
//      too when there are more rounds), and per warp of the channel Abar = exp(dt * A[n]) -- the
//      pass's only exp --, g = dy * C and x = dt * B * u;
//   (barrier) scans (warp w, shared memory only):
//      1. row lanes recompute hh from the saved carry (in place over x; the row is also kept in
//         registers for step 3);
//      2. column lanes recompute h (in place over hh), then the reverse vertical scan
//             gh[r] = dy[r] * C[r] + Abar[r+1] * gh[r+1]      (in place over g);
//      3. row lanes: the reverse horizontal scan
//             ghh[c] = gh[c] + Abar[c+1] * ghh[c+1]            (dL/dx, in place over g)
//         and dL/dAbar * Abar = gh * h[r-1] * Abar + ghh * hh[c-1] * Abar, whose dL/ddt term
//         (times A[n]) replaces Abar and whose dA term (times dt) the lanes sum;
//   (barrier) B (block): per state, dB = sum over channels of ghh * dt * u and dC = sum of dy * h,
//      in channel order (the channels one per trip of a rolled loop; u and dy from their tiles,
//      or with one state round read again from global memory / L2, so that no u / dy tiles take
//      shared memory), added once per cell into the slice's partials (one vector add per quad);
//      per channel the sums over states of ghh * B and of dL/ddt; after the last round du = dt *
//      sum(ghh * B) + D * dy and ddelta are stored and each thread adds its dD / ddelta_bias terms.
// Edge passes (kColumnEdges, kRowEdges; see backward_impl) stop after step 2's reverse scan
// (zero carry from below: the carry passed up and the product of Abar down the column) or after
// the reverse horizontal scan from the true carries (zero carry from the right).
template <class T, Variant V, class Ctx>
SS2D_HD void backward_block(Ctx& ctx, const Params& p, int bb, int cblock, int tile_z, char* smem) {
  const Geometry& g = p.g;
  constexpr bool kOne = V == Variant::kOneStateSequential;
  const int nstate = kOne ? 1 : g.nstate;
  const int channels = p.k.bwd_channels;
  const int wpc = kOne ? 1 : p.k.bwd_wpc;
  const int pass = kOne ? static_cast<int>(kSequential) : p.pass;
  // The vertical scans of the full pass: unrolled completely where registers allow (the
  // one-state variant), else by 8 (the general variant stays below 255 registers).
  constexpr int kScanUnroll = kOne ? kTile : 8;
  const int nwarps = channels * wpc;
  const int nthreads = ctx.nthreads();
  const int rounds = state_rounds(nstate, wpc);
  const BackwardLayout l = backward_layout(channels, wpc, nstate);
  const int channel_floats = channels * kTileFloats;
  // u and dy stay on chip only when several state rounds use them (see backward_layout).
  const bool keep_inputs = rounds > 1;
  const int carried_floats = keep_inputs ? channel_floats : 0;
  auto dt_t = ctx.template shared<float>(smem, l.dt, channel_floats);
  auto u_t = ctx.template shared<float>(smem, l.u, carried_floats);
  auto dy_t = ctx.template shared<float>(smem, l.dy, carried_floats);
  auto sumb_t = ctx.template shared<float>(smem, l.sum_b, carried_floats);
  auto ddt_t = ctx.template shared<float>(smem, l.ddt, carried_floats);
  auto b_t = ctx.template shared<float>(smem, l.b, wpc * kTileFloats);
  auto warp_t = ctx.template shared<float>(smem, l.warp, kBackwardWarpTiles * nwarps * kTileFloats);
  auto hcar = ctx.template shared<float>(smem, l.hcar, channels * nstate * kTile);
  auto dA_s = ctx.template shared<float>(smem, l.dA, channels * nstate);
  auto lane_s = ctx.template shared<float>(smem, l.lane, nwarps * kTile);
  auto top_s = ctx.template shared<float>(smem, l.top, nwarps * kTile);
  const int64_t n_ud = ud_numel(g), n_bc = bc_numel(g);
  auto u = ctx.global(static_cast<const T*>(p.u), n_ud);
  auto delta = ctx.global(static_cast<const T*>(p.delta), n_ud);
  auto Bg = ctx.global(static_cast<const T*>(p.B), n_bc);
  auto Cg = ctx.global(static_cast<const T*>(p.C), n_bc);
  auto dy32 = ctx.global(static_cast<const float*>(p.dy_fp32 ? p.dy : nullptr), n_ud);
  auto dyT = ctx.global(static_cast<const T*>(p.dy_fp32 ? nullptr : p.dy), n_ud);
  auto du_g = ctx.global(static_cast<T*>(p.du), n_ud);
  auto ddelta_g = ctx.global(static_cast<T*>(p.ddelta), n_ud);
  const int slices = p.k.slices;
  const int slice = cblock % slices;
  const int group = cblock / slices;
  const GroupPlanes bc_planes = group_planes(g, group);
  const bool sequential = pass == kSequential;
  const bool full = sequential || pass == kFinal;
  auto dB = ctx.global(full ? p.dB_part + slice * n_bc : nullptr, full ? n_bc : 0);
  auto dC = ctx.global(full ? p.dC_part + slice * n_bc : nullptr, full ? n_bc : 0);
  const int64_t part_rows = full ? maps(g) * (sequential ? 1 : g.tiles_h * g.tiles_w) : 0;
  auto dA_part = ctx.global(p.dA_part, part_rows * nstate);
  auto dD_part = ctx.global(p.dD_part, part_rows);
  auto ddb_part = ctx.global(p.ddb_part, part_rows);
  const int tiles = g.tiles_h * g.tiles_w;
  const int64_t carries = carry_numel(g, true);
  auto carry_v = ctx.global(p.carry_v, full && tiles > 1 ? carries : 0);
  auto carry_h = ctx.global(p.carry_h, full && tiles > 1 ? carries : 0);
  auto gcarry_v = ctx.global(p.grad_carry_v, tiles > 1 && sequential ? grad_carry_numel(g) : 0);
  auto gin_v = ctx.global(p.grad_in_v, sequential ? 0 : carries);
  auto gin_h = ctx.global(p.grad_in_h, sequential ? 0 : carries);
  auto edge = ctx.global(p.edge, full ? 0 : carries);
  auto prod = ctx.global(p.prod, full ? 0 : carries);
  const uint32_t starts_h = segment_starts(g.seg_h);
  const uint32_t starts_w = segment_starts(g.seg_w);
  const int per_slice = g.dim / g.groups / slices;
  // Per thread and channel: its share of dD (sum of dy * u) and of ddelta_bias (sum of ddelta).
  float part[Ctx::kThreadSlots][2][kMaxWarps];

  for (int set = 0; set < per_slice; set += channels) {
    const int d0 = group * (g.dim / g.groups) + slice * per_slice + set;
    if (full) {
      ctx.each_thread([&](int t) {
        for (int i = t; i < channels * nstate; i += nthreads) dA_s[i] = 0.f;
SS2D_UNROLL
        for (int s = 0; s < kMaxWarps; ++s) part[ctx.thread_slot(t)][0][s] = part[ctx.thread_slot(t)][1][s] = 0.f;
      });
    }
    for (int tile = sequential ? tiles - 1 : tile_z; tile >= (sequential ? 0 : tile_z); --tile) {
      const int ti = tile / g.tiles_w;
      const int tj = tile - ti * g.tiles_w;
      for (int round = 0; round < rounds; ++round) {
        each_quad(ctx, [&](int, int r, int c0) {
          const QuadPlace at = quad_place(g, bb, ti, tj, r, c0);
          // The C (and B) quads of the round's states, loaded once for all channels (registers
          // indexed by unrolled loops: no local memory).
          float bq[kMaxWarps][kQuad], cq[kMaxWarps][kQuad];
SS2D_UNROLL
          for (int j = 0; j < kMaxWarps; ++j) {
            const int n = round * wpc + j;
            if (j >= wpc || n >= nstate) continue;
            const Plane bpl = bc_planes(n);
            load_quad<T>(ctx, g, Cg, bpl, at, cq[j]);
            if (full) {
              load_quad<T>(ctx, g, Bg, bpl, at, bq[j]);
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) b_t[j * kTileFloats + tile_offset(r, c0 + k)] = bq[j][k];
            }
          }
          // One channel per trip (a rolled loop: one copy of the delta / u / dy accesses).
SS2D_UNROLL_BY(1)
          for (int s = 0; s < channels; ++s) {
            float dt[kQuad], uq[kQuad] = {0.f, 0.f, 0.f, 0.f}, dyq[kQuad];
            if (round == 0) {
              const int d = d0 + s;
              const Plane pl{g.dim, d};
              float dq[kQuad];
              const uint32_t real = load_quad<T>(ctx, g, delta, pl, at, dq);
              if (full) load_quad<T>(ctx, g, u, pl, at, uq);
              if (p.dy_fp32) {
                load_quad<float>(ctx, g, dy32, pl, at, dyq);
              } else {
                load_quad<T>(ctx, g, dyT, pl, at, dyq);
              }
              const float bias = p.delta_bias ? p.delta_bias[d] : 0.f;
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const int e = s * kTileFloats + tile_offset(r, c0 + k);
                dt[k] = dt_of(p, dq[k], bias, (real >> k) & 1u);
                dt_t[e] = dt[k];
                if (keep_inputs) {
                  if (full) u_t[e] = uq[k];
                  dy_t[e] = dyq[k];
                }
              }
            } else {
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const int e = s * kTileFloats + tile_offset(r, c0 + k);
                dt[k] = dt_t[e];
                if (full) uq[k] = u_t[e];
                dyq[k] = dy_t[e];
              }
            }
SS2D_UNROLL
            for (int j = 0; j < kMaxWarps; ++j) {
              const int n = round * wpc + j;
              if (j >= wpc || n >= nstate) continue;
              const int w = s * wpc + j;
              const float a2 = p.A[static_cast<int64_t>(d0 + s) * nstate + n] * kLog2e;
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const int e = tile_offset(r, c0 + k);
                warp_t[(w * kBackwardWarpTiles + 0) * kTileFloats + e] = exp2f(dt[k] * a2);
                warp_t[(w * kBackwardWarpTiles + 2) * kTileFloats + e] = dyq[k] * cq[j][k];
                if (full) warp_t[(w * kBackwardWarpTiles + 1) * kTileFloats + e] = dt[k] * uq[k] * bq[j][k];
              }
            }
          }
        });
        ctx.barrier();
        ctx.each_warp([&](int w) {
          const WarpTask task = warp_task(g, nstate, bb, d0, wpc, round, w);
          if (!task.active) return;
          const int s = task.channel, n = task.state;
          const int64_t map = task.map;
          auto abar = warp_t + (w * kBackwardWarpTiles + 0) * kTileFloats;  // Abar, then dL/ddt term
          auto hv = warp_t + (w * kBackwardWarpTiles + 1) * kTileFloats;    // x, hh, then h
          auto gv = warp_t + (w * kBackwardWarpTiles + 2) * kTileFloats;    // dy * C, gh, then ghh
          if (!full) {
            ctx.each_lane([&](int c) {
              const int64_t at = carry_index(map, tiles, tile, nstate, n, c);
              float gnext = pass == kColumnEdges ? 0.f : static_cast<float>(gin_v[at]);
              float decay = 1.f;
SS2D_UNROLL_BY(8)
              for (int r = kTile - 1; r >= 0; --r) {
                if (r + 1 < kTile && ((starts_h >> (r + 1)) & 1u)) gnext = decay = 0.f;
                const int e = tile_offset(r, c);
                const float a = abar[e];
                const float gh = gv[e] + gnext;
                gv[e] = gh;
                gnext = a * gh;
                decay *= a;
              }
              if (pass == kColumnEdges) {
                edge[at] = gnext;
                prod[at] = decay;
              }
            });
            if (pass == kColumnEdges) return;
            ctx.sync_warp();
            ctx.each_lane([&](int r) {
              float gnext = 0.f;
              float decay = 1.f;
SS2D_UNROLL_BY(8)
              for (int c = kTile - 1; c >= 0; --c) {
                if (c + 1 < kTile && ((starts_w >> (c + 1)) & 1u)) gnext = decay = 0.f;
                const int e = tile_offset(r, c);
                const float a = abar[e];
                gnext = a * (gv[e] + gnext);
                decay *= a;
              }
              const int64_t at = carry_index(map, tiles, tile, nstate, n, r);
              edge[at] = gnext;
              prod[at] = decay;
            });
            return;
          }
          const float a_n = p.A[map % g.dim * nstate + n];
          auto dts = dt_t + s * kTileFloats;
          auto top = top_s + w * kTile;
          auto lane_dA = lane_s + w * kTile;
          float hh_row[Ctx::kLaneSlots][kTile];
          ctx.each_lane([&](int r) {
            float h = tiles > 1 ? static_cast<float>(carry_h[carry_index(map, tiles, tile, nstate, n, r)]) : 0.f;
            float* hrow = hh_row[ctx.lane_slot(r)];
SS2D_UNROLL
            for (int c = 0; c < kTile; ++c) {
              if ((starts_w >> c) & 1u) h = 0.f;
              const int e = tile_offset(r, c);
              h = abar[e] * h + hv[e];
              hv[e] = h;
              hrow[c] = h;
            }
          });
          ctx.sync_warp();
          ctx.each_lane([&](int c) {
            const float v_in =
                tiles > 1 ? static_cast<float>(carry_v[carry_index(map, tiles, tile, nstate, n, c)]) : 0.f;
            float v = v_in;
SS2D_UNROLL_BY(kScanUnroll)
            for (int r = 0; r < kTile; ++r) {
              if ((starts_h >> r) & 1u) v = 0.f;
              const int e = tile_offset(r, c);
              v = abar[e] * v + hv[e];
              hv[e] = v;
            }
            const int64_t gslot = carry_index(map, g.tiles_w, tj, nstate, n, c);
            float gnext = 0.f;
            if (!sequential) {
              gnext = gin_v[carry_index(map, tiles, tile, nstate, n, c)];
            } else if (ti + 1 < g.tiles_h) {
              gnext = gcarry_v[gslot];
            }
            float gh = 0.f;
SS2D_UNROLL_BY(kScanUnroll)
            for (int r = kTile - 1; r >= 0; --r) {
              if (r + 1 < kTile && ((starts_h >> (r + 1)) & 1u)) gnext = 0.f;
              const int e = tile_offset(r, c);
              gh = gv[e] + gnext;
              gv[e] = gh;
              gnext = abar[e] * gh;
            }
            top[c] = v_in;
            if (sequential && ti > 0) gcarry_v[gslot] = gnext;
          });
          ctx.sync_warp();
          ctx.each_lane([&](int r) {
            const float h_in =
                tiles > 1 ? static_cast<float>(carry_h[carry_index(map, tiles, tile, nstate, n, r)]) : 0.f;
            float gnext = 0.f;
            if (!sequential) {
              gnext = gin_h[carry_index(map, tiles, tile, nstate, n, r)];
            } else if (tj + 1 < g.tiles_w) {
              gnext = hcar[(s * nstate + n) * kTile + r];
            }
            // The vertical dL/dAbar term gh * h_above * Abar: h_above from the row above, in the
            // tile's first row from the tile above (top), none in the first row of a packed map.
            const bool map_top = r > 0 && ((starts_h >> r) & 1u);
            const auto above = r == 0 ? top : hv + (r - 1) * kStride;
            const float* hrow = hh_row[ctx.lane_slot(r)];
            float dA_lane = 0.f;
SS2D_UNROLL
            for (int c = kTile - 1; c >= 0; --c) {
              if (c + 1 < kTile && ((starts_w >> (c + 1)) & 1u)) gnext = 0.f;
              const int e = tile_offset(r, c);
              const float a = abar[e];
              const float gh = gv[e];
              const float ghh = gh + gnext;
              const float hh_left = c == 0 ? h_in : (((starts_w >> c) & 1u) ? 0.f : hrow[c - 1]);
              const float vertical = map_top ? 0.f : gh * static_cast<float>(above[c]) * a;
              const float dabar = vertical + ghh * hh_left * a;
              gv[e] = ghh;
              abar[e] = dabar * a_n;
              dA_lane += dabar * dts[e];
              gnext = a * ghh;
            }
            if (sequential) hcar[(s * nstate + n) * kTile + r] = gnext;
            lane_dA[r] = dA_lane;
          });
          ctx.sync_warp();
          ctx.each_lane([&](int lane) {
            if (lane != 0) return;
            float total = 0.f;
SS2D_UNROLL
            for (int i = 0; i < kTile; ++i) total += lane_dA[i];
            dA_s[s * nstate + n] += total;
          });
        });
        if (!full) {
          if (round + 1 < rounds) ctx.barrier();  // the next round's A rewrites the warp tiles
          continue;
        }
        ctx.barrier();
        const bool last = round + 1 == rounds;
        each_quad(ctx, [&](int t, int r, int c0) {
          const QuadPlace at = quad_place(g, bb, ti, tj, r, c0);
          // Per-state dB / dC sums over the channels, in registers indexed by unrolled loops (no
          // local memory); the channels one per trip of a rolled loop (one copy of the du /
          // ddelta accesses in the code).
          float db[kMaxWarps][kQuad], dc[kMaxWarps][kQuad];
SS2D_UNROLL
          for (int j = 0; j < kMaxWarps; ++j) {
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) db[j][k] = dc[j][k] = 0.f;
          }
SS2D_UNROLL_BY(1)
          for (int s = 0; s < channels; ++s) {
            const Plane pl{g.dim, d0 + s};
            // u and dy: kept on chip with several rounds, else read again (from L2: the block read
            // them in this tile's first phase), which leaves room for a third block per SM.
            float uq[kQuad], dyq[kQuad];
            if (keep_inputs) {
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const int ce = s * kTileFloats + tile_offset(r, c0 + k);
                uq[k] = u_t[ce];
                dyq[k] = dy_t[ce];
              }
            } else {
              load_quad<T>(ctx, g, u, pl, at, uq);
              if (p.dy_fp32) {
                load_quad<float>(ctx, g, dy32, pl, at, dyq);
              } else {
                load_quad<T>(ctx, g, dyT, pl, at, dyq);
              }
            }
            float sumb[kQuad], ddt[kQuad];
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              const int ce = s * kTileFloats + tile_offset(r, c0 + k);
              sumb[k] = round > 0 ? static_cast<float>(sumb_t[ce]) : 0.f;
              ddt[k] = round > 0 ? static_cast<float>(ddt_t[ce]) : 0.f;
            }
SS2D_UNROLL
            for (int j = 0; j < kMaxWarps; ++j) {
              if (j >= wpc || round * wpc + j >= nstate) continue;
              const int w = s * wpc + j;
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const int e = tile_offset(r, c0 + k);
                const int ce = s * kTileFloats + e;
                const float ghh = warp_t[(w * kBackwardWarpTiles + 2) * kTileFloats + e];
                const float uv = uq[k];
                const float bv = b_t[j * kTileFloats + e];
                db[j][k] += ghh * dt_t[ce] * uv;
                dc[j][k] += dyq[k] * warp_t[(w * kBackwardWarpTiles + 1) * kTileFloats + e];
                sumb[k] += ghh * bv;
                ddt[k] += warp_t[(w * kBackwardWarpTiles + 0) * kTileFloats + e] + ghh * bv * uv;
              }
            }
            if (!last) {
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const int ce = s * kTileFloats + tile_offset(r, c0 + k);
                sumb_t[ce] = sumb[k];
                ddt_t[ce] = ddt[k];
              }
              continue;
            }
            // Padding cells: dy = u = 0 and no gradient reaches them, so their terms are 0; their
            // du / ddelta are not stored.
            const float dskip = p.D ? p.D[d0 + s] : 0.f;
            float duq[kQuad], ddq[kQuad];
            float dD_terms = 0.f, ddb_terms = 0.f;
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              const float dt = dt_t[s * kTileFloats + tile_offset(r, c0 + k)];
              const float dyv = dyq[k];
              duq[k] = dt * sumb[k] + dskip * dyv;
              ddq[k] = p.softplus ? ddt[k] * softplus_grad_from_value(dt) : ddt[k];
              dD_terms += dyv * uq[k];
              ddb_terms += ddq[k];
            }
            // The thread's shares of channel s (selected, not indexed at run time: no local memory).
SS2D_UNROLL
            for (int i = 0; i < kMaxWarps; ++i) {
              if (i != s) continue;
              part[ctx.thread_slot(t)][0][i] += dD_terms;
              part[ctx.thread_slot(t)][1][i] += ddb_terms;
            }
            store_quad<T>(ctx, g, du_g, pl, at, duq);
            store_quad<T>(ctx, g, ddelta_g, pl, at, ddq);
          }
SS2D_UNROLL
          for (int j = 0; j < kMaxWarps; ++j) {
            const int n = round * wpc + j;
            if (j >= wpc || n >= nstate) continue;
            const Plane bpl = bc_planes(n);
            add_quad(ctx, g, dB, bpl, at, db[j]);
            add_quad(ctx, g, dC, bpl, at, dc[j]);
          }
        });
        // No barrier: the next round's (or tile's) A rewrites only cells this thread itself read.
      }
    }
    if (full) {
      // dD / ddelta_bias: the threads' shares summed in thread order (the warp tiles are free now).
      ctx.barrier();
      auto red = ctx.template shared<float>(smem, l.warp, 2 * channels * nthreads);
      ctx.each_thread([&](int t) {
SS2D_UNROLL
        for (int s = 0; s < kMaxWarps; ++s) {
          if (s >= channels) continue;
          red[s * nthreads + t] = part[ctx.thread_slot(t)][0][s];
          red[(channels + s) * nthreads + t] = part[ctx.thread_slot(t)][1][s];
        }
      });
      ctx.barrier();
      ctx.each_thread([&](int t) {
        if (t >= channels) return;
        float dD = 0.f, ddb = 0.f;
        for (int i = 0; i < nthreads; ++i) {
          dD += red[t * nthreads + i];
          ddb += red[(channels + t) * nthreads + i];
        }
        const int64_t map = static_cast<int64_t>(bb) * g.dim + d0 + t;
        const int64_t row = (sequential ? 0 : tile_z) * maps(g) + map;
        dD_part[row] = dD;
        ddb_part[row] = ddb;
        for (int n = 0; n < nstate; ++n) dA_part[row * nstate + n] = dA_s[t * nstate + n];
      });
    }
    if (set + channels < per_slice) ctx.barrier();  // before the next channels reuse the tiles
  }
}

// Tile-parallel passes, in between: the true carries into every tile from the per-tile edges.
// Along tile rows (rows) or down tile columns; forward: carry[t] = edge[t-1] + prod[t-1] * carry[t-1]
// from the first tile on; reverse (backward, gradients flow right-to-left / bottom-to-top) from the
// last tile on. One thread per (map, state, lane line, band of tiles), walking the band's tiles in
// order; consecutive threads touch consecutive floats.
template <class Ctx>
SS2D_HD void carry_scan_block(Ctx& ctx, const Params& p, int block, const CarryScan& scan) {
  const Geometry& g = p.g;
  const int tiles = g.tiles_h * g.tiles_w;
  const int64_t numel = carry_numel(g, true);
  auto edge = ctx.global(scan.edge, numel);
  auto prod = ctx.global(scan.prod, numel);
  auto carry = ctx.global(scan.carry, numel);
  const int bands = scan.rows ? g.tiles_h : g.tiles_w;
  const int steps = scan.rows ? g.tiles_w : g.tiles_h;
  const int64_t lines = carry_scan_lines(g, scan.rows);
  ctx.each_thread([&](int t) {
    const int64_t line = static_cast<int64_t>(block) * ctx.nthreads() + t;
    if (line >= lines) return;
    const int k = static_cast<int>(line % kTile);
    int64_t rest = line / kTile;
    const int n = static_cast<int>(rest % g.nstate);
    rest /= g.nstate;
    const int band = static_cast<int>(rest % bands);
    const int64_t map = rest / bands;
    float c = 0.f;
    for (int step = 0; step < steps; ++step) {
      const int along = scan.reverse ? steps - 1 - step : step;
      const int tile = scan.rows ? band * g.tiles_w + along : along * g.tiles_w + band;
      const int64_t at = carry_index(map, tiles, tile, g.nstate, n, k);
      carry[at] = c;
      if (step + 1 < steps) c = edge[at] + prod[at] * c;
    }
  });
}

}  // namespace scan2d
}  // namespace vmamba2d
