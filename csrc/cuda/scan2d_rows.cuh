// RS, the v4 row-streaming forward of the 2D selective scan at N = 1 (docs/kernels.md, "v4"),
// written once for two execution contexts like the v3 tiles (scan2d_tile.cuh):
//   * RowsDeviceCtx (scan2d_rows_device.cuh): one CUDA thread per lane; each_lane runs the body for
//     the calling lane, the shuffles are __shfl_*_sync over the full warp, views are raw pointers;
//   * the host context (emulation/scan2d_rows_emulate.cpp): one CPU thread runs the 32 lanes of a warp one
//     after another in a chosen order, the shuffles move values between the lanes' slots, and
//     every global access is bounds-, alignment- and race-checked.
// Rules that keep the two equivalent: state that lives across each_lane calls is indexed by
// ctx.slot(lane); lanes exchange values only through the shuffles, which are called between
// each_lane phases (every lane reaches them); a lane touches global memory only inside each_lane.
//
// The design: a warp holds M maps (consecutive (batch, channel) planes); each map is a segment of
// S = ceil(W / V) lanes and each lane owns V consecutive columns of it. The warp streams the map's
// rows in route order (bottom-up for from_bottom routes), with the next P rows of u, delta, B and
// C already loaded into registers (one vector access per tensor and lane and row where the plan
// allows, RowsPlan::load). Per row and lane: dt = softplus(delta + bias), Abar = exp(dt * A),
// x = dt * B * u; the row scan hh[j] = Abar[j] * hh[j - 1] + x[j] as an in-lane scan of the (Abar,
// x) pairs, a segmented warp scan (shuffles up) of the lanes' aggregates and a second in-lane pass
// from the lane's carry-in; the vertical pass h = Abar * h_above + hh with h_above in registers
// (columns-first routes run the vertical pass first, flat routes carry h from a row's last cell
// into the next row instead); y = C * h + D * u, one store per chunk. No shared memory, no
// barrier, no padding cells; the only global traffic is the inputs read once and y written once.
#pragma once

#include "scan2d_math.cuh"
#include "scan2d_rows_common.h"

namespace vmamba2d {
namespace rows {

using scan2d::exp2_flush;
using scan2d::kLog2e;
using scan2d::softplus;

// std::conditional without the standard library (NVRTC).
template <bool kFirst, class A, class B>
struct Pick {
  using type = A;
};
template <class A, class B>
struct Pick<false, A, B> {
  using type = B;
};

// Whether a storage type is fp32 (y in the inputs' type is then y in fp32).
template <class T>
struct IsFloat {
  static constexpr bool value = false;
};
template <>
struct IsFloat<float> {
  static constexpr bool value = true;
};

// E: the element type's traits (Raw, the storage type; to_float / from_float, round to nearest
// even), from the device or the host file. kV columns per lane, kLoad elements per global access
// (kV or 1), kOrder and kFromRight: the route's passes (Order); kPrefetch rows loaded ahead;
// kSteps: the segmented scan's steps, rows_scan_steps(seg_lanes) (>= it is correct, fewer is not;
// the GPU entry checks), or -1 to take rows_scan_steps at run time (the host emulation). kSave
// (2D routes): also store the vertical state (h, or v columns first) of every kBandRows-th row for
// the backward (run_saving).
template <class E, int kV, int kLoad, Order kOrder, bool kFromRight, int kPrefetch, int kSteps, bool kSave = false>
struct RowsForward {
  using Raw = typename E::Raw;
  static constexpr int kChunks = kV / kLoad;
  static_assert(kLoad == kV || kLoad == 1, "a lane's columns load as one vector or one by one");
  static_assert(kPrefetch >= 1, "at least the next row is loaded ahead");
  static_assert(!kSave || kOrder != Order::kFlat, "carries are saved for 2D routes");

  // A lane's registers that live across the phases of a row and from row to row.
  struct Lane {
    int s;              // position in the segment (route order)
    unsigned valid;     // bit j: chunk j is inside the row and the lane is active (stored)
    float a2;           // A[d] * log2(e)
    float bias;
    float skip;         // D[d]
    Raw u[kPrefetch][kV];
    Raw d[kPrefetch][kV];
    Raw b[kPrefetch][kV];
    Raw c[kPrefetch][kV];
    float above[kV];    // rows first: h of the row above; columns first: v of the row above
    float carry;        // flat: h at the previous row's last cell
    float abar[kV];
    float x[kV];
  };

  // Element k of a lane's columns in route order lives at this index of its load buffers (a
  // from_right route walks each chunk's memory elements backwards).
  static SS2D_HD SS2D_INLINE constexpr int at(int k) {
    return kFromRight ? (k / kLoad) * kLoad + (kLoad - 1 - k % kLoad) : k;
  }
  // Memory column offset of chunk j from the lane's first one.
  static SS2D_HD SS2D_INLINE constexpr int chunk_step(int j) { return kFromRight ? -j * kLoad : j * kLoad; }

  template <class Ctx, class View>
  static SS2D_HD SS2D_INLINE void load_row(Ctx& ctx, const View& view, int row_off,
                                           unsigned valid, Raw (&dst)[kV]) {
SS2D_UNROLL
    for (int j = 0; j < kChunks; ++j) {
      // Vector plans (W % V == 0) load every chunk: an idle lane reads a real map's cells too.
      if (kLoad == kV || ((valid >> j) & 1u)) ctx.template load<kLoad>(view, row_off + chunk_step(j), &dst[j * kLoad]);
    }
  }

  // A lane's elements of one row as floats, in route order.
  static SS2D_HD SS2D_INLINE void widen(const Raw (&in)[kV], float (&out)[kV]) {
    float m[kV];
    E::template widen<kV>(in, m);
SS2D_UNROLL
    for (int k = 0; k < kV; ++k) out[k] = m[at(k)];
  }

  // The in-lane row scan from carry-in h0: x[k] becomes hh[k].
  static SS2D_HD SS2D_INLINE void lane_scan(Lane& l, float h0) {
    float h = h0;
SS2D_UNROLL
    for (int k = 0; k < kV; ++k) {
      h = fmaf(l.abar[k], h, l.x[k]);
      l.x[k] = h;
    }
  }

  // One warp item: maps item * M .. item * M + M - 1 (RowsParams). y in the inputs' type or fp32
  // is a loop of its own (the same loop where the inputs are fp32).
  template <class Ctx>
  static SS2D_HD void run(Ctx& ctx, const RowsParams& p, long long item) {
    static_assert(!kSave, "a saving forward runs through run_saving");
    run_saving(ctx, p, item, nullptr);
  }

  // run, and with kSave the band carries (and y unless p.y is null): fp32 carries[map][rows_carry_rows(H)][W] (map = b * dim +
  // d), row k holding the vertical state (h, or v columns first) of stream row (k + 1) * kBandRows - 1
  // in memory column order (stream rows count from the route's first row: bottom-up for from_bottom
  // routes).
  template <class Ctx>
  static SS2D_HD void run_saving(Ctx& ctx, const RowsParams& p, long long item, float* carries) {
    if (!IsFloat<Raw>::value && p.y_fp32) {
      stream<true>(ctx, p, item, carries);
    } else {
      stream<false>(ctx, p, item, carries);
    }
  }

  template <bool kF32, class Ctx>
  static SS2D_HD void stream(Ctx& ctx, const RowsParams& p, long long item, float* carries) {
    constexpr int K = Ctx::kLanes;
    using Out = typename Pick<kF32, float, Raw>::type;
    const int H = p.height;
    const int W = p.width;
    const long long L = static_cast<long long>(H) * W;
    const long long maps = static_cast<long long>(p.batch) * p.dim;
    const int S = p.seg_lanes;
    const int M = p.maps_per_warp;
    const int steps = kSteps >= 0 ? kSteps : rows_scan_steps(S);
    const int row_step = p.from_bottom ? -W : W;
    const int first_row = p.from_bottom ? (H - 1) * W : 0;
    const auto u = ctx.global(static_cast<const Raw*>(p.u), maps * L);
    const auto delta = ctx.global(static_cast<const Raw*>(p.delta), (p.batch - 1) * p.delta_planes * L + p.dim * L);
    const auto bcount = (p.batch - 1) * p.bc_planes * L + p.groups * L;
    const auto B = ctx.global(static_cast<const Raw*>(p.B), bcount);
    const auto C = ctx.global(static_cast<const Raw*>(p.C), bcount);
    // kSave with a null y stores the carries only (the four-route backward's route passes).
    const bool store_y = !kSave || p.y != nullptr;
    const auto y = ctx.global(static_cast<Out*>(p.y), store_y ? maps * L : 0);
    const auto A = ctx.global(p.A, p.dim);
    const auto bias = ctx.global(p.delta_bias, p.delta_bias != nullptr ? p.dim : 0);
    const auto skip = ctx.global(p.D, p.D != nullptr ? p.dim : 0);
    const int carry_rows = rows_carry_rows(H);
    const auto carry = ctx.global(carries, kSave ? maps * carry_rows * W : 0);
    // Each lane's views at its first column of the first row; the row being scanned is `row` (the
    // same for every lane: a 32-bit element offset, one multiply-add of the address per tensor and
    // row), the inputs are loaded P rows ahead of it.
    using InView = decltype(ctx.offset(u, 0LL));
    InView lane_u[K], lane_d[K], lane_b[K], lane_c[K];
    decltype(ctx.offset(y, 0LL)) lane_y[K];
    decltype(ctx.offset(carry, 0LL)) lane_carry[K];

    Lane lanes[K];
    float sa[K], sb[K], ta[K], tb[K];
    int last[K];

    ctx.each_lane([&](int lane) {
      Lane& l = lanes[ctx.slot(lane)];
      const int m = lane / S;
      const long long map = item * M + m;
      l.s = lane - m * S;
      // The segment's last lane (flat routes' carry comes from it).
      last[ctx.slot(lane)] = m * S + S - 1 < kWarpLanes ? m * S + S - 1 : kWarpLanes - 1;
      const bool active = m < M && map < maps;  // a real map and a lane of its segment
      // An idle lane loads (vector plans load unconditionally) the first cells of the warp's first map.
      const long long at_map = active ? map : item * M;
      const int b = static_cast<int>(at_map / p.dim);
      const int d = static_cast<int>(at_map - static_cast<long long>(b) * p.dim);
      const int g = d / (p.dim / p.groups);
      const int s_at = active ? l.s : 0;
      const int col = kFromRight ? W - s_at * kV - kLoad : s_at * kV;
      l.valid = 0;
SS2D_UNROLL
      for (int j = 0; j < kChunks; ++j) {
        l.valid |= (active && l.s * kV + j * kLoad < W) ? 1u << j : 0u;
      }
      const int q = ctx.slot(lane);
      const long long cell = first_row + col;
      lane_y[q] = ctx.pin(ctx.offset(y, at_map * L + cell));
      if constexpr (kSave) lane_carry[q] = ctx.offset(carry, at_map * carry_rows * W + col);
      lane_u[q] = ctx.offset(u, at_map * L + cell);
      lane_d[q] = ctx.offset(delta, (static_cast<long long>(b) * p.delta_planes + d) * L + cell);
      lane_b[q] = ctx.offset(B, (static_cast<long long>(b) * p.bc_planes + g) * L + cell);
      lane_c[q] = ctx.offset(C, (static_cast<long long>(b) * p.bc_planes + g) * L + cell);
      l.a2 = ctx.read(A, d) * kLog2e;
      l.bias = p.delta_bias != nullptr ? ctx.read(bias, d) : 0.f;
      l.skip = p.D != nullptr ? ctx.read(skip, d) : 0.f;
      l.carry = 0.f;
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) l.above[k] = 0.f;
SS2D_UNROLL
      for (int r = 0; r < kPrefetch; ++r) {
SS2D_UNROLL
        for (int k = 0; k < kV; ++k) l.u[r][k] = l.d[r][k] = l.b[r][k] = l.c[r][k] = Raw();
        if (r < H) {
          const int off = r * row_step;
          load_row(ctx, lane_u[q], off, l.valid, l.u[r]);
          load_row(ctx, lane_d[q], off, l.valid, l.d[r]);
          load_row(ctx, lane_b[q], off, l.valid, l.b[r]);
          load_row(ctx, lane_c[q], off, l.valid, l.c[r]);
        }
      }
    });

    int row = 0;  // element offset of the row being scanned from the first row
    for (int i0 = 0; i0 < H; i0 += kPrefetch) {
SS2D_UNROLL
      for (int r = 0; r < kPrefetch; ++r) {
        const int i = i0 + r;
        if (i >= H) break;
        // The row the slot is refilled with: row i + P, or past the map's end the row itself again
        // (in bounds, just read): the loads need no predicate, so their registers need no copy of
        // the old contents (8 fewer registers at 56² fp32); the slot is not read again.
        const int next = row + (i + kPrefetch < H ? kPrefetch * row_step : 0);

        // Phase 1: discretise the row in slot r, refill the slot's delta and B with row i + P
        // (their last use; u and C are refilled after phase 2), the columns-first vertical pass,
        // the lane's aggregate of the row scan.
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
          Lane& l = lanes[q];
          float dv[kV], bv[kV], uv[kV];
          widen(l.d[r], dv);
          widen(l.b[r], bv);
          widen(l.u[r], uv);
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
            const float z = dv[k] + l.bias;
            const float dt = p.softplus ? softplus(z) : z;
            l.abar[k] = exp2_flush(dt * l.a2);
            l.x[k] = dt * bv[k] * uv[k];
          }
          load_row(ctx, lane_d[q], next, l.valid, l.d[r]);
          load_row(ctx, lane_b[q], next, l.valid, l.b[r]);
          if constexpr (kOrder == Order::kColumnsFirst) {
SS2D_UNROLL
            for (int k = 0; k < kV; ++k) {
              l.x[k] = fmaf(l.abar[k], l.above[k], l.x[k]);
              l.above[k] = l.x[k];
            }
          }
          // Columns past W (a ragged last lane) never reach a stored cell; on flat routes the
          // lane's aggregate must stop at the row's last cell: they scan as the identity there.
          if constexpr (kOrder == Order::kFlat) {
SS2D_UNROLL
            for (int k = 0; k < kV; ++k) {
              const bool in = (l.valid >> (k / kLoad)) & 1u;
              l.abar[k] = in ? l.abar[k] : 1.f;
              l.x[k] = in ? l.x[k] : 0.f;
            }
          }
          // The segment's first lane starts from the carry in (flat routes; 0 otherwise).
          float a = l.abar[0];
          float h = kOrder == Order::kFlat && l.s == 0 ? fmaf(a, l.carry, l.x[0]) : l.x[0];
SS2D_UNROLL
          for (int k = 1; k < kV; ++k) {
            h = fmaf(l.abar[k], h, l.x[k]);
            a *= l.abar[k];
          }
          // The segment's first lane enters the scan with the product 0: nothing from the lanes
          // before it (another map, or itself below lane o) gets past it.
          sa[q] = l.s == 0 ? 0.f : a;
          sb[q] = h;
        });

        // Segmented inclusive scan of the lanes' (Abar product, hh) pairs as a plain warp scan:
        // lane s combines with lane s - o, sb += sa * tb. Where lane s - o lies before the segment
        // (or the warp), the lane's own product spans the segment's first lane and is 0, so it adds
        // 0 * tb: finite values come out bit-identical to a scan that skips those lanes (the
        // emulation holds it against the fp64 reference); a non-finite tb of another map gives NaN
        // (0 * inf), never a finite wrong value.
SS2D_UNROLL
        for (int step = 0; step < kScanSteps; ++step) {
          const int o = 1 << step;
          if (step >= steps) break;
          const bool last_step = step + 1 == steps;
          if (!last_step) ctx.shfl_up(ta, sa, o);
          ctx.shfl_up(tb, sb, o);
          ctx.each_lane([&](int lane) {
            const int q = ctx.slot(lane);
            sb[q] = fmaf(sa[q], tb[q], sb[q]);
            if (!last_step) sa[q] *= ta[q];
          });
        }
        // The carry into each lane: the inclusive value of the lane before it in the segment.
        ctx.shfl_up(tb, sb, 1);
        if constexpr (kOrder == Order::kFlat) ctx.shfl_idx(ta, sb, last);

        // Phase 2: the second in-lane pass, the vertical pass, y; refill u and C of slot r.
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
          Lane& l = lanes[q];
          const float cin = l.s == 0 ? (kOrder == Order::kFlat ? l.carry : 0.f) : tb[q];
          lane_scan(l, cin);
          if constexpr (kOrder == Order::kFlat) l.carry = ta[q];
          Out v[kV];
          float cv[kV], uv[kV];
          widen(l.c[r], cv);
          widen(l.u[r], uv);
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
            float h = l.x[k];
            if constexpr (kOrder == Order::kRowsFirst) {
              h = fmaf(l.abar[k], l.above[k], h);
              l.above[k] = h;
            }
            const float out = fmaf(cv[k], h, l.skip * uv[k]);
            if constexpr (kF32) {
              v[at(k)] = out;
            } else {
              v[at(k)] = E::from_float(out);
            }
          }
SS2D_UNROLL
          for (int j = 0; j < kChunks; ++j) {
            ctx.template store_if<kLoad>(store_y && ((l.valid >> j) & 1u), lane_y[q], row + chunk_step(j),
                                         &v[j * kLoad]);
          }
          if constexpr (kSave) {
            if (i % kBandRows == kBandRows - 1 && i + 1 < H) {
              float hv[kV];
SS2D_UNROLL
              for (int k = 0; k < kV; ++k) hv[at(k)] = l.above[k];
              const int band_off = (i / kBandRows) * W;
SS2D_UNROLL
              for (int j = 0; j < kChunks; ++j) {
                ctx.template store_if<kLoad>((l.valid >> j) & 1u, lane_carry[q], band_off + chunk_step(j), &hv[j * kLoad]);
              }
            }
          }
          load_row(ctx, lane_u[q], next, l.valid, l.u[r]);
          load_row(ctx, lane_c[q], next, l.valid, l.c[r]);
        });
        row = ctx.pin(row + row_step);
      }
    }
  }
};


// The four-route forward of VMamba's cross scan in one kernel (CrossRowsForward, docs/kernels.md,
// "four routes"): routes 0 (rows first) and 1 (columns first) of CROSS_ROUTES start top-left and
// share a top-down sweep; routes 2 and 3 (their reverses) start bottom-right and share a bottom-up
// sweep that the same warp runs next. Per row of a sweep a lane reads u once and both routes' delta
// (kPrefetch rows ahead), B (one row ahead) and C (before the row's shuffles); the rows-first route runs the row scan then
// h = Abar * h_above + hh; the columns-first route runs v = Abar * v_above + x then the row scan of
// v; both row scans share the shuffle phases. The
// top-down sweep writes y = (C0 h0 + (C1 h1 + (D0 + D1) u)); the bottom-up sweep reads those cells
// back (the same lane wrote them: in both sweeps lane s of a segment owns memory columns s * V ..
// s * V + V - 1, the bottom-up sweep's route position being S - 1 - s) and writes y + that sum of
// routes 2 and 3 -- in y's type, so a y in a 2-byte type is rounded once between the sweeps. The
// plan needs V | W (no ragged lane; load is V or 1 as for RS).
// Layout (RowsParams): u, y [batch][dim][L]; delta [batch][4 * dim][L] (delta_planes = 4 * dim),
// B, C [batch][4 * groups][L] (bc_planes = 4 * groups); route k's planes start at k * dim / k * groups;
// A, D, delta_bias fp32 [4 * dim] (route k at k * dim); from_bottom is not read.
// kFold: the step sizes are folded (the parameter is a RowsFoldParams, scan2d_rows_common.h): delta
// holds the low-rank step sizes [batch][4 * rank][L], delta_proj the fp32 weights [4 * dim][rank], and
// each lane forms its channel's step sizes of a row as dt_in = sum_r delta_proj[k * dim + d][r] *
// delta[b][k * rank + r] (fp32 FMAs in r order from 0, the low-rank values widened exactly) before
// + delta_bias and softplus as above: the full-rank delta is never stored. A row's projection is
// formed one row ahead, where the plain kernel loads the next row's delta, and kept in fp32.
// kPrefetch: u and both routes' delta (and, kYAhead, in the bottom-up sweep the top-down sweep's y
// it adds) are held P rows ahead in a ring (slot r holds stream rows r, r + P, ...: the row loop is unrolled
// P times so every slot index is a compile-time register name); B stays one row ahead (one plane shared by the channels of a group: cache hits, not the
// DRAM bytes the ring is for) and C is loaded before the row's shuffles. P = 1 is the one-row-ahead
// kernel. The folding instance keeps P = 1 (its ring would hold fp32 projections, 2 V registers a
// row more, and its rank loop already keeps loads in flight).
template <class E, int kV, int kLoad, int kSteps, bool kFold = false, int kPrefetch = 1>
struct CrossRowsForward {
  using Raw = typename E::Raw;
  // A lane's delta of the next row: the loaded elements, or (kFold) their fp32 projections.
  using DeltaReg = typename Pick<kFold, float, Raw>::type;
  // The launch's parameter block.
  using Params = typename Pick<kFold, RowsFoldParams, RowsParams>::type;
  static constexpr int kChunks = kV / kLoad;
  static_assert(kLoad == kV || kLoad == 1, "a lane's columns load as one vector or one by one");
  static_assert(kPrefetch >= 1, "at least the next row is loaded ahead");
  static_assert(!kFold || kPrefetch == 1, "the folding instance loads one row ahead");
  // Whether the bottom-up sweep holds the top-down sweep's y in the ring (P rows ahead) or reads it in
  // the row that adds it: the folding instance reads it there (a row of y held across its row would
  // spill the bf16 instance compiled for 6 blocks per SM).
  static constexpr bool kYAhead = !kFold;

  // Per lane: index 0 the sweep's rows-first route, 1 its columns-first route.
  struct Lane {
    int s;            // position in the segment, in the sweep's route order
    unsigned valid;   // bit j: chunk j belongs to a real map (active lane)
    float a2[2];
    float bias[2];
    float skip;       // D of both routes
    Raw u[kPrefetch][kV];           // ring slot r: stream row r mod P
    DeltaReg d[kPrefetch][2][kV];
    Raw b[2][kV];
    Raw c[2][kV];
    float above[2][kV];
    float abar[2][kV];
    float x[2][kV];
  };

  // Element k (route order) of a lane's load buffers, and chunk j's memory offset, per sweep.
  template <bool kRev>
  static SS2D_HD SS2D_INLINE constexpr int at(int k) {
    return kRev ? (k / kLoad) * kLoad + (kLoad - 1 - k % kLoad) : k;
  }
  template <bool kRev>
  static SS2D_HD SS2D_INLINE constexpr int chunk_step(int j) {
    return kRev ? -j * kLoad : j * kLoad;
  }

  // A lane's elements of one row as floats, in the sweep's route order.
  template <bool kRev>
  static SS2D_HD SS2D_INLINE void widen(const Raw (&in)[kV], float (&out)[kV]) {
    float m[kV];
    E::template widen<kV>(in, m);
SS2D_UNROLL
    for (int k = 0; k < kV; ++k) out[k] = m[at<kRev>(k)];
  }

  template <bool kRev, class Ctx, class View, class T>
  static SS2D_HD SS2D_INLINE void load_row(Ctx& ctx, const View& view, long long off, unsigned valid, T (&dst)[kV]) {
    const auto at = ctx.offset(view, off);
SS2D_UNROLL
    for (int j = 0; j < kChunks; ++j) {
      if (kLoad == kV || ((valid >> j) & 1u)) ctx.template load<kLoad>(at, chunk_step<kRev>(j), &dst[j * kLoad]);
    }
  }

  // The bottom-up sweep's read-back: the top-down sweep's y of one row, `off` elements from the lane's
  // view, in load-buffer order -- only an active lane's chunks (the cells it wrote; an idle lane's view
  // lies in a map another lane owns).
  template <bool kRev, class Ctx, class View, class T>
  static SS2D_HD SS2D_INLINE void load_own_row(Ctx& ctx, const View& view, long long off, unsigned valid,
                                               T (&dst)[kV]) {
    const auto at = ctx.offset(view, off);
SS2D_UNROLL
    for (int j = 0; j < kChunks; ++j) {
      if ((valid >> j) & 1u) ctx.template load<kLoad>(at, chunk_step<kRev>(j), &dst[j * kLoad]);
    }
  }

  // A lane's delta of one row as floats, in the sweep's route order.
  template <bool kRev>
  static SS2D_HD SS2D_INLINE void widen_delta(const DeltaReg (&in)[kV], float (&out)[kV]) {
    if constexpr (kFold) {
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) out[k] = in[at<kRev>(k)];
    } else {
      widen<kRev>(in, out);
    }
  }

  // kFold: the lane's step sizes of one row and route (in load-buffer order, like load_row's): the
  // route's low-rank plane 0 of the row is `off` elements from the lane's view `low`, consecutive
  // planes `plane` elements apart (32-bit offsets: no 64-bit pointer stepped per plane); the
  // channel's rank weights are w[w_at ..] (an index, not a view: one register). Two planes per trip
  // (one loop, not unrolled: the rank is a run-time value), the odd one after.
  template <bool kRev, class Ctx, class View, class WView>
  static SS2D_HD SS2D_INLINE void project_row(Ctx& ctx, const View& low, int off, const WView& w, int w_at, int rank,
                                              int plane, unsigned valid, float (&dst)[kV]) {
SS2D_UNROLL
    for (int k = 0; k < kV; ++k) dst[k] = 0.f;
    int r = 0;
SS2D_UNROLL_BY(1)
    for (; r + 1 < rank; r += 2) {
      Raw v0[kV], v1[kV];
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) v0[k] = v1[k] = Raw();
      load_plane<kRev>(ctx, low, off, valid, v0);
      load_plane<kRev>(ctx, low, off + plane, valid, v1);
      const float w0 = ctx.read(w, w_at + r);
      const float w1 = ctx.read(w, w_at + r + 1);
      float f0[kV], f1[kV];
      E::template widen<kV>(v0, f0);
      E::template widen<kV>(v1, f1);
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) dst[k] = fmaf(w1, f1[k], fmaf(w0, f0[k], dst[k]));
      off += 2 * plane;
    }
    if (r < rank) {
      Raw v0[kV];
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) v0[k] = Raw();
      load_plane<kRev>(ctx, low, off, valid, v0);
      const float w0 = ctx.read(w, w_at + r);
      float f0[kV];
      E::template widen<kV>(v0, f0);
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) dst[k] = fmaf(w0, f0[k], dst[k]);
    }
  }

  // load_row at a 32-bit element offset from the view (no view of its own).
  template <bool kRev, class Ctx, class View>
  static SS2D_HD SS2D_INLINE void load_plane(Ctx& ctx, const View& view, int off, unsigned valid, Raw (&dst)[kV]) {
SS2D_UNROLL
    for (int j = 0; j < kChunks; ++j) {
      if (kLoad == kV || ((valid >> j) & 1u)) {
        ctx.template load<kLoad>(view, off + chunk_step<kRev>(j), &dst[j * kLoad]);
      }
    }
  }

  // Route r of the sweep's delta of the row `off` elements from the lane's view: loaded, or (kFold)
  // projected from the low-rank planes.
  template <bool kRev, class Ctx, class View, class WView>
  static SS2D_HD SS2D_INLINE void fetch_delta(Ctx& ctx, const View& delta, const WView& w, int w_at, int rank,
                                              long long off, int plane, unsigned valid, DeltaReg (&dst)[kV]) {
    if constexpr (kFold) {
      project_row<kRev>(ctx, delta, static_cast<int>(off), w, w_at, rank, plane, valid, dst);
    } else {
      load_row<kRev>(ctx, delta, off, valid, dst);
    }
  }

  // Shuffle towards higher route positions: up the lanes top-down, down the lanes bottom-up.
  template <bool kRev, class Ctx, class Arr>
  static SS2D_HD SS2D_INLINE void shift(Ctx& ctx, Arr& out, const Arr& in, int o) {
    if constexpr (kRev) {
      ctx.shfl_down(out, in, o);
    } else {
      ctx.shfl_up(out, in, o);
    }
  }

  // One sweep over the warp item's maps: routes 2 * kRev and 2 * kRev + 1.
  template <bool kRev, bool kF32, class Ctx>
  static SS2D_HD void sweep(Ctx& ctx, const Params& params, long long item) {
    const RowsParams& p = rows_of(params);
    constexpr int K = Ctx::kLanes;
    using Out = typename Pick<kF32, float, Raw>::type;
    const int H = p.height;
    const int W = p.width;
    const long long L = static_cast<long long>(H) * W;
    const long long maps = static_cast<long long>(p.batch) * p.dim;
    const int S = p.seg_lanes;
    const int M = p.maps_per_warp;
    const int steps = kSteps >= 0 ? kSteps : rows_scan_steps(S);
    const int row_step = kRev ? -W : W;
    const int first_row = kRev ? (H - 1) * W : 0;
    const auto u = ctx.global(static_cast<const Raw*>(p.u), maps * L);
    // kFold: delta is low-rank (rank planes per route) and delta_proj the channels' rank weights.
    const int rank = fold_rank(params);
    const int route_planes = kFold ? rank : p.dim;
    const auto delta =
        ctx.global(static_cast<const Raw*>(p.delta), (p.batch - 1) * p.delta_planes * L + 4LL * route_planes * L);
    const auto proj = ctx.global(fold_weights(params), 4LL * p.dim * rank);
    const auto bcount = (p.batch - 1) * p.bc_planes * L + 4LL * p.groups * L;
    const auto B = ctx.global(static_cast<const Raw*>(p.B), bcount);
    const auto C = ctx.global(static_cast<const Raw*>(p.C), bcount);
    const auto y = ctx.global(static_cast<Out*>(p.y), maps * L);
    const auto A = ctx.global(p.A, 4 * p.dim);
    const auto bias = ctx.global(p.delta_bias, p.delta_bias != nullptr ? 4 * p.dim : 0);
    const auto skip = ctx.global(p.D, p.D != nullptr ? 4 * p.dim : 0);
    using InView = decltype(ctx.offset(u, 0LL));
    // Route 0 of the sweep's views; route 1's planes lie a constant distance further on (dim planes
    // of delta, groups planes of B / C): no pointer registers of their own.
    InView lane_u[K], lane_d[K], lane_b[K], lane_c[K];
    int lane_w[K];  // kFold: the index of the channel's route-0 weights in proj
    const long long d_next = static_cast<long long>(route_planes) * L;
    const int w_next = p.dim * rank;
    const int plane = static_cast<int>(L);
    const long long bc_next = static_cast<long long>(p.groups) * L;
    decltype(ctx.offset(y, 0LL)) lane_y[K];

    Lane lanes[K];
    // The bottom-up sweep's ring of the top-down sweep's y, held P rows ahead like u (slot n: stream
    // rows n, n + P, ...), so the read-back's latency is not paid in the row it is added in.
    Out top_down_y[K][kPrefetch][kV];
    float sa[2][K], sb[2][K], ta[2][K], tb[2][K];

    ctx.each_lane([&](int lane) {
      const int q = ctx.slot(lane);
      Lane& l = lanes[q];
      const int m = lane / S;
      const long long map = item * M + m;
      const int s_mem = lane - m * S;
      l.s = kRev ? S - 1 - s_mem : s_mem;
      const bool active = m < M && map < maps;
      const long long at_map = active ? map : item * M;
      const int bi = static_cast<int>(at_map / p.dim);
      const int d = static_cast<int>(at_map - static_cast<long long>(bi) * p.dim);
      const int g = d / (p.dim / p.groups);
      const int s_at = active ? s_mem : 0;
      // The lane's first memory column in route order (W % V == 0: the same columns both sweeps).
      const int col = kRev ? s_at * kV + kV - kLoad : s_at * kV;
      l.valid = active ? (1u << kChunks) - 1u : 0u;
      // An idle lane of a scalar plan loads nothing: zeros keep its values finite (the warp scan
      // multiplies them by 0 at the next segment's start; 0 * NaN would not vanish).
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) {
SS2D_UNROLL
        for (int n = 0; n < kPrefetch; ++n) {
          l.u[n][k] = Raw();
SS2D_UNROLL
          for (int r = 0; r < 2; ++r) l.d[n][r][k] = DeltaReg();
        }
SS2D_UNROLL
        for (int r = 0; r < 2; ++r) l.b[r][k] = l.c[r][k] = Raw();
      }
      const long long cell = first_row + col;
      lane_y[q] = ctx.offset(y, at_map * L + cell);
      lane_u[q] = ctx.offset(u, at_map * L + cell);
      l.skip = 0.f;
      const int route0 = kRev ? 2 : 0;
      lane_d[q] = ctx.offset(delta, (static_cast<long long>(bi) * p.delta_planes + route0 * route_planes +
                                     (kFold ? 0 : d)) * L + cell);
      lane_w[q] = (route0 * p.dim + d) * rank;  // (0 unless kFold)
      const long long bc = (static_cast<long long>(bi) * p.bc_planes + route0 * p.groups + g) * L + cell;
      lane_b[q] = ctx.offset(B, bc);
      lane_c[q] = ctx.offset(C, bc);
SS2D_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int ch = (route0 + r) * p.dim + d;
        l.a2[r] = ctx.read(A, ch) * kLog2e;
        l.bias[r] = p.delta_bias != nullptr ? ctx.read(bias, ch) : 0.f;
        l.skip += p.D != nullptr ? ctx.read(skip, ch) : 0.f;
SS2D_UNROLL
        for (int k = 0; k < kV; ++k) l.above[r][k] = 0.f;
        fetch_delta<kRev>(ctx, lane_d[q], proj, lane_w[q] + r * w_next, rank, r * d_next, plane, l.valid, l.d[0][r]);
        load_row<kRev>(ctx, lane_b[q], r * bc_next, l.valid, l.b[r]);
      }
      load_row<kRev>(ctx, lane_u[q], 0, l.valid, l.u[0]);
      // The ring's other slots: rows 1 .. P - 1 (those the map has).
SS2D_UNROLL
      for (int n = 1; n < kPrefetch; ++n) {
        if (n < H) {
SS2D_UNROLL
          for (int r = 0; r < 2; ++r) {
            fetch_delta<kRev>(ctx, lane_d[q], proj, lane_w[q] + r * w_next, rank, r * d_next + n * row_step, plane,
                              l.valid, l.d[n][r]);
          }
          load_row<kRev>(ctx, lane_u[q], n * row_step, l.valid, l.u[n]);
        }
      }
      if constexpr (kRev && kYAhead) {
SS2D_UNROLL
        for (int n = 0; n < kPrefetch; ++n) {
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) top_down_y[q][n][k] = Out();
          if (n < H) load_own_row<kRev>(ctx, lane_y[q], n * row_step, l.valid, top_down_y[q][n]);
        }
      }
    });

    for (int i0 = 0; i0 < H; i0 += kPrefetch) {
SS2D_UNROLL
      for (int n = 0; n < kPrefetch; ++n) {
        const int i = i0 + n;
        if (i >= H) break;
        const bool ahead = i + 1 < H;
        const bool refill = i + kPrefetch < H;  // slot n takes row i + P
        const int ring = refill ? kPrefetch * row_step : 0;  // (kPrefetch > 1) the row slot n is refilled with
        // Phase 1: discretise both routes, refill delta (row i + P) and B (row i + 1), the
        // columns-first route's vertical pass, each route's lane aggregate.
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
          Lane& l = lanes[q];
          float uv[kV], dv[2][kV], bv[2][kV];
          widen<kRev>(l.u[n], uv);
SS2D_UNROLL
          for (int r = 0; r < 2; ++r) {
            widen_delta<kRev>(l.d[n][r], dv[r]);
            widen<kRev>(l.b[r], bv[r]);
          }
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
SS2D_UNROLL
            for (int r = 0; r < 2; ++r) {
              const float z = dv[r][k] + l.bias[r];
              const float dt = p.softplus ? softplus(z) : z;
              l.abar[r][k] = exp2_flush(dt * l.a2[r]);
              l.x[r][k] = dt * bv[r][k] * uv[k];
            }
          }
          if constexpr (kPrefetch == 1) {
            if (ahead) {
SS2D_UNROLL
              for (int r = 0; r < 2; ++r) {
                fetch_delta<kRev>(ctx, lane_d[q], proj, lane_w[q] + r * w_next, rank, r * d_next + row_step, plane,
                                  l.valid, l.d[n][r]);
                load_row<kRev>(ctx, lane_b[q], r * bc_next + row_step, l.valid, l.b[r]);
              }
            }
          } else {
            // Past the map's end a ring slot is refilled with its own row (in bounds, just read, not
            // read again), as in RowsForward: those loads need no predicate. B keeps the predicated
            // next row (its constant offset: 2.7 fewer SASS per cell·channel on sm_90 bf16 at 56 than a
            // selected one).
SS2D_UNROLL
            for (int r = 0; r < 2; ++r) {
              fetch_delta<kRev>(ctx, lane_d[q], proj, lane_w[q] + r * w_next, rank, r * d_next + ring, plane, l.valid,
                                l.d[n][r]);
            }
            if (ahead) {
SS2D_UNROLL
              for (int r = 0; r < 2; ++r) load_row<kRev>(ctx, lane_b[q], r * bc_next + row_step, l.valid, l.b[r]);
            }
          }
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
            l.x[1][k] = fmaf(l.abar[1][k], l.above[1][k], l.x[1][k]);
            l.above[1][k] = l.x[1][k];
          }
SS2D_UNROLL
          for (int r = 0; r < 2; ++r) {
            float a = l.abar[r][0];
            float h = l.x[r][0];
SS2D_UNROLL
            for (int k = 1; k < kV; ++k) {
              h = fmaf(l.abar[r][k], h, l.x[r][k]);
              a *= l.abar[r][k];
            }
            // The plain warp scan's segment start (RowsForward): the product 0 at route position 0.
            sa[r][q] = l.s == 0 ? 0.f : a;
            sb[r][q] = h;
          }
          // C of this row, issued before the shuffle phases that hide it (a row ahead, as for RS, two
          // routes' C spill fp32 at V = 2).
SS2D_UNROLL
          for (int r = 0; r < 2; ++r) load_row<kRev>(ctx, lane_c[q], r * bc_next, l.valid, l.c[r]);
        });

        // Both routes' segmented scans of the lane aggregates, in route positions.
SS2D_UNROLL
        for (int step = 0; step < kScanSteps; ++step) {
          const int o = 1 << step;
          if (step >= steps) break;
          const bool last_step = step + 1 == steps;
SS2D_UNROLL
          for (int r = 0; r < 2; ++r) {
            if (!last_step) shift<kRev>(ctx, ta[r], sa[r], o);
            shift<kRev>(ctx, tb[r], sb[r], o);
          }
          ctx.each_lane([&](int lane) {
            const int q = ctx.slot(lane);
SS2D_UNROLL
            for (int r = 0; r < 2; ++r) {
              sb[r][q] = fmaf(sa[r][q], tb[r][q], sb[r][q]);
              if (!last_step) sa[r][q] *= ta[r][q];
            }
          });
        }
SS2D_UNROLL
        for (int r = 0; r < 2; ++r) shift<kRev>(ctx, tb[r], sb[r], 1);

        // Phase 2: second in-lane passes, the rows-first vertical pass, y of both routes summed on
        // chip (plus the top-down sweep's sum in the bottom-up sweep), one store; refill u.
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
          Lane& l = lanes[q];
          float h[2];
SS2D_UNROLL
          for (int r = 0; r < 2; ++r) h[r] = l.s == 0 ? 0.f : tb[r][q];
          // (kRev) The top-down sweep's y of this row: from the ring, or read here.
          Out read_back[kV];
          if constexpr (kRev && !kYAhead) load_own_row<kRev>(ctx, lane_y[q], 0, l.valid, read_back);
          const Out (&prev)[kV] = kYAhead ? top_down_y[q][n] : read_back;
          Out v[kV];
          float uv[kV], cv[2][kV];
          widen<kRev>(l.u[n], uv);
          widen<kRev>(l.c[0], cv[0]);
          widen<kRev>(l.c[1], cv[1]);
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
            h[0] = fmaf(l.abar[0][k], h[0], l.x[0][k]);
            h[1] = fmaf(l.abar[1][k], h[1], l.x[1][k]);
            const float h0 = fmaf(l.abar[0][k], l.above[0][k], h[0]);
            l.above[0][k] = h0;
            float out = fmaf(cv[0][k], h0, fmaf(cv[1][k], h[1], l.skip * uv[k]));
            if constexpr (kRev) {
              if constexpr (kF32) {
                out += prev[at<kRev>(k)];
              } else {
                out += E::to_float(prev[at<kRev>(k)]);
              }
            }
            if constexpr (kF32) {
              v[at<kRev>(k)] = out;
            } else {
              v[at<kRev>(k)] = E::from_float(out);
            }
          }
SS2D_UNROLL
          for (int j = 0; j < kChunks; ++j) {
            ctx.template store_if<kLoad>((l.valid >> j) & 1u, lane_y[q], chunk_step<kRev>(j), &v[j * kLoad]);
          }
          // u of row i + P after its last use (D * u is taken here, not kept).
          if constexpr (kPrefetch == 1) {
            if (refill) load_row<kRev>(ctx, lane_u[q], row_step, l.valid, l.u[n]);
          } else {
            load_row<kRev>(ctx, lane_u[q], ring, l.valid, l.u[n]);
          }
          // (kRev) The top-down y of row i + P, not yet rewritten by this sweep.
          if constexpr (kRev && kYAhead) {
            if (refill) load_own_row<kRev>(ctx, lane_y[q], kPrefetch * row_step, l.valid, top_down_y[q][n]);
          }
          lane_u[q] = ctx.offset(lane_u[q], row_step);
          lane_y[q] = ctx.offset(lane_y[q], row_step);
          lane_d[q] = ctx.offset(lane_d[q], row_step);
          lane_b[q] = ctx.offset(lane_b[q], row_step);
          lane_c[q] = ctx.offset(lane_c[q], row_step);
        });
      }
    }
  }

  // One warp item: the top-down sweep, then the bottom-up one over the same maps.
  template <class Ctx>
  static SS2D_HD void run(Ctx& ctx, const Params& p, long long item) {
    if (rows_of(p).y_fp32) {
      sweep<false, true>(ctx, p, item);
      sweep<true, true>(ctx, p, item);
    } else {
      sweep<false, false>(ctx, p, item);
      sweep<true, false>(ctx, p, item);
    }
  }
};

}  // namespace rows
}  // namespace vmamba2d
