// The tiled 2D selective scan v2 (DESIGN.md sections 1 and 7), forward and backward, written once
// for two execution contexts:
//   * DeviceCtx (scan2d_device.cuh, the .cu files): one CUDA thread per (warp, lane);
//     each_thread / each_warp / each_lane run the body for the calling thread only, barrier() is
//     __syncthreads(), sync_warp() is __syncwarp(), shared / global views are raw pointers.
//   * HostCtx (selective_scan_2d_emulate.cpp): one CPU thread runs every (warp, lane) of a block in
//     a chosen order (forward, reversed, shuffled), views are bounds-checked and every shared
//     access is recorded by a race detector, so the very code the GPU runs is tested on the CPU.
// Rules that keep the two equivalent: no barrier inside each_thread / each_warp; shared or global
// memory is touched only inside each_thread / each_lane; state that lives across each_lane calls is
// indexed by ctx.lane_slot(lane); threads of one phase exchange data only across a barrier (block)
// or a sync_warp (warp) -- the emulation's race detector enforces the last rule.
//
// Global accesses of u, delta, B, C, dy, y, du, ddelta move quads of kQuad consecutive cells of a
// tile row (load_quad / store_quad): one 16-byte (fp32) / 8-byte (fp16, bf16) vector access when
// the four cells are consecutive in memory and aligned (ctx.vector_aligned / load_vector /
// store_vector; the host model checks alignment and bounds of each), else one scalar access per
// real cell (map edges, pack boundaries, rows of a width that is not a multiple of 4, misaligned
// base pointers). A warp-wide quad access covers four whole tile rows.
//
// Forward, per block (a batch block of packed maps and `channels` channels of one group), per tile:
//   1. all threads load dt = softplus(delta + bias) and u quads of each channel into shared tiles;
//      at N = 1 each channel has a single warp, which loads its dt / u quads itself in step 2;
//   2. warp w (channel w / wpc, states w % wpc, + wpc, ...), per state: the lanes load B quads and
//      store x = dt * B * u and Abar = exp(dt * A) -- the only exp of the pass; lane r scans tile
//      row r (hh, carry from the tile on the left); lane c scans tile column c (h, carry from the
//      tile above) and accumulates C * h into the warp's y tile (C: one coalesced scalar load per
//      row, fused into the scan);
//   3. all threads sum the warps' y partials of each channel (fixed order), add D * u, store y
//      quads.
// Only y and the per-state tile carries (kTile floats per tile edge, saved for the backward) go to
// global memory. When the maps are too few to fill the GPU, the tiles of a map run in parallel
// (ForwardPass in scan2d_common.h): the scan is linear in the carries, so edges computed with zero
// carry-in plus the product of Abar along each edge line give every tile's true carries after a
// short sequential scan over tiles (carry_scan_block).
#pragma once

#include <math.h>

#include "scan2d_common.h"

namespace vmamba2d {
namespace scan2d {

constexpr float kLog2e = 1.4426950408889634f;

// Conversion of the kernel's element type to / from fp32; the .cu files specialise it for the
// CUDA half types, the host emulation uses c10's (both convert with round-to-nearest-even).
template <class T>
struct Element {
  static SS2D_HD SS2D_INLINE float load(T v) { return static_cast<float>(v); }
  static SS2D_HD SS2D_INLINE T store(float v) { return T(v); }
};

// torch.nn.functional.softplus with its default threshold 20.
SS2D_HD SS2D_INLINE float softplus(float z) { return z > 20.f ? z : log1pf(expf(z)); }

// d softplus(z) / dz = sigmoid(z) = 1 - exp(-softplus(z)), without cancellation for small dt.
SS2D_HD SS2D_INLINE float softplus_grad_from_value(float dt) { return -expm1f(-dt); }

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

// One tile column of B / C for a lane (lane = column c, state n): cell r sits at
// base + pr * pack_step + (r - pr * seg_h) * width with pr = r / seg_h, so the per-row work in the
// unrolled column loops is one multiply-add (no per-cell batch / map arithmetic).
struct ColumnWalk {
  int64_t base;
  int64_t pack_step;
  int64_t first_batch;
  int first_row;
  bool col_ok;
};

SS2D_HD SS2D_INLINE ColumnWalk bc_column(const Geometry& g, int bb, int ti, int tj, int c, int group,
                                         int n) {
  const int pc = small_div(c, g.magic_w);
  const int col = tj * kTile + c - pc * g.seg_w;
  ColumnWalk w;
  w.first_batch = static_cast<int64_t>(bb) * g.pack_rows * g.pack_cols + pc;
  w.first_row = ti * kTile;
  w.col_ok = pc < g.pack_cols && col < g.width;
  w.pack_step = static_cast<int64_t>(g.pack_cols) * g.groups * g.nstate * g.length;
  w.base = ((w.first_batch * g.groups + group) * g.nstate + n) * g.length +
           static_cast<int64_t>(w.first_row) * g.width + col;
  return w;
}

// The same walk over u / delta / dy / du / ddelta (channel d) instead of B / C.
SS2D_HD SS2D_INLINE ColumnWalk ud_column(const Geometry& g, int bb, int ti, int tj, int c, int d) {
  ColumnWalk w = bc_column(g, bb, ti, tj, c, 0, 0);
  const int pc = small_div(c, g.magic_w);
  const int col = tj * kTile + c - pc * g.seg_w;
  w.pack_step = static_cast<int64_t>(g.pack_cols) * g.dim * g.length;
  w.base = (w.first_batch * g.dim + d) * g.length + static_cast<int64_t>(w.first_row) * g.width + col;
  return w;
}

// Offset of cell r of the column in `off`; returns whether the cell is a real map cell.
SS2D_HD SS2D_INLINE bool column_cell(const Geometry& g, const ColumnWalk& w, int r, int64_t& off) {
  const int pr = small_div(r, g.magic_h);
  const int rr = r - pr * g.seg_h;
  off = w.base + pr * w.pack_step + static_cast<int64_t>(rr) * g.width;
  return w.col_ok && pr < g.pack_rows && w.first_batch + static_cast<int64_t>(pr) * g.pack_cols < g.batch &&
         w.first_row + rr < g.height;
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

SS2D_HD SS2D_INLINE int64_t plane_offset(const Geometry& g, const Plane& pl, const TileCell& cell) {
  return (cell.batch * pl.planes + pl.plane) * g.length + cell.pos;
}

// The quad (r, c0 .. c0 + kQuad - 1) of tile (ti, tj) in one plane: whether it is one vector
// access (all cells real and in one map row, hence consecutive in memory, and the address aligned
// to the vector width) and the offset of its first cell.
struct QuadSpan {
  bool vector;
  int64_t off;
};

template <class Ctx, class View>
SS2D_HD SS2D_INLINE QuadSpan quad_span(const Ctx& ctx, const Geometry& g, const View& buf, const Plane& pl,
                                       int bb, int ti, int tj, int r, int c0) {
  const TileCell first = tile_cell(g, bb, ti, tj, r, c0);
  const TileCell last = tile_cell(g, bb, ti, tj, r, c0 + kQuad - 1);
  QuadSpan q;
  q.off = plane_offset(g, pl, first);
  q.vector = first.valid && last.valid && first.batch == last.batch && ctx.vector_aligned(buf, q.off);
  return q;
}

// Loads a quad as fp32 into out (0 on padding cells); returns the mask of real cells (bit k: cell
// c0 + k). Map edges, pack boundaries inside the quad and misaligned rows take the scalar path.
template <class T, class Ctx, class View>
SS2D_HD SS2D_INLINE uint32_t load_quad(const Ctx& ctx, const Geometry& g, const View& src, const Plane& pl,
                                       int bb, int ti, int tj, int r, int c0, float (&out)[kQuad]) {
  const QuadSpan q = quad_span(ctx, g, src, pl, bb, ti, tj, r, c0);
  if (q.vector) {
    const Vec4<T> v = ctx.load_vector(src, q.off);
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) out[k] = Element<T>::load(v.v[k]);
    return (1u << kQuad) - 1;
  }
  uint32_t mask = 0;
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) {
    const TileCell cell = tile_cell(g, bb, ti, tj, r, c0 + k);
    out[k] = cell.valid ? Element<T>::load(src[plane_offset(g, pl, cell)]) : 0.f;
    mask |= cell.valid ? 1u << k : 0u;
  }
  return mask;
}

// Stores the real cells of a quad (element type V: T, or fp32 for an fp32 y).
template <class V, class Ctx, class View>
SS2D_HD SS2D_INLINE void store_quad(const Ctx& ctx, const Geometry& g, const View& dst, const Plane& pl,
                                    int bb, int ti, int tj, int r, int c0, const float (&vals)[kQuad]) {
  const QuadSpan q = quad_span(ctx, g, dst, pl, bb, ti, tj, r, c0);
  if (q.vector) {
    Vec4<V> v;
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) v.v[k] = Element<V>::store(vals[k]);
    ctx.store_vector(dst, q.off, v);
    return;
  }
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) {
    const TileCell cell = tile_cell(g, bb, ti, tj, r, c0 + k);
    if (cell.valid) dst[plane_offset(g, pl, cell)] = Element<V>::store(vals[k]);
  }
}

// The quads of a tile walked by the lanes of a warp: lane l takes column quad l % kQuadsPerRow of
// rows l / kQuadsPerRow + kQuadRowStep * i (a warp-wide access covers kQuadRowStep whole rows;
// the shared-tile stride kTile + 1 keeps the per-cell shared accesses free of bank conflicts).
SS2D_HD SS2D_INLINE int quad_column(int lane) { return (lane & (kQuadsPerRow - 1)) * kQuad; }
SS2D_HD SS2D_INLINE int quad_first_row(int lane) { return lane >> kQuadsPerRowShift; }

// Phase 1 of a tile: dt / u of `channels` consecutive channels from d0 into shared tiles (0 on
// padding cells, so Abar = 1 and x = 0 there); thread t takes quads t, t + nthreads, ... (the
// same quads as the tile's store phase, so the next tile's loads need no barrier after it).
template <class T, class Ctx, class In, class Out>
SS2D_HD void load_channel_tiles(Ctx& ctx, const Params& p, int bb, int ti, int tj, int d0,
                                int channels, const In& u, const In& delta, Out dt_tiles,
                                Out u_tiles) {
  const Geometry& g = p.g;
  ctx.each_thread([&](int t) {
    for (int idx = t; idx < channels * kTileQuads; idx += ctx.nthreads()) {
      const int s = idx >> kTileQuadShift;
      const int r = (idx >> kQuadsPerRowShift) & (kTile - 1);
      const int c0 = quad_column(idx);
      const int d = d0 + s;
      const Plane pl{g.dim, d};
      float dq[kQuad], uq[kQuad];
      const uint32_t real = load_quad<T>(ctx, g, delta, pl, bb, ti, tj, r, c0, dq);
      load_quad<T>(ctx, g, u, pl, bb, ti, tj, r, c0, uq);
      const float bias = p.delta_bias ? p.delta_bias[d] : 0.f;
SS2D_UNROLL
      for (int k = 0; k < kQuad; ++k) {
        const float z = dq[k] + bias;
        const int e = s * kTileFloats + tile_offset(r, c0 + k);
        dt_tiles[e] = ((real >> k) & 1u) ? (p.softplus ? softplus(z) : z) : 0.f;
        u_tiles[e] = uq[k];
      }
    }
  });
}

template <class T, class Ctx>
SS2D_HD void forward_block(Ctx& ctx, const Params& p, int bb, int cblock, int tile_z, char* smem) {
  const Geometry& g = p.g;
  const int nstate = g.nstate;
  const int channels = p.k.fwd_channels;
  const int wpc = p.k.fwd_warps_per_channel;
  const int nwarps = channels * wpc;
  const ForwardLayout l = forward_layout(channels, nwarps, nstate);
  const bool own_loads = forward_loads_per_warp(nstate);
  const int channel_floats = own_loads ? 0 : channels * kTileFloats;
  auto dt_t = ctx.template shared<float>(smem, l.dt, channel_floats);
  auto u_t = ctx.template shared<float>(smem, l.u, channel_floats);
  auto x_t = ctx.template shared<float>(smem, l.x, nwarps * kTileFloats);
  auto abar_t = ctx.template shared<float>(smem, l.abar, nwarps * kTileFloats);
  auto y_t = ctx.template shared<float>(smem, l.y, nwarps * kTileFloats);
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
  const int group = group_of(g, d0);
  const bool sequential = p.pass == kSequential;
  const bool edges_only = p.pass == kRowEdges || p.pass == kColumnEdges;

  const int first_tile = sequential ? 0 : tile_z;
  for (int tile = first_tile; tile < (sequential ? tiles : tile_z + 1); ++tile) {
    const int ti = tile / g.tiles_w;
    const int tj = tile - ti * g.tiles_w;
    // Loads before the scans; at N = 1 (no shared loads) it orders this tile's warp phase after the
    // previous tile's y sums.
    if (!own_loads) load_channel_tiles<T>(ctx, p, bb, ti, tj, d0, channels, u, delta, dt_t, u_t);
    if (!own_loads || tile != first_tile) ctx.barrier();
    const int vslot_in = p.record ? tile : tj;
    const int vslot_out = p.record ? tile + g.tiles_w : tj;
    ctx.each_warp([&](int w) {
      const int s = w / wpc;
      const int d = d0 + s;
      const int64_t map = static_cast<int64_t>(bb) * g.dim + d;
      auto dts = dt_t + s * kTileFloats;
      auto us = u_t + s * kTileFloats;
      auto x = x_t + w * kTileFloats;
      auto abar = abar_t + w * kTileFloats;
      auto yp = y_t + w * kTileFloats;
      if (!edges_only && !own_loads) {
        ctx.each_lane([&](int lane) {
SS2D_UNROLL
          for (int r = 0; r < kTile; ++r) yp[tile_offset(r, lane)] = 0.f;
        });
      }
      for (int n = w % wpc; n < nstate; n += wpc) {
        const float a2 = p.A[static_cast<int64_t>(d) * nstate + n] * kLog2e;
        const Plane bpl{static_cast<int64_t>(g.groups) * nstate, static_cast<int64_t>(group) * nstate + n};
        if (own_loads) {
          // N = 1: dt, u and B quads straight into x and Abar; y starts at D * u.
          const float bias = p.delta_bias ? p.delta_bias[d] : 0.f;
          const float dskip = p.D ? p.D[d] : 0.f;
          const Plane upl{g.dim, d};
          ctx.each_lane([&](int lane) {
            const int c0 = quad_column(lane);
SS2D_UNROLL_BY(2)
            for (int r = quad_first_row(lane); r < kTile; r += kQuadRowStep) {
              float dq[kQuad], uq[kQuad], bq[kQuad];
              const uint32_t real = load_quad<T>(ctx, g, delta, upl, bb, ti, tj, r, c0, dq);
              load_quad<T>(ctx, g, u, upl, bb, ti, tj, r, c0, uq);
              load_quad<T>(ctx, g, Bg, bpl, bb, ti, tj, r, c0, bq);
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const float z = dq[k] + bias;
                const float dt = ((real >> k) & 1u) ? (p.softplus ? softplus(z) : z) : 0.f;
                const int e = tile_offset(r, c0 + k);
                x[e] = dt * uq[k] * bq[k];
                abar[e] = exp2f(dt * a2);
                if (!edges_only) yp[e] = dskip * uq[k];
              }
            }
          });
        } else {
          // x = dt * B * u and Abar from the channel tiles and B quads.
          ctx.each_lane([&](int lane) {
            const int c0 = quad_column(lane);
SS2D_UNROLL_BY(2)
            for (int r = quad_first_row(lane); r < kTile; r += kQuadRowStep) {
              float bq[kQuad];
              load_quad<T>(ctx, g, Bg, bpl, bb, ti, tj, r, c0, bq);
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const int e = tile_offset(r, c0 + k);
                const float dt = dts[e];
                x[e] = dt * us[e] * bq[k];
                abar[e] = exp2f(dt * a2);
              }
            }
          });
        }
        ctx.sync_warp();
        // Horizontal: hh = Abar * hh_left + x, in place over x.
        ctx.each_lane([&](int r) {
          const int64_t at = carry_index(map, tiles, tile, nstate, n, r);
          float h = 0.f;
          if (sequential) {
            if (tj > 0) h = hcar[(s * nstate + n) * kTile + r];
            if (p.carry_h) carry_h[at] = h;
          } else if (p.pass != kRowEdges) {
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
          if (p.pass == kRowEdges) {
            edge[at] = h;
            prod[at] = decay;
          }
        });
        ctx.sync_warp();
        if (p.pass == kRowEdges) continue;
        // Vertical: h = Abar * h_above + hh; y += C * h (C rows: coalesced loads).
        ctx.each_lane([&](int c) {
          float v = 0.f;
          if (sequential) {
            if (ti > 0) {
              v = carry_v[carry_index(map, vslots, vslot_in, nstate, n, c)];
            } else if (p.record && p.carry_v) {
              carry_v[carry_index(map, vslots, vslot_in, nstate, n, c)] = 0.f;
            }
          } else if (p.pass == kFinal) {
            v = carry_v[carry_index(map, tiles, tile, nstate, n, c)];
          }
          float decay = 1.f;
          const ColumnWalk col = bc_column(g, bb, ti, tj, c, group, n);
SS2D_UNROLL_BY(8)
          for (int r = 0; r < kTile; ++r) {
            if ((starts_h >> r) & 1u) v = decay = 0.f;
            const int e = tile_offset(r, c);
            const float a = abar[e];
            v = a * v + x[e];
            decay *= a;
            int64_t off;
            if (!edges_only && column_cell(g, col, r, off)) yp[e] += Element<T>::load(Cg[off]) * v;
          }
          if (sequential && ti + 1 < g.tiles_h) {
            carry_v[carry_index(map, vslots, vslot_out, nstate, n, c)] = v;
          }
          if (p.pass == kColumnEdges) {
            const int64_t at = carry_index(map, tiles, tile, nstate, n, c);
            edge[at] = v;
            prod[at] = decay;
          }
        });
        ctx.sync_warp();
      }
    });
    if (edges_only) continue;
    ctx.barrier();
    ctx.each_thread([&](int t) {
      for (int idx = t; idx < channels * kTileQuads; idx += ctx.nthreads()) {
        const int s = idx >> kTileQuadShift;
        const int r = (idx >> kQuadsPerRowShift) & (kTile - 1);
        const int c0 = quad_column(idx);
        const int d = d0 + s;
        const float dskip = own_loads || !p.D ? 0.f : p.D[d];
        float yq[kQuad];
SS2D_UNROLL
        for (int k = 0; k < kQuad; ++k) {
          const int e = tile_offset(r, c0 + k);
          float yv = own_loads ? 0.f : dskip * u_t[s * kTileFloats + e];
          for (int j = 0; j < wpc; ++j) yv += y_t[(s * wpc + j) * kTileFloats + e];
          yq[k] = yv;
        }
        const Plane pl{g.dim, d};
        if (p.y_fp32) {
          store_quad<float>(ctx, g, y32, pl, bb, ti, tj, r, c0, yq);
        } else {
          store_quad<T>(ctx, g, yT, pl, bb, ti, tj, r, c0, yq);
        }
      }
    });
    // No barrier here: the next tile's loads write only cells this thread itself read, and the
    // warp buffers are rewritten after the next barrier (the race detector checks this).
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

// Tile-parallel backward, edge passes (one block per tile and channel slice): per state,
//   kColumnEdges: the reverse vertical scan of dy * C with zero carry from below: the carry it
//                 passes up (Abar * dL/dh of the tile's first row) and the product of Abar down the
//                 column; then carry_scan columns in reverse -> grad_in_v;
//   kRowEdges:    the reverse vertical scan from the true grad_in_v, then the reverse horizontal
//                 scan with zero carry from the right: the carry it passes left and the product of
//                 Abar along the row; then carry_scan rows in reverse -> grad_in_h.
// Neither needs B, u or the forward states.
template <class T, class Ctx>
SS2D_HD void backward_edges_block(Ctx& ctx, const Params& p, int bb, int cblock, int tile, char* smem) {
  const Geometry& g = p.g;
  const int nstate = g.nstate;
  const int nwarps = ctx.nwarps();
  const int side = p.k.bwd_channels;  // channels side by side
  const int wpc = nwarps / side;
  const BackwardLayout l = backward_layout(side, nwarps, nstate);
  auto dt_t = ctx.template shared<float>(smem, l.dt, side * kTileFloats);
  auto u_t = ctx.template shared<float>(smem, l.u, side * kTileFloats);
  auto warp_t = ctx.template shared<float>(smem, l.warp, kBackwardWarpTiles * nwarps * kTileFloats);
  const int64_t n_ud = ud_numel(g), n_bc = bc_numel(g);
  auto u = ctx.global(static_cast<const T*>(p.u), n_ud);
  auto delta = ctx.global(static_cast<const T*>(p.delta), n_ud);
  auto Cg = ctx.global(static_cast<const T*>(p.C), n_bc);
  auto dy32 = ctx.global(static_cast<const float*>(p.dy_fp32 ? p.dy : nullptr), n_ud);
  auto dyT = ctx.global(static_cast<const T*>(p.dy_fp32 ? nullptr : p.dy), n_ud);
  auto load_dy = [&](int64_t off) {
    return p.dy_fp32 ? static_cast<float>(dy32[off]) : Element<T>::load(dyT[off]);
  };
  const int64_t numel = carry_numel(g, true);
  auto edge = ctx.global(p.edge, numel);
  auto prod = ctx.global(p.prod, numel);
  auto gin_v = ctx.global(p.grad_in_v, numel);
  const bool vertical = p.pass == kColumnEdges;
  const int tiles = g.tiles_h * g.tiles_w;
  const int ti = tile / g.tiles_w;
  const int tj = tile - ti * g.tiles_w;
  const uint32_t starts_h = segment_starts(g.seg_h);
  const uint32_t starts_w = segment_starts(g.seg_w);
  const int slices = p.k.slices;
  const int slice = cblock % slices;
  const int group = cblock / slices;
  const int channels = g.dim / g.groups / slices;

  for (int k = 0; k < channels; k += side) {
    const int d0 = group * (g.dim / g.groups) + slice * channels + k;
    load_channel_tiles<T>(ctx, p, bb, ti, tj, d0, side, u, delta, dt_t, u_t);
    ctx.barrier();
    ctx.each_warp([&](int w) {
      const int d = d0 + w / wpc;
      const int64_t map = static_cast<int64_t>(bb) * g.dim + d;
      auto dts = dt_t + (w / wpc) * kTileFloats;
      auto cg = warp_t + (w * kBackwardWarpTiles + 1) * kTileFloats;  // C, then dL/dh
      auto abar_t = warp_t + (w * kBackwardWarpTiles + 3) * kTileFloats;
      for (int n = w % wpc; n < nstate; n += wpc) {
        const float a2 = p.A[static_cast<int64_t>(d) * nstate + n] * kLog2e;
        ctx.sync_warp();
        const Plane bpl{static_cast<int64_t>(g.groups) * nstate, static_cast<int64_t>(group) * nstate + n};
        ctx.each_lane([&](int lane) {
          const int c0 = quad_column(lane);
SS2D_UNROLL_BY(2)
          for (int r = quad_first_row(lane); r < kTile; r += kQuadRowStep) {
            float cq[kQuad];
            load_quad<T>(ctx, g, Cg, bpl, bb, ti, tj, r, c0, cq);
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              const int e = tile_offset(r, c0 + k);
              cg[e] = cq[k];
              abar_t[e] = exp2f(dts[e] * a2);
            }
          }
        });
        ctx.sync_warp();
        ctx.each_lane([&](int c) {
          const int64_t at = carry_index(map, tiles, tile, nstate, n, c);
          float gnext = vertical ? 0.f : static_cast<float>(gin_v[at]);
          float decay = 1.f;
          const ColumnWalk dyc = ud_column(g, bb, ti, tj, c, d);
SS2D_UNROLL_BY(4)
          for (int r = kTile - 1; r >= 0; --r) {
            if (r + 1 < kTile && ((starts_h >> (r + 1)) & 1u)) gnext = decay = 0.f;
            const int e = tile_offset(r, c);
            const float a = abar_t[e];
            int64_t off;
            const float dyv = column_cell(g, dyc, r, off) ? load_dy(off) : 0.f;
            const float gh = dyv * cg[e] + gnext;
            cg[e] = gh;
            gnext = a * gh;
            decay *= a;
          }
          if (vertical) {
            edge[at] = gnext;
            prod[at] = decay;
          }
        });
        if (vertical) continue;
        ctx.sync_warp();
        ctx.each_lane([&](int r) {
          float gnext = 0.f;
          float decay = 1.f;
SS2D_UNROLL_BY(4)
          for (int c = kTile - 1; c >= 0; --c) {
            if (c + 1 < kTile && ((starts_w >> (c + 1)) & 1u)) gnext = decay = 0.f;
            const int e = tile_offset(r, c);
            const float a = abar_t[e];
            gnext = a * (cg[e] + gnext);
            decay *= a;
          }
          const int64_t at = carry_index(map, tiles, tile, nstate, n, r);
          edge[at] = gnext;
          prod[at] = decay;
        });
      }
    });
    if (k + side < channels) ctx.barrier();  // before the next channels' tiles replace these
  }
}

// Backward of one block: the channels of slice `cblock % slices` of group `cblock / slices`,
// bwd_channels at a time side by side (warp w on channel w / wpc; at N = 1 four channels of one
// warp each, whose dB / dC the block sums in channel order before one add per cell). Per channel the tiles are walked in reverse (bottom-right first), or, in the
// tile-parallel final pass (kFinal), only tile `tile_z` with the gradient carries into it from
// grad_in_v / grad_in_h (backward_edges_block + carry_scan_block). Per tile and
// state (warp w takes states w % wpc, + wpc, ...): the lanes load B and C quads and compute
// Abar once; recompute hh (row lanes) and h (column lanes) from the saved carries; the reverse
// vertical scan
//     gh[r] = dy[r] * C[r] + Abar[r+1] * gh[r+1]
// (column lanes; dC = dy * h, staged in a tile; the vertical part of dL/dAbar, gh * h[r-1]) and the
// reverse horizontal scan
//     ghh[c] = gh[c] + Abar[c+1] * ghh[c+1]
// (row lanes; dx = ghh gives dB = dx * dt * u (staged in the B tile, then added row-coalesced),
// du += dx * dt * B and the horizontal part of dL/dAbar, ghh * hh[c-1]); then the column lanes add
// the staged dB / dC rows to the slice's partial buffers (coalesced; with channels side by side
// the block does, summing them over the channels first).
// dL/ddt = sum_n dx * B * u + dL/dAbar * Abar * A. dB / dC of a state are added by one warp or by
// the block's sum only, and the block owns its slice's partial buffer: plain adds in a fixed
// order, no atomics.
template <class T, class Ctx>
SS2D_HD void backward_block(Ctx& ctx, const Params& p, int bb, int cblock, int tile_z, char* smem) {
  const Geometry& g = p.g;
  const int nstate = g.nstate;
  const int nwarps = ctx.nwarps();
  const int nthreads = ctx.nthreads();
  const int side = p.k.bwd_channels;  // channels side by side (N = 1 only)
  const int wpc = nwarps / side;
  const BackwardLayout l = backward_layout(side, nwarps, nstate);
  auto dt_t = ctx.template shared<float>(smem, l.dt, side * kTileFloats);
  auto u_t = ctx.template shared<float>(smem, l.u, side * kTileFloats);
  auto warp_t = ctx.template shared<float>(smem, l.warp, kBackwardWarpTiles * nwarps * kTileFloats);
  auto hcar = ctx.template shared<float>(smem, l.hcar, side * nstate * kTile);
  auto dA_s = ctx.template shared<float>(smem, l.dA, side * nstate);
  auto lane_s = ctx.template shared<float>(smem, l.lane, nwarps * kTile);
  auto red = ctx.template shared<float>(smem, l.red, 2 * side * nthreads);
  const int64_t n_ud = ud_numel(g), n_bc = bc_numel(g);
  auto u = ctx.global(static_cast<const T*>(p.u), n_ud);
  auto delta = ctx.global(static_cast<const T*>(p.delta), n_ud);
  auto Bg = ctx.global(static_cast<const T*>(p.B), n_bc);
  auto Cg = ctx.global(static_cast<const T*>(p.C), n_bc);
  auto dy32 = ctx.global(static_cast<const float*>(p.dy_fp32 ? p.dy : nullptr), n_ud);
  auto dyT = ctx.global(static_cast<const T*>(p.dy_fp32 ? nullptr : p.dy), n_ud);
  auto load_dy = [&](int64_t off) {
    return p.dy_fp32 ? static_cast<float>(dy32[off]) : Element<T>::load(dyT[off]);
  };
  auto du_g = ctx.global(static_cast<T*>(p.du), n_ud);
  auto ddelta_g = ctx.global(static_cast<T*>(p.ddelta), n_ud);
  const int slices = p.k.slices;
  const int slice = cblock % slices;
  const int group = cblock / slices;
  auto dB = ctx.global(p.dB_part + slice * n_bc, n_bc);
  auto dC = ctx.global(p.dC_part + slice * n_bc, n_bc);
  const bool sequential = p.pass == kSequential;
  const int64_t part_rows = maps(g) * (sequential ? 1 : g.tiles_h * g.tiles_w);
  auto dA_part = ctx.global(p.dA_part, part_rows * nstate);
  auto dD_part = ctx.global(p.dD_part, part_rows);
  auto ddb_part = ctx.global(p.ddb_part, part_rows);
  const int tiles = g.tiles_h * g.tiles_w;
  auto carry_v = ctx.global(p.carry_v, tiles > 1 ? carry_numel(g, true) : 0);
  auto carry_h = ctx.global(p.carry_h, tiles > 1 ? carry_numel(g, true) : 0);
  auto gcarry_v = ctx.global(p.grad_carry_v, tiles > 1 && sequential ? grad_carry_numel(g) : 0);
  auto gin_v = ctx.global(p.grad_in_v, sequential ? 0 : carry_numel(g, true));
  auto gin_h = ctx.global(p.grad_in_h, sequential ? 0 : carry_numel(g, true));
  const uint32_t starts_h = segment_starts(g.seg_h);
  const uint32_t starts_w = segment_starts(g.seg_w);
  const int channels = g.dim / g.groups / slices;

  for (int k = 0; k < channels; k += side) {
    const int d0 = group * (g.dim / g.groups) + slice * channels + k;
    ctx.each_thread([&](int t) {
      for (int i = t; i < 2 * side * nthreads; i += nthreads) red[i] = 0.f;
      for (int i = t; i < side * nstate; i += nthreads) dA_s[i] = 0.f;
    });
    for (int tile = sequential ? tiles - 1 : tile_z; tile >= (sequential ? 0 : tile_z); --tile) {
      {
        const int ti = tile / g.tiles_w;
        const int tj = tile - ti * g.tiles_w;
        load_channel_tiles<T>(ctx, p, bb, ti, tj, d0, side, u, delta, dt_t, u_t);
        ctx.barrier();
        ctx.each_warp([&](int w) {
          const int s = w / wpc;
          const int d = d0 + s;
          const int64_t map = static_cast<int64_t>(bb) * g.dim + d;
          auto dts = dt_t + s * kTileFloats;
          auto us = u_t + s * kTileFloats;
          auto bs = warp_t + (w * kBackwardWarpTiles + 0) * kTileFloats;  // B, then dB
          auto cg = warp_t + (w * kBackwardWarpTiles + 1) * kTileFloats;  // C, then dL/dh
          auto hh = warp_t + (w * kBackwardWarpTiles + 2) * kTileFloats;  // hh, then du
          auto abar_t = warp_t + (w * kBackwardWarpTiles + 3) * kTileFloats;
          auto dd = warp_t + (w * kBackwardWarpTiles + 4) * kTileFloats;   // dL/ddt
          auto dc = warp_t + (w * kBackwardWarpTiles + 5) * kTileFloats;   // dC of the state
          auto lane_dA = lane_s + w * kTile;
          float du_row[Ctx::kLaneSlots][kTile];
          ctx.each_lane([&](int lane) {
SS2D_UNROLL
            for (int i = 0; i < kTile; ++i) {
              du_row[ctx.lane_slot(lane)][i] = 0.f;
              dd[tile_offset(i, lane)] = 0.f;
            }
          });
          for (int n = w % wpc; n < nstate; n += wpc) {
            const float a_n = p.A[static_cast<int64_t>(d) * nstate + n];
            const float a2 = a_n * kLog2e;
            ctx.sync_warp();
            const Plane bpl{static_cast<int64_t>(g.groups) * nstate, static_cast<int64_t>(group) * nstate + n};
            ctx.each_lane([&](int lane) {
              const int c0 = quad_column(lane);
SS2D_UNROLL_BY(2)
              for (int r = quad_first_row(lane); r < kTile; r += kQuadRowStep) {
                float bq[kQuad], cq[kQuad];
                load_quad<T>(ctx, g, Bg, bpl, bb, ti, tj, r, c0, bq);
                load_quad<T>(ctx, g, Cg, bpl, bb, ti, tj, r, c0, cq);
SS2D_UNROLL
                for (int k = 0; k < kQuad; ++k) {
                  const int e = tile_offset(r, c0 + k);
                  bs[e] = bq[k];
                  cg[e] = cq[k];
                  abar_t[e] = exp2f(dts[e] * a2);
                }
              }
            });
            ctx.sync_warp();
            // Recompute hh (row lanes) from the saved carry into this tile.
            ctx.each_lane([&](int r) {
              float h = tiles > 1 ? static_cast<float>(carry_h[carry_index(map, tiles, tile, nstate, n, r)]) : 0.f;
SS2D_UNROLL
              for (int c = 0; c < kTile; ++c) {
                if ((starts_w >> c) & 1u) h = 0.f;
                const int e = tile_offset(r, c);
                h = abar_t[e] * h + dts[e] * us[e] * bs[e];
                hh[e] = h;
              }
            });
            ctx.sync_warp();
            // Recompute h into the dC tile, then the reverse vertical scan (column lanes), which
            // replaces h[r] by dC = dy * h[r] once h[r] and h[r-1] have been used.
            ctx.each_lane([&](int c) {
              const float v_in =
                  tiles > 1 ? static_cast<float>(carry_v[carry_index(map, tiles, tile, nstate, n, c)]) : 0.f;
              float v = v_in;
SS2D_UNROLL_BY(8)
              for (int r = 0; r < kTile; ++r) {
                if ((starts_h >> r) & 1u) v = 0.f;
                const int e = tile_offset(r, c);
                v = abar_t[e] * v + hh[e];
                dc[e] = v;
              }
              const int64_t gslot = carry_index(map, g.tiles_w, tj, nstate, n, c);
              float gnext = 0.f;
              if (!sequential) {
                gnext = gin_v[carry_index(map, tiles, tile, nstate, n, c)];
              } else if (ti + 1 < g.tiles_h) {
                gnext = gcarry_v[gslot];
              }
              float dA_lane = 0.f;
              const ColumnWalk dyc = ud_column(g, bb, ti, tj, c, d);
SS2D_UNROLL_BY(8)
              for (int r = kTile - 1; r >= 0; --r) {
                if (r + 1 < kTile && ((starts_h >> (r + 1)) & 1u)) gnext = 0.f;
                const int e = tile_offset(r, c);
                const float abar = abar_t[e];
                int64_t off;
                const float dyv = column_cell(g, dyc, r, off) ? load_dy(off) : 0.f;
                const float gh = dyv * cg[e] + gnext;
                const float h_above =
                    r == 0 ? v_in : (((starts_h >> r) & 1u) ? 0.f : static_cast<float>(dc[e - kStride]));
                const float dabar = gh * h_above * abar;
                dc[e] = dyv * dc[e];
                dd[e] += dabar * a_n;
                dA_lane += dabar * dts[e];
                cg[e] = gh;
                gnext = abar * gh;
              }
              if (sequential && ti > 0) gcarry_v[gslot] = gnext;
              lane_dA[c] = dA_lane;
            });
            ctx.sync_warp();
            // Reverse horizontal scan (row lanes); the dB contribution replaces B in its tile.
            ctx.each_lane([&](int r) {
              const float h_in =
                  tiles > 1 ? static_cast<float>(carry_h[carry_index(map, tiles, tile, nstate, n, r)]) : 0.f;
              float gnext = 0.f;
              if (!sequential) {
                gnext = gin_h[carry_index(map, tiles, tile, nstate, n, r)];
              } else if (tj + 1 < g.tiles_w) {
                gnext = hcar[(s * nstate + n) * kTile + r];
              }
              float dA_lane = 0.f;
              float* du = du_row[ctx.lane_slot(r)];
SS2D_UNROLL
              for (int c = kTile - 1; c >= 0; --c) {
                if (c + 1 < kTile && ((starts_w >> (c + 1)) & 1u)) gnext = 0.f;
                const int e = tile_offset(r, c);
                const float dt = dts[e];
                const float uv = us[e];
                const float bv = bs[e];
                const float abar = abar_t[e];
                const float ghh = cg[e] + gnext;
                const float hh_left =
                    c == 0 ? h_in : (((starts_w >> c) & 1u) ? 0.f : static_cast<float>(hh[e - 1]));
                const float dabar = ghh * hh_left * abar;
                bs[e] = ghh * dt * uv;
                du[c] += ghh * dt * bv;
                dd[e] += ghh * bv * uv + dabar * a_n;
                dA_lane += dabar * dt;
                gnext = abar * ghh;
              }
              if (sequential) hcar[(s * nstate + n) * kTile + r] = gnext;
              lane_dA[r] += dA_lane;
            });
            ctx.sync_warp();
            // One channel per block: dB and dC rows, coalesced (column lanes); several: they stay
            // in the warp's tiles for the block-wide sum below. Lane 0 adds the state's dA.
            ctx.each_lane([&](int c) {
              if (side == 1) {
                const ColumnWalk col = bc_column(g, bb, ti, tj, c, group, n);
SS2D_UNROLL_BY(4)
                for (int r = 0; r < kTile; ++r) {
                  int64_t off;
                  if (column_cell(g, col, r, off)) {
                    const int e = tile_offset(r, c);
                    dB[off] += bs[e];
                    dC[off] += dc[e];
                  }
                }
              }
              if (c == 0) {
                float total = 0.f;
                for (int i = 0; i < kTile; ++i) total += lane_dA[i];
                dA_s[s * nstate + n] += total;
              }
            });
          }
          ctx.sync_warp();
          ctx.each_lane([&](int r) {
SS2D_UNROLL
            for (int c = 0; c < kTile; ++c) hh[tile_offset(r, c)] = du_row[ctx.lane_slot(r)][c];
          });
        });
        ctx.barrier();
        ctx.each_thread([&](int t) {
          for (int idx = t; idx < side * kTileQuads; idx += nthreads) {
            const int s = idx >> kTileQuadShift;
            const int r = (idx >> kQuadsPerRowShift) & (kTile - 1);
            const int c0 = quad_column(idx);
            const int d = d0 + s;
            const float dskip = p.D ? p.D[d] : 0.f;
            const Plane pl{g.dim, d};
            float dyq[kQuad], duq[kQuad], ddq[kQuad];
            const uint32_t real = p.dy_fp32 ? load_quad<float>(ctx, g, dy32, pl, bb, ti, tj, r, c0, dyq)
                                            : load_quad<T>(ctx, g, dyT, pl, bb, ti, tj, r, c0, dyq);
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              const int e = tile_offset(r, c0 + k);
              float ddt = 0.f;
              float duv = dskip * dyq[k];
              for (int w = s * wpc; w < (s + 1) * wpc; ++w) {
                duv += warp_t[(w * kBackwardWarpTiles + 2) * kTileFloats + e];
                ddt += warp_t[(w * kBackwardWarpTiles + 4) * kTileFloats + e];
              }
              // Padding cells: dy = 0 and u = 0 there, and their du / ddelta are not stored.
              const float dt = dt_t[s * kTileFloats + e];
              const float ddv = p.softplus ? ddt * softplus_grad_from_value(dt) : ddt;
              red[s * nthreads + t] += dyq[k] * u_t[s * kTileFloats + e];
              red[(side + s) * nthreads + t] += ((real >> k) & 1u) ? ddv : 0.f;
              duq[k] = duv;
              ddq[k] = ddv;
            }
            store_quad<T>(ctx, g, du_g, pl, bb, ti, tj, r, c0, duq);
            store_quad<T>(ctx, g, ddelta_g, pl, bb, ti, tj, r, c0, ddq);
          }
          if (side == 1) return;
          // N = 1, several channels of the group: their dB / dC of the one state (warp w = channel
          // w) summed on chip in channel order, one add per cell into the slice's partials.
          const Plane bpl{static_cast<int64_t>(g.groups), group};
          for (int idx = t; idx < kTileQuads; idx += nthreads) {
            const int r = idx >> kQuadsPerRowShift;
            const int c0 = quad_column(idx);
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              const TileCell cell = tile_cell(g, bb, ti, tj, r, c0 + k);
              if (!cell.valid) continue;
              const int e = tile_offset(r, c0 + k);
              float db = 0.f, dc = 0.f;
              for (int w = 0; w < nwarps; ++w) {
                db += warp_t[(w * kBackwardWarpTiles + 0) * kTileFloats + e];
                dc += warp_t[(w * kBackwardWarpTiles + 5) * kTileFloats + e];
              }
              const int64_t off = plane_offset(g, bpl, cell);
              dB[off] += db;
              dC[off] += dc;
            }
          }
        });
        // No barrier: as in the forward, the next tile's loads touch only this thread's cells.
      }
    }
    ctx.barrier();
    ctx.each_thread([&](int t) {
      if (t >= side) return;
      const int s = t;
      float dD = 0.f, ddb = 0.f;
      for (int i = 0; i < nthreads; ++i) {
        dD += red[s * nthreads + i];
        ddb += red[(side + s) * nthreads + i];
      }
      const int64_t map = static_cast<int64_t>(bb) * g.dim + d0 + s;
      const int64_t row = (sequential ? 0 : tile_z) * maps(g) + map;
      dD_part[row] = dD;
      ddb_part[row] = ddb;
      for (int n = 0; n < nstate; ++n) dA_part[row * nstate + n] = dA_s[s * nstate + n];
    });
    if (k + side < channels) ctx.barrier();  // before the next channels reset the partials
  }
}

}  // namespace scan2d
}  // namespace vmamba2d
