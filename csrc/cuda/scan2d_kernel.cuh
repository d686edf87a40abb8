// The tiled 2D selective scan (DESIGN.md section 1, 2DMamba supplement Algorithm 1), forward and
// backward, written once for two execution contexts:
//   * DeviceCtx (selective_scan_2d_*.cu): one CUDA thread per (warp, lane); each_thread / each_warp
//     / each_lane run the body for the calling thread only, barrier() is __syncthreads().
//   * HostCtx (selective_scan_2d_emulate.cpp): one CPU thread runs every (warp, lane) of a block
//     in turn, so the very same index, carry and gradient code is testable without a GPU.
// Rules that keep the two equivalent: no block barrier inside each_warp; state that lives across
// each_lane calls is indexed by ctx.lane_slot(lane); a phase never reads what another thread of
// the same phase writes.
//
// Per block: one channel d and up to kMaxPack maps (batch entries) of it. Per tile:
//   1. all threads load dt = softplus(delta + bias) and u (and dy) into shared tiles;
//   2. warp w, for each of its states n: loads the B tile; lane r scans tile row r left to right
//      (carry from the tile on the left); lane c scans tile column c top to bottom (carry from the
//      tile above) and accumulates C * h into its y registers;
//   3. all threads sum the warps' y partials, add D * u and write y.
// Only y and the per-state tile carries (kTile floats per tile edge) go to global memory.
#pragma once

#include <math.h>

#include "scan2d_common.h"

namespace vmamba2d {
namespace scan2d {

constexpr float kLog2e = 1.4426950408889634f;

template <class T>
SS2D_HD SS2D_INLINE float to_float(T value) {
  return static_cast<float>(value);
}

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

SS2D_HD SS2D_INLINE int64_t carry_index(int64_t map, int slots, int slot, int nstate, int n, int k) {
  return ((map * slots + slot) * nstate + n) * kTile + k;
}

struct SharedView {
  int64_t* base_ud;
  int64_t* base_bc;
  int* cell_pos;
  int* cell_slot;
  float* dt;
  float* u;
  float* dy;
  float* warp;
  float* hcar;
  float* dA;
  float* lane;
  float* red;
};

SS2D_HD inline SharedView carve_shared(char* smem, const SmemLayout& l, bool backward) {
  SharedView s;
  s.base_ud = reinterpret_cast<int64_t*>(smem + l.base_ud);
  s.base_bc = reinterpret_cast<int64_t*>(smem + l.base_bc);
  s.cell_pos = reinterpret_cast<int*>(smem + l.cell_pos);
  s.cell_slot = reinterpret_cast<int*>(smem + l.cell_slot);
  s.dt = reinterpret_cast<float*>(smem + l.dt);
  s.u = reinterpret_cast<float*>(smem + l.u);
  s.dy = backward ? reinterpret_cast<float*>(smem + l.dy) : nullptr;
  s.warp = reinterpret_cast<float*>(smem + l.warp);
  s.hcar = reinterpret_cast<float*>(smem + l.hcar);
  s.dA = backward ? reinterpret_cast<float*>(smem + l.dA) : nullptr;
  s.lane = backward ? reinterpret_cast<float*>(smem + l.lane) : nullptr;
  s.red = backward ? reinterpret_cast<float*>(smem + l.red) : nullptr;
  return s;
}

// Offsets of the block's map slots for channel d: slot s is batch entry bb * pack + s.
template <class Ctx>
SS2D_HD void setup_slots(Ctx& ctx, const Params& p, const SharedView& s, int bb, int d) {
  const Geometry& g = p.g;
  const int pack = g.pack_rows * g.pack_cols;
  const int group = d / (g.dim / g.groups);
  ctx.each_thread([&](int t) {
    for (int slot = t; slot < kMaxPack; slot += ctx.nthreads()) {
      const int64_t b = static_cast<int64_t>(bb) * pack + slot;
      const bool valid = slot < pack && b < g.batch;
      s.base_ud[slot] = valid ? (b * g.dim + d) * g.length : -1;
      s.base_bc[slot] = valid ? (b * g.groups + group) * g.nstate * g.length : -1;
    }
  });
}

// Phase 1 of a tile: where each cell lives (or -1 for padding) and the dt / u / dy tiles.
template <class T, class Ctx>
SS2D_HD void load_tile(Ctx& ctx, const Params& p, const SharedView& s, int d, int ti, int tj) {
  const Geometry& g = p.g;
  const T* u = static_cast<const T*>(p.u);
  const T* delta = static_cast<const T*>(p.delta);
  const float bias = p.delta_bias ? p.delta_bias[d] : 0.f;
  ctx.each_thread([&](int t) {
    for (int idx = t; idx < kTileCells; idx += ctx.nthreads()) {
      const int r = idx / kTile;
      const int c = idx % kTile;
      const int pr = r / g.seg_h;
      const int pc = c / g.seg_w;
      const int row = ti * kTile + (r - pr * g.seg_h);
      const int col = tj * kTile + (c - pc * g.seg_w);
      const int slot = pr * g.pack_cols + pc;
      int pos = -1;
      if (pr < g.pack_rows && pc < g.pack_cols && row < g.height && col < g.width &&
          s.base_ud[slot] >= 0) {
        pos = row * g.width + col;
      }
      s.cell_pos[idx] = pos;
      s.cell_slot[idx] = pos < 0 ? 0 : slot;
      float dt = 0.f, uv = 0.f, dyv = 0.f;
      if (pos >= 0) {
        const int64_t off = s.base_ud[slot] + pos;
        const float z = to_float(delta[off]) + bias;
        dt = p.softplus ? softplus(z) : z;
        uv = to_float(u[off]);
        if (s.dy != nullptr) {
          dyv = p.dy_fp32 ? static_cast<const float*>(p.dy)[off]
                          : to_float(static_cast<const T*>(p.dy)[off]);
        }
      }
      const int e = r * kStride + c;
      s.dt[e] = dt;
      s.u[e] = uv;
      if (s.dy != nullptr) s.dy[e] = dyv;
    }
  });
}

// Lane c copies tile column c of one state's B or C (0 on padding) into a warp buffer.
template <class T>
SS2D_HD SS2D_INLINE void load_state_column(const SharedView& s, const T* src, int64_t state_off,
                                           int c, float* dst) {
SS2D_UNROLL
  for (int r = 0; r < kTile; ++r) {
    const int idx = r * kTile + c;
    const int pos = s.cell_pos[idx];
    dst[r * kStride + c] =
        pos < 0 ? 0.f : to_float(src[s.base_bc[s.cell_slot[idx]] + state_off + pos]);
  }
}

template <class T, class Ctx>
SS2D_HD void forward_block(Ctx& ctx, const Params& p, int bb, int d, char* smem) {
  const Geometry& g = p.g;
  const int nstate = g.nstate;
  const int nwarps = ctx.nwarps();
  const SharedView s = carve_shared(smem, smem_layout(false, nwarps, nstate), false);
  const T* Bp = static_cast<const T*>(p.B);
  const T* Cp = static_cast<const T*>(p.C);
  const uint32_t starts_h = segment_starts(g.seg_h);
  const uint32_t starts_w = segment_starts(g.seg_w);
  const int64_t map = static_cast<int64_t>(bb) * g.dim + d;  // this block's carry rows
  const int vslots = p.record ? g.tiles_h * g.tiles_w : g.tiles_w;
  const float dskip = p.D ? p.D[d] : 0.f;

  setup_slots(ctx, p, s, bb, d);
  ctx.barrier();
  for (int ti = 0; ti < g.tiles_h; ++ti) {
    for (int tj = 0; tj < g.tiles_w; ++tj) {
      load_tile<T>(ctx, p, s, d, ti, tj);
      ctx.barrier();
      const int vslot_in = p.record ? ti * g.tiles_w + tj : tj;
      const int vslot_out = p.record ? (ti + 1) * g.tiles_w + tj : tj;
      const int hslot = ti * g.tiles_w + tj;
      ctx.each_warp([&](int w) {
        float* buf = s.warp + w * kTileFloats;
        float yacc[Ctx::kLaneSlots][kTile];
        ctx.each_lane([&](int lane) {
SS2D_UNROLL
          for (int r = 0; r < kTile; ++r) yacc[ctx.lane_slot(lane)][r] = 0.f;
        });
        for (int n = w; n < nstate; n += nwarps) {
          const float a2 = p.A[static_cast<int64_t>(d) * nstate + n] * kLog2e;
          const int64_t state_off = static_cast<int64_t>(n) * g.length;
          ctx.each_lane([&](int c) { load_state_column(s, Bp, state_off, c, buf); });
          ctx.sync_warp();
          // Horizontal: hh = Abar * hh_left + dt * B * u, in place over the B tile.
          ctx.each_lane([&](int r) {
            float h = tj == 0 ? 0.f : s.hcar[n * kTile + r];
            if (p.record) p.carry_h[carry_index(map, g.tiles_h * g.tiles_w, hslot, nstate, n, r)] = h;
            const float* dt = s.dt + r * kStride;
            const float* uu = s.u + r * kStride;
            float* row = buf + r * kStride;
SS2D_UNROLL
            for (int c = 0; c < kTile; ++c) {
              if ((starts_w >> c) & 1u) h = 0.f;
              h = exp2f(dt[c] * a2) * h + dt[c] * uu[c] * row[c];
              row[c] = h;
            }
            s.hcar[n * kTile + r] = h;
          });
          ctx.sync_warp();
          // Vertical: h = Abar * h_above + hh; y += C * h.
          ctx.each_lane([&](int c) {
            float v = ti == 0 ? 0.f : p.carry_v[carry_index(map, vslots, vslot_in, nstate, n, c)];
            if (p.record) p.carry_v[carry_index(map, vslots, vslot_in, nstate, n, c)] = v;
            float* ya = yacc[ctx.lane_slot(c)];
SS2D_UNROLL
            for (int r = 0; r < kTile; ++r) {
              if ((starts_h >> r) & 1u) v = 0.f;
              const int e = r * kStride + c;
              v = exp2f(s.dt[e] * a2) * v + buf[e];
              const int idx = r * kTile + c;
              const int pos = s.cell_pos[idx];
              if (pos >= 0) ya[r] += to_float(Cp[s.base_bc[s.cell_slot[idx]] + state_off + pos]) * v;
            }
            if (ti + 1 < g.tiles_h) p.carry_v[carry_index(map, vslots, vslot_out, nstate, n, c)] = v;
          });
          ctx.sync_warp();
        }
        ctx.each_lane([&](int c) {
SS2D_UNROLL
          for (int r = 0; r < kTile; ++r) buf[r * kStride + c] = yacc[ctx.lane_slot(c)][r];
        });
      });
      ctx.barrier();
      if (p.y != nullptr) {
        ctx.each_thread([&](int t) {
          for (int idx = t; idx < kTileCells; idx += ctx.nthreads()) {
            const int pos = s.cell_pos[idx];
            if (pos < 0) continue;
            const int e = (idx / kTile) * kStride + idx % kTile;
            float y = dskip * s.u[e];
            for (int w = 0; w < nwarps; ++w) y += s.warp[w * kTileFloats + e];
            const int64_t off = s.base_ud[s.cell_slot[idx]] + pos;
            if (p.y_fp32) {
              static_cast<float*>(p.y)[off] = y;
            } else {
              static_cast<T*>(p.y)[off] = T(y);
            }
          }
        });
      }
      ctx.barrier();
    }
  }
}

// Backward of one block: channels cb * channels_per_block + k. For each channel the tiles are
// walked in reverse (bottom-right first). Per tile and state: recompute hh (row lanes) and h
// (column lanes) from the recorded carries, then the reverse vertical scan
//     gh[r] = dy[r] * C[r] + Abar[r+1] * gh[r+1]
// (column lanes; gives dC = dy * h and the vertical part of dL/dAbar, gh * h[r-1]) and the reverse
// horizontal scan
//     ghh[c] = gh[c] + Abar[c+1] * ghh[c+1]
// (row lanes; dx = ghh gives dB = dx * dt * u, du += dx * dt * B, and the horizontal part of
// dL/dAbar, ghh * hh[c-1]). dL/ddt = sum_n dx * B * u + dL/dAbar * Abar * A.
template <class T, class Ctx>
SS2D_HD void backward_block(Ctx& ctx, const Params& p, int bb, int cb, char* smem) {
  const Geometry& g = p.g;
  const int nstate = g.nstate;
  const int nwarps = ctx.nwarps();
  const SharedView s = carve_shared(smem, smem_layout(true, nwarps, nstate), true);
  const T* Bp = static_cast<const T*>(p.B);
  const T* Cp = static_cast<const T*>(p.C);
  const uint32_t starts_h = segment_starts(g.seg_h);
  const uint32_t starts_w = segment_starts(g.seg_w);
  const int tiles = g.tiles_h * g.tiles_w;
  const int nthreads = ctx.nthreads();

  for (int k = 0; k < p.channels_per_block; ++k) {
    const int d = cb * p.channels_per_block + k;
    const int64_t map = static_cast<int64_t>(bb) * g.dim + d;  // this block's carry rows
    const float dskip = p.D ? p.D[d] : 0.f;
    ctx.barrier();
    setup_slots(ctx, p, s, bb, d);
    ctx.each_thread([&](int t) {
      s.red[t] = 0.f;
      s.red[nthreads + t] = 0.f;
      for (int n = t; n < nstate; n += nthreads) s.dA[n] = 0.f;
    });
    ctx.barrier();
    for (int ti = g.tiles_h - 1; ti >= 0; --ti) {
      for (int tj = g.tiles_w - 1; tj >= 0; --tj) {
        load_tile<T>(ctx, p, s, d, ti, tj);
        ctx.barrier();
        const int tile = ti * g.tiles_w + tj;
        ctx.each_warp([&](int w) {
          float* bs = s.warp + (w * kBackwardWarpBuffers + 0) * kTileFloats;  // B, later du
          float* cg = s.warp + (w * kBackwardWarpBuffers + 1) * kTileFloats;  // C, then gh
          float* hh = s.warp + (w * kBackwardWarpBuffers + 2) * kTileFloats;  // hh
          float* dd = s.warp + (w * kBackwardWarpBuffers + 3) * kTileFloats;  // dL/ddt
          float* lane_dA = s.lane + w * kTile;
          float du_row[Ctx::kLaneSlots][kTile];
          ctx.each_lane([&](int lane) {
SS2D_UNROLL
            for (int i = 0; i < kTile; ++i) {
              du_row[ctx.lane_slot(lane)][i] = 0.f;
              dd[i * kStride + lane] = 0.f;
            }
          });
          for (int n = w; n < nstate; n += nwarps) {
            const float a_n = p.A[static_cast<int64_t>(d) * nstate + n];
            const float a2 = a_n * kLog2e;
            const int64_t state_off = static_cast<int64_t>(n) * g.length;
            ctx.sync_warp();
            ctx.each_lane([&](int c) {
              load_state_column(s, Bp, state_off, c, bs);
              load_state_column(s, Cp, state_off, c, cg);
            });
            ctx.sync_warp();
            // Recompute hh (row lanes).
            ctx.each_lane([&](int r) {
              float h = tiles > 1 ? p.carry_h[carry_index(map, tiles, tile, nstate, n, r)] : 0.f;
              const float* dt = s.dt + r * kStride;
              const float* uu = s.u + r * kStride;
              const float* brow = bs + r * kStride;
              float* hrow = hh + r * kStride;
SS2D_UNROLL
              for (int c = 0; c < kTile; ++c) {
                if ((starts_w >> c) & 1u) h = 0.f;
                h = exp2f(dt[c] * a2) * h + dt[c] * uu[c] * brow[c];
                hrow[c] = h;
              }
            });
            ctx.sync_warp();
            // Recompute h, then the reverse vertical scan (column lanes).
            ctx.each_lane([&](int c) {
              const float v_in =
                  tiles > 1 ? p.carry_v[carry_index(map, tiles, tile, nstate, n, c)] : 0.f;
              float hcol[kTile];
              float v = v_in;
SS2D_UNROLL
              for (int r = 0; r < kTile; ++r) {
                if ((starts_h >> r) & 1u) v = 0.f;
                const int e = r * kStride + c;
                v = exp2f(s.dt[e] * a2) * v + hh[e];
                hcol[r] = v;
              }
              const int64_t gslot = carry_index(map, g.tiles_w, tj, nstate, n, c);
              float gnext = ti + 1 < g.tiles_h ? p.grad_carry_v[gslot] : 0.f;  // Abar * gh below
              float dA_lane = 0.f;
SS2D_UNROLL
              for (int r = kTile - 1; r >= 0; --r) {
                if (r + 1 < kTile && ((starts_h >> (r + 1)) & 1u)) gnext = 0.f;
                const int e = r * kStride + c;
                const float dt = s.dt[e];
                const float abar = exp2f(dt * a2);
                const float dyv = s.dy[e];
                const float gh = dyv * cg[e] + gnext;
                const int idx = r * kTile + c;
                const int pos = s.cell_pos[idx];
                if (pos >= 0) {
                  ctx.add(p.dC + s.base_bc[s.cell_slot[idx]] + state_off + pos, dyv * hcol[r],
                          p.atomic_bc);
                }
                const float h_above = r == 0 ? v_in : (((starts_h >> r) & 1u) ? 0.f : hcol[r - 1]);
                const float dabar = gh * h_above;
                dd[e] += dabar * abar * a_n;
                dA_lane += dabar * abar * dt;
                cg[e] = gh;
                gnext = abar * gh;
              }
              if (ti > 0) p.grad_carry_v[gslot] = gnext;
              lane_dA[c] = dA_lane;
            });
            ctx.sync_warp();
            // Reverse horizontal scan (row lanes).
            ctx.each_lane([&](int r) {
              const float h_in =
                  tiles > 1 ? p.carry_h[carry_index(map, tiles, tile, nstate, n, r)] : 0.f;
              float gnext = tj + 1 < g.tiles_w ? s.hcar[n * kTile + r] : 0.f;  // Abar * ghh right
              float dA_lane = 0.f;
              float* du = du_row[ctx.lane_slot(r)];
SS2D_UNROLL
              for (int c = kTile - 1; c >= 0; --c) {
                if (c + 1 < kTile && ((starts_w >> (c + 1)) & 1u)) gnext = 0.f;
                const int e = r * kStride + c;
                const float dt = s.dt[e];
                const float uv = s.u[e];
                const float bv = bs[e];
                const float abar = exp2f(dt * a2);
                const float ghh = cg[e] + gnext;
                const int idx = r * kTile + c;
                const int pos = s.cell_pos[idx];
                if (pos >= 0) {
                  ctx.add(p.dB + s.base_bc[s.cell_slot[idx]] + state_off + pos, ghh * dt * uv,
                          p.atomic_bc);
                }
                const float hh_left = c == 0 ? h_in : (((starts_w >> c) & 1u) ? 0.f : hh[e - 1]);
                const float dabar = ghh * hh_left;
                du[c] += ghh * dt * bv;
                dd[e] += ghh * bv * uv + dabar * abar * a_n;
                dA_lane += dabar * abar * dt;
                gnext = abar * ghh;
              }
              s.hcar[n * kTile + r] = gnext;
              lane_dA[r] += dA_lane;
            });
            ctx.sync_warp();
            ctx.each_lane([&](int lane) {
              if (lane == 0) {
                float total = 0.f;
                for (int l = 0; l < kTile; ++l) total += lane_dA[l];
                s.dA[n] += total;
              }
            });
          }
          ctx.sync_warp();
          ctx.each_lane([&](int r) {
SS2D_UNROLL
            for (int c = 0; c < kTile; ++c) bs[r * kStride + c] = du_row[ctx.lane_slot(r)][c];
          });
        });
        ctx.barrier();
        ctx.each_thread([&](int t) {
          for (int idx = t; idx < kTileCells; idx += nthreads) {
            const int pos = s.cell_pos[idx];
            if (pos < 0) continue;
            const int e = (idx / kTile) * kStride + idx % kTile;
            const float dyv = s.dy[e];
            float ddt = 0.f;
            float du = dskip * dyv;
            for (int w = 0; w < nwarps; ++w) {
              du += s.warp[(w * kBackwardWarpBuffers + 0) * kTileFloats + e];
              ddt += s.warp[(w * kBackwardWarpBuffers + 3) * kTileFloats + e];
            }
            const float ddelta = p.softplus ? ddt * softplus_grad_from_value(s.dt[e]) : ddt;
            s.red[t] += dyv * s.u[e];
            s.red[nthreads + t] += ddelta;
            const int64_t off = s.base_ud[s.cell_slot[idx]] + pos;
            static_cast<T*>(p.du)[off] = T(du);
            static_cast<T*>(p.ddelta)[off] = T(ddelta);
          }
        });
        ctx.barrier();
      }
    }
    ctx.each_thread([&](int t) {
      if (t != 0) return;
      float dD = 0.f, ddb = 0.f;
      for (int i = 0; i < nthreads; ++i) {
        dD += s.red[i];
        ddb += s.red[nthreads + i];
      }
      const int64_t row = static_cast<int64_t>(bb) * g.dim + d;
      p.dD_part[row] = dD;
      p.ddb_part[row] = ddb;
      for (int n = 0; n < nstate; ++n) p.dA_part[row * nstate + n] = s.dA[n];
    });
  }
}

}  // namespace scan2d
}  // namespace vmamba2d
