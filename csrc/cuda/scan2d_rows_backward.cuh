// The RS backward of the single-route 2D selective scan at N = 1, every 2D route (codes 0-7: either
// pass order, from any corner): docs/kernels.md, "RS backward". Written once for the device context
// (scan2d_rows_backward_device.cuh) and the host emulation (emulation/scan2d_rows_backward_emulate.cpp),
// under the rules of scan2d_rows.cuh (per-lane state indexed by ctx.slot(lane), shuffles between
// each_lane phases, global memory only inside them), plus: a lane's band buffer (ctx.band_get /
// band_put) is its own -- no lane reads another lane's slots, so it needs no barrier.
//
// The forward, per map (dt = softplus(delta + bias) or delta + bias; a = exp(dt A); x = dt B u):
//   hh[i, j] = a[i, j] hh[i, j-1] + x[i, j]      h[i, j] = a[i, j] h[i-1, j] + hh[i, j]
//   y[i, j]  = C[i, j] h[i, j] + D u[i, j]
// Its adjoint, rows bottom-up: the vertical adjoint G (of h) and the horizontal one R (of hh),
//   G[i, j] = dy C + a[i+1, j] G[i+1, j]         R[i, j] = G[i, j] + a[i, j+1] R[i, j+1]
//   da = G h[i-1, j] + R hh[i, j-1]              dx = R
//   du = dy D + dx dt B     dB = dx dt u (summed over the group's channels)     dC = dy h
//   d dt = dx B u + da a A                       ddelta = d dt sigmoid(delta + bias) (softplus)
//   dA = sum da a dt        dD = sum dy u        ddelta_bias = sum ddelta    (over the map's cells)
// A columns-first route runs the passes the other way round,
//   v[i, j] = a[i, j] v[i-1, j] + x[i, j]        h[i, j] = a[i, j] h[i, j-1] + v[i, j]
// and so does its adjoint: R (of h) along the row first, then G (of v) up the columns,
//   R[i, j] = dy C + a[i, j+1] R[i, j+1]         G[i, j] = R[i, j] + a[i+1, j] G[i+1, j]
//   da = G v[i-1, j] + R h[i, j-1]               dx = G
// with the rest as above. Both orders keep, per row, the vertical state (h, or v) of the row above
// and the horizontal one (hh, or h) of the column before, so one band buffer and one da serve both.
// Indices i, j count in route order: a from_bottom route streams the rows bottom-up (its adjoint
// walks them top-down), a from_right route reverses each row, as in RowsForward.
// The map is cut into bands of kBandRows rows; the forward saved the vertical state of the row above
// every band but the first (RowsForward::run_saving). Bands run bottom-up: the warp recomputes the band's rows
// top-down from that carry (the forward's row scan), keeping each row's h and hh[i, j-1] in the
// lane's band buffer, then walks the band's rows bottom-up with G and the a of the row below in
// registers, R as a reversed segmented warp scan (the suffix scan of the lanes' (product, value)
// pairs by shuffles down, the decay shifted one column: a[j+1]).
//
// Work: a warp takes M = maps_per_warp consecutive channels of one (batch, group): item k is (b, g,
// chunk c) with k = (b * groups + g) * chunks + c, channels g * cpg + c * M + m (cpg = dim / groups;
// a segment whose channel is past the group's end idles). No atomics and a fixed order everywhere:
// dB / dC of a row are summed over the warp's segments by shuffles, segment 0 first, and stored as
// the warp's partial row dBC_part[0][b][g][c][L] / dBC_part[1][b][g][c][L] (the launcher sums the
// chunks in order); dA / dD /
// ddelta_bias are summed over a segment's lanes by a fixed shuffle tree into one value per map
// (dA_part[b][d] ..., summed over the batch by the launcher).
#pragma once

#include "scan2d_rows.cuh"

namespace vmamba2d {
namespace rows {

// One launch. u, dy, du: [batch][dim][L] (dy in the inputs' type, or fp32 with dy_fp32; du in the
// inputs' type, or fp32 with du_fp32), cells in map order whatever the route; delta and ddelta:
// [batch][delta_planes][L], the first dim planes of each batch entry; B, C: [batch][bc_planes][L],
// the first groups planes (a multi-route op's route k passes its planes' first element and the
// whole layout's planes per batch entry: no copy); A, D, delta_bias: fp32 [dim] (D, delta_bias may be null; their
// partials are then not written); carries: fp32 [batch * dim][rows_carry_rows(H)][W] from the
// saving forward; dBC_part: fp32 [2][batch][groups][chunks][L] (dB's partials, then dC's, one
// buffer: a lane keeps one view for both); dA_part, dD_part, ddb_part:
// fp32 [batch][dim]. chunks = ceil((dim / groups) / maps_per_warp); items (warps) =
// batch * groups * chunks. du_sum: null, or fp32 [batch][dim][L], the other routes' du so far (a
// multi-route op's running sum): du = du_sum + this route's du, rounded once where du is not fp32.
// du may be du_sum itself (each element is read and then written by the same lane).
struct RowsBackwardParams {
  const void* u;
  const void* delta;
  const void* B;
  const void* C;
  const float* A;
  const float* D;
  const float* delta_bias;
  const void* dy;
  const float* carries;
  void* du;
  void* ddelta;
  float* dBC_part;
  float* dA_part;
  float* dD_part;
  float* ddb_part;
  const float* du_sum;
  long long delta_planes;  // >= dim
  long long bc_planes;     // >= groups
  int batch;
  int dim;
  int groups;
  int height;
  int width;
  int seg_lanes;      // S = ceil(width / V)
  int maps_per_warp;  // M = 32 / S
  int chunks;         // ceil((dim / groups) / M)
  int softplus;
  int dy_fp32;
  int from_bottom;  // 1: the route streams its rows from the last up (route bit 2)
  int du_fp32;      // 1: du is fp32 (2-byte inputs; fp32 inputs have an fp32 du either way)
};

SS2D_HD inline long long rows_backward_items(const RowsBackwardParams& p) {
  return static_cast<long long>(p.batch) * p.groups * p.chunks;
}

// Band-buffer slots per lane for kV columns: the vertical state (h, or v columns first) of the row
// above the band and of its kBandRows rows, then the horizontal one of the column before (hh[i, j-1],
// or h[i, j-1]) of its rows.
template <int kV>
SS2D_HD SS2D_INLINE constexpr int band_slots() {
  return (2 * kBandRows + 1) * kV;
}

// d softplus(z) / dz = sigmoid(z) = exp(z - softplus(z)) from z and dt = softplus(z): one exp.
SS2D_HD SS2D_INLINE float sigmoid_from_dt(float z, float dt) { return exp2_flush((z - dt) * kLog2e); }

// E: element traits (as RowsForward); kV columns per lane, kLoad elements per access (kV or 1),
// kSteps: the segmented scans' steps, rows_scan_steps(seg_lanes), kMaps: maps_per_warp (the dB / dC
// sums over the maps unroll), each -1 to take it at run time (the host emulation); kOrder and
// kFromRight: the route's passes (rows or columns first; flat routes have no RS backward);
// kFromBottom: 1 / 0 the route streams its rows bottom-up / top-down, -1 as p.from_bottom says (a
// run-time row direction costs the fp32 instances at V = 4 some 24 bytes of spills on sm_90);
// kDuF32: 1 / 0 du is fp32 / in the inputs' type, -1 as p.du_fp32 says (only the store differs).
template <class E, int kV, int kLoad, int kSteps, int kMaps, Order kOrder = Order::kRowsFirst, bool kFromRight = false,
          int kFromBottom = 0, int kDuF32 = 0>
struct RowsBackward {
  using Raw = typename E::Raw;
  static constexpr int kChunks = kV / kLoad;
  static constexpr bool kCols = kOrder == Order::kColumnsFirst;
  static constexpr int kHAbove = 0;                   // slots kHAbove + r * kV: vertical state of band row r - 1
  static constexpr int kHhPrev = (kBandRows + 1) * kV;  // slots kHhPrev + r * kV: horizontal state, column before
  static_assert(kLoad == kV || kLoad == 1, "a lane's columns load as one vector or one by one");
  static_assert(kOrder != Order::kFlat, "flat routes have no RS backward");

  struct Lane {
    int s;           // position in the segment
    int d;           // channel (of the warp's first map on an idle lane)
    unsigned valid;  // bit k: column k is inside the row and the lane's channel is real (0: idle lane)
    float a2;        // A[d] * log2(e)
    float A;
    float bias;
    float skip;      // D[d]
    float g_below[kV];  // G of the row below (0 below the map)
    float a_below[kV];  // a of the row below (0 below the map)
    float acc_da, acc_dd, acc_db;
  };

  // Element k of a lane's columns in route order lives at this index of its load buffers, and chunk
  // j at this memory offset from the lane's first one (RowsForward's: a from_right route walks each
  // chunk's memory elements backwards).
  static SS2D_HD SS2D_INLINE constexpr int at(int k) {
    return kFromRight ? (k / kLoad) * kLoad + (kLoad - 1 - k % kLoad) : k;
  }
  static SS2D_HD SS2D_INLINE constexpr int chunk_step(int j) { return kFromRight ? -j * kLoad : j * kLoad; }

  // A lane's memory-order load buffer as floats in route order, and route-order values into a
  // store buffer.
  template <class T>
  static SS2D_HD SS2D_INLINE void widen(const T (&in)[kV], float (&out)[kV]) {
    float m[kV];
    if constexpr (IsFloat<T>::value) {
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) m[k] = in[k];
    } else {
      E::template widen<kV>(in, m);
    }
SS2D_UNROLL
    for (int k = 0; k < kV; ++k) out[k] = m[at(k)];
  }

  template <class Ctx, class View, class T>
  static SS2D_HD SS2D_INLINE void load_row(Ctx& ctx, const View& view, int off, unsigned chunks_in, T (&dst)[kV]) {
SS2D_UNROLL
    for (int j = 0; j < kChunks; ++j) {
      if (kLoad == kV || ((chunks_in >> j) & 1u)) ctx.template load<kLoad>(view, off + chunk_step(j), &dst[j * kLoad]);
    }
  }

  // Stores route-order values `src` (element k at memory index at(k)).
  template <class Ctx, class View, class T>
  static SS2D_HD SS2D_INLINE void store_row(Ctx& ctx, const View& view, int off, unsigned chunks_in,
                                            const T (&src)[kV]) {
    T m[kV];
SS2D_UNROLL
    for (int k = 0; k < kV; ++k) m[at(k)] = src[k];
SS2D_UNROLL
    for (int j = 0; j < kChunks; ++j) {
      ctx.template store_if<kLoad>((chunks_in >> j) & 1u, view, off + chunk_step(j), &m[j * kLoad]);
    }
  }

  // Bit j of the chunks inside the row from the columns' bits (a chunk is all in or all out).
  static SS2D_HD SS2D_INLINE unsigned chunk_bits(unsigned valid) {
    unsigned bits = 0;
SS2D_UNROLL
    for (int j = 0; j < kChunks; ++j) bits |= ((valid >> (j * kLoad)) & 1u) << j;
    return bits;
  }

  // dt and a of one row from delta (z = delta + bias), as the forward computes them.
  static SS2D_HD SS2D_INLINE void discretize(const Lane& l, bool softplus_on, const float (&z)[kV], float (&dt)[kV],
                                             float (&a)[kV]) {
SS2D_UNROLL
    for (int k = 0; k < kV; ++k) {
      dt[k] = softplus_on ? softplus(z[k]) : z[k];
      a[k] = exp2_flush(dt[k] * l.a2);
    }
  }

  template <class Ctx>
  static SS2D_HD void run(Ctx& ctx, const RowsBackwardParams& p, long long item) {
    if (!IsFloat<Raw>::value && p.dy_fp32) {
      walk<true>(ctx, p, item);
    } else {
      walk<false>(ctx, p, item);
    }
  }

  template <bool kDyF32, class Ctx>
  static SS2D_HD void walk(Ctx& ctx, const RowsBackwardParams& p, long long item) {
    constexpr int K = Ctx::kLanes;
    using Dy = typename Pick<kDyF32, float, Raw>::type;
    const int H = p.height;
    const int W = p.width;
    const long long L = static_cast<long long>(H) * W;
    const long long maps = static_cast<long long>(p.batch) * p.dim;
    const int S = p.seg_lanes;
    const int M = kMaps >= 0 ? kMaps : p.maps_per_warp;
    const int cpg = p.dim / p.groups;
    const int steps = kSteps >= 0 ? kSteps : rows_scan_steps(S);
    const int carry_rows = rows_carry_rows(H);
    const long long planes = static_cast<long long>(p.batch) * p.groups;
    const auto u = ctx.global(static_cast<const Raw*>(p.u), maps * L);
    const long long delta_count = (p.batch - 1) * p.delta_planes * L + p.dim * L;
    const auto delta = ctx.global(static_cast<const Raw*>(p.delta), delta_count);
    const auto dy = ctx.global(static_cast<const Dy*>(p.dy), maps * L);
    const long long bc_count = (p.batch - 1) * p.bc_planes * L + p.groups * L;
    const auto B = ctx.global(static_cast<const Raw*>(p.B), bc_count);
    const auto C = ctx.global(static_cast<const Raw*>(p.C), bc_count);
    const auto carries = ctx.global(p.carries, maps * carry_rows * W);
    // du's one view in its type (a 2-byte instance's other view is empty: the store takes the one
    // du_fp32 names), and the running sum it adds.
    const bool du_f32 = !IsFloat<Raw>::value && (kDuF32 >= 0 ? kDuF32 == 1 : p.du_fp32 != 0);
    const auto du = ctx.global(static_cast<Raw*>(p.du), du_f32 ? 0 : maps * L);
    const auto du_wide = ctx.global(static_cast<float*>(p.du), du_f32 ? maps * L : 0);
    const auto du_sum = ctx.global(p.du_sum, p.du_sum != nullptr ? maps * L : 0);
    const auto ddelta = ctx.global(static_cast<Raw*>(p.ddelta), delta_count);
    const long long part_plane = planes * p.chunks * L;  // dC's partials after dB's
    const auto dBC = ctx.global(p.dBC_part, 2 * part_plane);
    const auto dA = ctx.global(p.dA_part, maps);
    const auto dD = ctx.global(p.dD_part, p.D != nullptr ? maps : 0);
    const auto ddb = ctx.global(p.ddb_part, p.delta_bias != nullptr ? maps : 0);
    const auto A = ctx.global(p.A, p.dim);
    const auto bias = ctx.global(p.delta_bias, p.delta_bias != nullptr ? p.dim : 0);
    const auto skip = ctx.global(p.D, p.D != nullptr ? p.dim : 0);

    // Items fit 32 bits (the launcher checks): (b * groups + g) * chunks + chunk.
    const int plane = static_cast<int>(item) / p.chunks;  // b * groups + g
    const int chunk = static_cast<int>(item) - plane * p.chunks;
    const int b = plane / p.groups;
    const int g = plane - b * p.groups;

    // Views at each lane's first column of row 0: the map's (u, dy, du; delta, ddelta), the group's
    // (B, C) and the warp's partial row of dB (dC's lies part_plane further); the carries' view is
    // made per band (a view kept for the whole walk spills a 2-byte instance on sm_90).
    // Kept as element offsets (the map's, its delta plane's, the group plane's, the partial row's),
    // the views made at each access from the launch's pointers: eight 64-bit views held across the
    // walk spill on sm_90.
    long long lane_m[K], lane_d[K], lane_p[K], lane_w[K];

    Lane lanes[K];
    float sa[K], sb[K], ta[K], tb[K];

    ctx.each_lane([&](int lane) {
      const int q = ctx.slot(lane);
      Lane& l = lanes[q];
      const int m = lane / S;
      l.s = lane - m * S;
      const int ch = chunk * M + m;
      const bool active = m < M && ch < cpg;
      // An idle lane's views are those of the warp's first map at route column 0 (it loads, stores
      // nothing).
      const int d = g * cpg + (active ? ch : chunk * M);
      const long long map = static_cast<long long>(b) * p.dim + d;
      const int col = lane_column(active ? l.s : 0, W);
      l.valid = 0;
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) l.valid |= (active && l.s * kV + k < W) ? 1u << k : 0u;
      l.d = d;
      lane_m[q] = map * L + col;
      lane_d[q] = (static_cast<long long>(b) * p.delta_planes + d) * L + col;
      lane_p[q] = (static_cast<long long>(b) * p.bc_planes + g) * L + col;
      lane_w[q] = (static_cast<long long>(plane) * p.chunks + chunk) * L + col;
      l.A = ctx.read(A, d);
      l.a2 = l.A * kLog2e;
      l.bias = p.delta_bias != nullptr ? ctx.read(bias, d) : 0.f;
      l.skip = p.D != nullptr ? ctx.read(skip, d) : 0.f;
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) l.g_below[k] = l.a_below[k] = 0.f;
      l.acc_da = l.acc_dd = l.acc_db = 0.f;
    });

    const int bands = carry_rows + 1;
    for (int band = bands - 1; band >= 0; --band) {
      const int r0 = band * kBandRows;
      const int rows = H - r0 < kBandRows ? H - r0 : kBandRows;

      // Recompute: h of the row above the band (the saved carry; 0 above the map) into slot row 0.
      ctx.each_lane([&](int lane) {
        const int q = ctx.slot(lane);
        const Lane& l = lanes[q];
        float h[kV];
SS2D_UNROLL
        for (int k = 0; k < kV; ++k) h[k] = 0.f;
        if (band > 0) {
          const long long map = static_cast<long long>(b) * p.dim + l.d;
          const int col = lane_column(l.valid != 0 ? l.s : 0, W);
          float hm[kV] = {};
          load_row(ctx, ctx.offset(carries, (map * carry_rows + band - 1) * W + col), 0, chunk_bits(l.valid), hm);
          widen(hm, h);
        }
SS2D_UNROLL
        for (int k = 0; k < kV; ++k) ctx.band_put(kHAbove + k, lane, ((l.valid >> k) & 1u) ? h[k] : 0.f);
      });
      for (int r = 0; r < rows; ++r) {
        const int off = row_offset(p, r0 + r);
        // The forward's row: a, x (columns first: v = a v_above + x, the row scan's input); the lane's
        // aggregate of the row scan.
        float a_row[K][kV], x_row[K][kV];
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
          const Lane& l = lanes[q];
          const unsigned in = chunk_bits(l.valid);
          Raw dr[kV] = {}, br[kV] = {}, ur[kV] = {};
          load_row(ctx, ctx.offset(delta, ctx.fresh(lane_d[q])), off, in, dr);
          load_row(ctx, ctx.offset(B, ctx.fresh(lane_p[q])), off, in, br);
          load_row(ctx, ctx.offset(u, ctx.fresh(lane_m[q])), off, in, ur);
          float z[kV], bv[kV], uv[kV], dt[kV];
          widen(dr, z);
          widen(br, bv);
          widen(ur, uv);
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) z[k] += l.bias;
          discretize(l, p.softplus, z, dt, a_row[q]);
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
            const bool on = (l.valid >> k) & 1u;
            a_row[q][k] = on ? a_row[q][k] : 0.f;
            x_row[q][k] = on ? dt[k] * bv[k] * uv[k] : 0.f;
            if constexpr (kCols) {
              x_row[q][k] = fmaf(a_row[q][k], ctx.band_get(kHAbove + r * kV + k, lane), x_row[q][k]);
              ctx.band_put(kHAbove + (r + 1) * kV + k, lane, x_row[q][k]);
            }
          }
          float a = a_row[q][0];
          float h = x_row[q][0];
SS2D_UNROLL
          for (int k = 1; k < kV; ++k) {
            h = fmaf(a_row[q][k], h, x_row[q][k]);
            a *= a_row[q][k];
          }
          sa[q] = l.s == 0 ? 0.f : a;
          sb[q] = h;
        });
        prefix_scan(ctx, sa, sb, ta, tb, steps);
        ctx.shfl_up(tb, sb, 1);
        // The horizontal state of the column before (hh[i, j-1], or h[i, j-1]) and, rows first, h of
        // the row into the band buffer.
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
          const Lane& l = lanes[q];
          float hh = l.s == 0 ? 0.f : tb[q];
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
            const bool on = (l.valid >> k) & 1u;
            ctx.band_put(kHhPrev + r * kV + k, lane, on ? hh : 0.f);
            hh = fmaf(a_row[q][k], hh, x_row[q][k]);
            if constexpr (!kCols) {
              const float h = fmaf(a_row[q][k], ctx.band_get(kHAbove + r * kV + k, lane), hh);
              ctx.band_put(kHAbove + (r + 1) * kV + k, lane, on ? h : 0.f);
            }
          }
        });
      }

      // The adjoint, the band's rows bottom-up (in route order). g_row: the row scan's input -- G
      // (rows first), or dy C (columns first).
      for (int r = rows - 1; r >= 0; --r) {
        const int off = row_offset(p, r0 + r);
        float a_row[K][kV], g_row[K][kV], dt_row[K][kV], z_row[K][kV], dy_row[K][kV];
        float next_a[K];
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
          Lane& l = lanes[q];
          const unsigned in = chunk_bits(l.valid);
          Raw dr[kV] = {}, cr[kV] = {};
          Dy yr[kV] = {};
          load_row(ctx, ctx.offset(delta, ctx.fresh(lane_d[q])), off, in, dr);
          load_row(ctx, ctx.offset(C, ctx.fresh(lane_p[q])), off, in, cr);
          load_row(ctx, ctx.offset(dy, ctx.fresh(lane_m[q])), off, in, yr);
          float cv[kV];
          widen(dr, z_row[q]);
          widen(cr, cv);
          widen(yr, dy_row[q]);
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) z_row[q][k] += l.bias;
          discretize(l, p.softplus, z_row[q], dt_row[q], a_row[q]);
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
            const bool on = (l.valid >> k) & 1u;
            a_row[q][k] = on ? a_row[q][k] : 0.f;
            const float dyc = dy_row[q][k] * cv[k];
            g_row[q][k] = on ? (kCols ? dyc : fmaf(l.a_below[k], l.g_below[k], dyc)) : 0.f;
          }
          next_a[q] = a_row[q][0];
        });
        // a of the next lane's first column: the decay between the lane's last column and it.
        ctx.shfl_down(ta, next_a, 1);
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
          const Lane& l = lanes[q];
          next_a[q] = l.s == S - 1 ? 0.f : ta[q];
          // The lane's suffix aggregate: R[0] = value + product * R_in (R_in: the next lane's R[0]).
          float prod = next_a[q];
          float v = g_row[q][kV - 1];
SS2D_UNROLL
          for (int k = kV - 2; k >= 0; --k) {
            v = fmaf(a_row[q][k + 1], v, g_row[q][k]);
            prod *= a_row[q][k + 1];
          }
          sa[q] = prod;
          sb[q] = v;
        });
        suffix_scan(ctx, sa, sb, ta, tb, steps);
        ctx.shfl_down(tb, sb, 1);
        // The second pass: R per column, the cell gradients, dB / dC contributions of the lane.
        float dB_row[kV][K], dC_row[kV][K];  // k-major: column k's values of the warp's lanes
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
          Lane& l = lanes[q];
          const unsigned in = chunk_bits(l.valid);
          Raw br[kV] = {}, ur[kV] = {};
          load_row(ctx, ctx.offset(B, ctx.fresh(lane_p[q])), off, in, br);
          load_row(ctx, ctx.offset(u, ctx.fresh(lane_m[q])), off, in, ur);
          float bv[kV], uv[kV], du_in[kV];
          widen(br, bv);
          widen(ur, uv);
          // The running sum: only the lane's own cells (du may be du_sum, and an idle lane's vector
          // view lies on cells another lane rewrites in this phase).
          float sum_mem[kV] = {};
          if (p.du_sum != nullptr) {
            const auto at = ctx.offset(du_sum, ctx.fresh(lane_m[q]));
SS2D_UNROLL
            for (int j = 0; j < kChunks; ++j) {
              if ((in >> j) & 1u) ctx.template load<kLoad>(at, off + chunk_step(j), &sum_mem[j * kLoad]);
            }
          }
          widen(sum_mem, du_in);
          float du_out[kV];
          Raw dd_out[kV];
          float rr = l.s == S - 1 ? 0.f : tb[q];
          float decay = next_a[q];
SS2D_UNROLL
          for (int k = kV - 1; k >= 0; --k) {
            rr = fmaf(decay, rr, g_row[q][k]);
            decay = a_row[q][k];
            const bool on = (l.valid >> k) & 1u;
            const float dyv = dy_row[q][k];
            // G and dx: rows first G = g_row, dx = R; columns first G = R + a_below G_below, dx = G.
            const float g = kCols ? (on ? fmaf(l.a_below[k], l.g_below[k], rr) : 0.f) : g_row[q][k];
            const float dx = kCols ? g : rr;
            const float v_up = ctx.band_get(kHAbove + r * kV + k, lane);
            const float v = ctx.band_get(kHAbove + (r + 1) * kV + k, lane);
            const float h_prev = ctx.band_get(kHhPrev + r * kV + k, lane);
            const float h = kCols ? fmaf(a_row[q][k], h_prev, v) : v;
            const float da = fmaf(g, v_up, rr * h_prev);
            const float dt = dt_row[q][k];
            const float dxdt = dx * dt;
            const float da_a = da * a_row[q][k];
            const float ddt = fmaf(dx, bv[k] * uv[k], da_a * l.A);
            const float dz = p.softplus ? ddt * sigmoid_from_dt(z_row[q][k], dt) : ddt;
            du_out[k] = fmaf(dyv, l.skip, dxdt * bv[k]) + du_in[k];
            dd_out[k] = E::from_float(dz);
            dB_row[k][q] = on ? dxdt * uv[k] : 0.f;
            dC_row[k][q] = on ? dyv * h : 0.f;
            l.acc_da += on ? da_a * dt : 0.f;
            l.acc_dd += on ? dyv * uv[k] : 0.f;
            l.acc_db += on ? dz : 0.f;
            l.g_below[k] = g;
            l.a_below[k] = a_row[q][k];
          }
          if (du_f32) {
            store_row(ctx, ctx.offset(du_wide, ctx.fresh(lane_m[q])), off, in, du_out);
          } else {
            Raw du_raw[kV];
SS2D_UNROLL
            for (int k = 0; k < kV; ++k) du_raw[k] = E::from_float(du_out[k]);
            store_row(ctx, ctx.offset(du, ctx.fresh(lane_m[q])), off, in, du_raw);
          }
          store_row(ctx, ctx.offset(ddelta, ctx.fresh(lane_d[q])), off, in, dd_out);
        });
        // dB / dC of the row summed over the warp's segments, segment 0 first, 1, ... M - 1: one
        // shuffle a column and tensor per further segment.
        float sum_b[kV][K], sum_c[kV][K], t_b[kV][K], t_c[kV][K];
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
            sum_b[k][q] = dB_row[k][q];
            sum_c[k][q] = dC_row[k][q];
          }
        });
SS2D_UNROLL
        for (int m = 1; m < (kMaps >= 0 ? kMaps : kWarpLanes); ++m) {
          if (m >= M) break;
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
            ctx.shfl_down(t_b[k], dB_row[k], m * S);
            ctx.shfl_down(t_c[k], dC_row[k], m * S);
          }
          ctx.each_lane([&](int lane) {
            const int q = ctx.slot(lane);
SS2D_UNROLL
            for (int k = 0; k < kV; ++k) {
              sum_b[k][q] += t_b[k][q];
              sum_c[k][q] += t_c[k][q];
            }
          });
        }
        ctx.each_lane([&](int lane) {
          const int q = ctx.slot(lane);
          const Lane& l = lanes[q];
          // Segment 0's lanes hold the sums; the other segments' lanes store nothing.
          const unsigned in = lane < S ? chunk_bits(column_bits(l.s, W)) : 0u;
          float vb[kV], vc[kV];
SS2D_UNROLL
          for (int k = 0; k < kV; ++k) {
            vb[k] = sum_b[k][q];
            vc[k] = sum_c[k][q];
          }
          store_row(ctx, ctx.offset(dBC, ctx.fresh(lane_w[q])), off, in, vb);
          store_row(ctx, ctx.offset(dBC, ctx.fresh(lane_w[q]) + part_plane), off, in, vc);
        });
      }
    }

    // dA, dD, ddelta_bias of each map: its segment's lanes summed by a fixed shuffle tree. The map's
    // batch entry again from the item (kept through the walk, it spills on sm_90).
    const int b_end = static_cast<int>(ctx.fresh(item)) / p.chunks / p.groups;
    const auto store_map = [&](const auto& out) {
      ctx.each_lane([&](int lane) {
        const int q = ctx.slot(lane);
        if (lanes[q].s == 0 && lanes[q].valid != 0) {
          ctx.template store<1>(out, static_cast<long long>(b_end) * p.dim + lanes[q].d, &sb[q]);
        }
      });
    };
    segment_sum(ctx, lanes, &Lane::acc_da, sb, tb, S, steps);
    store_map(dA);
    if (p.D != nullptr) {
      segment_sum(ctx, lanes, &Lane::acc_dd, sb, tb, S, steps);
      store_map(dD);
    }
    if (p.delta_bias != nullptr) {
      segment_sum(ctx, lanes, &Lane::acc_db, sb, tb, S, steps);
      store_map(ddb);
    }
  }

  // Columns of a lane at segment position s inside a row of W (bit k: column s * kV + k < W).
  static SS2D_HD SS2D_INLINE unsigned column_bits(int s, int W) {
    unsigned bits = 0;
SS2D_UNROLL
    for (int k = 0; k < kV; ++k) bits |= (s * kV + k < W) ? 1u << k : 0u;
    return bits;
  }

  // The element offset in its map of the route's stream row t (bottom-up rows for from_bottom routes).
  static SS2D_HD SS2D_INLINE int row_offset(const RowsBackwardParams& p, int t) {
    const bool up = kFromBottom >= 0 ? kFromBottom == 1 : p.from_bottom != 0;
    return (up ? p.height - 1 - t : t) * p.width;
  }

  // The memory column of the first chunk of the lane at segment position s (route order).
  static SS2D_HD SS2D_INLINE int lane_column(int s, int W) { return kFromRight ? W - s * kV - kLoad : s * kV; }

  // The segmented inclusive scan of the lanes' (product, value) pairs up the lanes (the forward's
  // plain warp scan: a segment's first lane holds the product 0).
  template <class Ctx, class Arr>
  static SS2D_HD SS2D_INLINE void prefix_scan(Ctx& ctx, Arr& sa, Arr& sb, Arr& ta, Arr& tb, int steps) {
SS2D_UNROLL
    for (int step = 0; step < kScanSteps; ++step) {
      if (step >= steps) break;
      const bool last_step = step + 1 == steps;
      if (!last_step) ctx.shfl_up(ta, sa, 1 << step);
      ctx.shfl_up(tb, sb, 1 << step);
      ctx.each_lane([&](int lane) {
        const int q = ctx.slot(lane);
        sb[q] = fmaf(sa[q], tb[q], sb[q]);
        if (!last_step) sa[q] *= ta[q];
      });
    }
  }

  // The same down the lanes (suffixes): a segment's last lane holds the product 0, so nothing from
  // the lanes after it (another map, idle lanes, or the warp's top, where a shuffle down returns the
  // lane's own value) gets past it.
  template <class Ctx, class Arr>
  static SS2D_HD SS2D_INLINE void suffix_scan(Ctx& ctx, Arr& sa, Arr& sb, Arr& ta, Arr& tb, int steps) {
SS2D_UNROLL
    for (int step = 0; step < kScanSteps; ++step) {
      if (step >= steps) break;
      const bool last_step = step + 1 == steps;
      if (!last_step) ctx.shfl_down(ta, sa, 1 << step);
      ctx.shfl_down(tb, sb, 1 << step);
      ctx.each_lane([&](int lane) {
        const int q = ctx.slot(lane);
        sb[q] = fmaf(sa[q], tb[q], sb[q]);
        if (!last_step) sa[q] *= ta[q];
      });
    }
  }

  // sb[lane of position 0] = the sum of `field` over its segment's S lanes, by the tree s += s + o
  // (o = 2^(steps-1) .. 1, where s + o < S): the same order on every run.
  template <class Ctx, class Arr>
  static SS2D_HD SS2D_INLINE void segment_sum(Ctx& ctx, const Lane* lanes, float Lane::*field, Arr& sb, Arr& tb,
                                              int S, int steps) {
    ctx.each_lane([&](int lane) { sb[ctx.slot(lane)] = lanes[ctx.slot(lane)].*field; });
SS2D_UNROLL
    for (int step = kScanSteps - 1; step >= 0; --step) {
      if (step >= steps) continue;
      const int o = 1 << step;
      ctx.shfl_down(tb, sb, o);
      ctx.each_lane([&](int lane) {
        const int q = ctx.slot(lane);
        if (lanes[q].s + o < S && lanes[q].s < o) sb[q] += tb[q];
      });
    }
  }
};

// The band carries of VMamba's four cross routes (codes 0, 4, 3, 7) in one launch: the saving
// forward of the four-route op's RS backward. CrossRowsForward's two sweeps (routes 0 and 1 of
// CROSS_ROUTES top-down, 2 and 3 bottom-up: u read once a sweep, both routes' delta and B) without
// what only y needs -- no C, no y, no D u, and no row scan of the columns-first route (its vertical
// state v is its carry) --: per band boundary each route's vertical state (h rows first, v columns
// first) of its stream row 8 c + 7 goes to carries[route][map][c][memory column], the layout
// RowsForward::run_saving stores for one route. Layout (RowsParams) as CrossRowsForward's: u [batch]
// [dim][L]; delta [batch][4 * dim][L] (delta_planes), B, C [batch][4 * groups][L] (bc_planes; C is
// not read); A, D, delta_bias fp32 [4 * dim] (D is not read); y and from_bottom are not read. The
// plan needs V | W, as the four-route forward's. kSteps as RowsForward's (-1: at run time).
template <class E, int kV, int kLoad, int kSteps>
struct CrossRowsCarries {
  using Raw = typename E::Raw;
  using Forward = CrossRowsForward<E, kV, kLoad, kSteps>;
  static constexpr int kChunks = kV / kLoad;

  struct Lane {
    int s;           // position in the segment, in the sweep's route order
    unsigned valid;  // bit j: chunk j belongs to a real map (active lane)
    float a2[2];
    float bias[2];
    Raw u[kV];       // the row being scanned
    Raw d[2][kV];
    Raw b[2][kV];
    float above[2][kV];  // the vertical states: h of the rows-first route, v of the columns-first one
    float abar[kV];      // the rows-first route's, between the phases
    float x[kV];
  };

  template <class Ctx>
  static SS2D_HD void run(Ctx& ctx, const RowsParams& p, long long item, float* carries) {
    sweep<false>(ctx, p, item, carries);
    sweep<true>(ctx, p, item, carries);
  }

  // One sweep: routes 2 * kRev (rows first) and 2 * kRev + 1 (columns first) of CROSS_ROUTES.
  template <bool kRev, class Ctx>
  static SS2D_HD void sweep(Ctx& ctx, const RowsParams& p, long long item, float* carries) {
    constexpr int K = Ctx::kLanes;
    const int H = p.height;
    const int W = p.width;
    const long long L = static_cast<long long>(H) * W;
    const long long maps = static_cast<long long>(p.batch) * p.dim;
    const int S = p.seg_lanes;
    const int steps = kSteps >= 0 ? kSteps : rows_scan_steps(S);
    const int row_step = kRev ? -W : W;
    const int first_row = kRev ? (H - 1) * W : 0;
    const int carry_rows = rows_carry_rows(H);
    const long long route_carries = maps * carry_rows * W;
    const auto u = ctx.global(static_cast<const Raw*>(p.u), maps * L);
    const auto delta = ctx.global(static_cast<const Raw*>(p.delta), (p.batch - 1) * p.delta_planes * L + 4LL * p.dim * L);
    const auto B = ctx.global(static_cast<const Raw*>(p.B), (p.batch - 1) * p.bc_planes * L + 4LL * p.groups * L);
    const auto A = ctx.global(p.A, 4 * p.dim);
    const auto bias = ctx.global(p.delta_bias, p.delta_bias != nullptr ? 4 * p.dim : 0);
    const auto carry = ctx.global(carries, 4 * route_carries);
    using InView = decltype(ctx.offset(u, 0LL));
    // Route 0 of the sweep's views; route 1's planes lie a constant distance further on.
    InView lane_u[K], lane_d[K], lane_b[K];
    decltype(ctx.offset(carry, 0LL)) lane_carry[K];
    const long long d_next = static_cast<long long>(p.dim) * L;
    const long long bc_next = static_cast<long long>(p.groups) * L;

    Lane lanes[K];
    float sa[K], sb[K], ta[K], tb[K];

    ctx.each_lane([&](int lane) {
      const int q = ctx.slot(lane);
      Lane& l = lanes[q];
      // The lane's place as in CrossRowsForward::sweep: route position, map (an idle lane: the warp's
      // first map, loaded, never stored), first memory column in route order.
      const int M = p.maps_per_warp;
      const int m = lane / S;
      const long long map = item * M + m;
      const int s_mem = lane - m * S;
      l.s = kRev ? S - 1 - s_mem : s_mem;
      const bool active = m < M && map < maps;
      const long long at_map = active ? map : item * M;
      const int bi = static_cast<int>(at_map / p.dim);
      const int d = static_cast<int>(at_map - static_cast<long long>(bi) * p.dim);
      const int g = d / (p.dim / p.groups);
      const int col = kRev ? (active ? s_mem : 0) * kV + kV - kLoad : (active ? s_mem : 0) * kV;
      l.valid = active ? (1u << kChunks) - 1u : 0u;
      const int route0 = kRev ? 2 : 0;
      const long long cell = first_row + col;
      lane_u[q] = ctx.offset(u, at_map * L + cell);
      lane_d[q] = ctx.offset(delta, (static_cast<long long>(bi) * p.delta_planes + route0 * p.dim + d) * L + cell);
      lane_b[q] = ctx.offset(B, (static_cast<long long>(bi) * p.bc_planes + route0 * p.groups + g) * L + cell);
      lane_carry[q] = ctx.offset(carry, route0 * route_carries + at_map * carry_rows * W + col);
SS2D_UNROLL
      for (int k = 0; k < kV; ++k) l.u[k] = Raw();
SS2D_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int ch = (route0 + r) * p.dim + d;
        l.a2[r] = ctx.read(A, ch) * kLog2e;
        l.bias[r] = p.delta_bias != nullptr ? ctx.read(bias, ch) : 0.f;
SS2D_UNROLL
        for (int k = 0; k < kV; ++k) {
          l.above[r][k] = 0.f;
          l.d[r][k] = l.b[r][k] = Raw();
        }
        Forward::template load_row<kRev>(ctx, lane_d[q], r * d_next, l.valid, l.d[r]);
        Forward::template load_row<kRev>(ctx, lane_b[q], r * bc_next, l.valid, l.b[r]);
      }
      Forward::template load_row<kRev>(ctx, lane_u[q], 0, l.valid, l.u);
    });

    for (int i = 0; i < H; ++i) {
      const bool ahead = i + 1 < H;
      // Phase 1: discretise both routes, the columns-first route's vertical pass (its whole update:
      // v = a v_above + x), the rows-first route's lane aggregate; delta and B of the next row.
      ctx.each_lane([&](int lane) {
        const int q = ctx.slot(lane);
        Lane& l = lanes[q];
        float uv[kV], dv[2][kV], bv[2][kV];
        Forward::template widen<kRev>(l.u, uv);
SS2D_UNROLL
        for (int r = 0; r < 2; ++r) {
          Forward::template widen<kRev>(l.d[r], dv[r]);
          Forward::template widen<kRev>(l.b[r], bv[r]);
        }
SS2D_UNROLL
        for (int k = 0; k < kV; ++k) {
          float abar[2], x[2];
SS2D_UNROLL
          for (int r = 0; r < 2; ++r) {
            const float z = dv[r][k] + l.bias[r];
            const float dt = p.softplus ? softplus(z) : z;
            abar[r] = exp2_flush(dt * l.a2[r]);
            x[r] = dt * bv[r][k] * uv[k];
          }
          l.abar[k] = abar[0];
          l.x[k] = x[0];
          l.above[1][k] = fmaf(abar[1], l.above[1][k], x[1]);
        }
        if (ahead) {
SS2D_UNROLL
          for (int r = 0; r < 2; ++r) {
            Forward::template load_row<kRev>(ctx, lane_d[q], r * d_next + row_step, l.valid, l.d[r]);
            Forward::template load_row<kRev>(ctx, lane_b[q], r * bc_next + row_step, l.valid, l.b[r]);
          }
        }
        float a = l.abar[0];
        float h = l.x[0];
SS2D_UNROLL
        for (int k = 1; k < kV; ++k) {
          h = fmaf(l.abar[k], h, l.x[k]);
          a *= l.abar[k];
        }
        sa[q] = l.s == 0 ? 0.f : a;
        sb[q] = h;
      });

      // The rows-first route's segmented scan of the lane aggregates towards higher route positions:
      // up the lanes top-down, down the lanes bottom-up (RowsBackward's two warp scans).
      using Scans = RowsBackward<E, kV, kLoad, kSteps, 1>;
      if constexpr (kRev) {
        Scans::suffix_scan(ctx, sa, sb, ta, tb, steps);
      } else {
        Scans::prefix_scan(ctx, sa, sb, ta, tb, steps);
      }
      Forward::template shift<kRev>(ctx, tb, sb, 1);

      // Phase 2: the rows-first route's row and vertical pass; at a band's last row both routes'
      // vertical states to the carries; u of the next row.
      ctx.each_lane([&](int lane) {
        const int q = ctx.slot(lane);
        Lane& l = lanes[q];
        float h = l.s == 0 ? 0.f : tb[q];
SS2D_UNROLL
        for (int k = 0; k < kV; ++k) {
          h = fmaf(l.abar[k], h, l.x[k]);
          l.above[0][k] = fmaf(l.abar[k], l.above[0][k], h);
        }
        if (i % kBandRows == kBandRows - 1 && ahead) {
          const int band_off = (i / kBandRows) * W;
SS2D_UNROLL
          for (int r = 0; r < 2; ++r) {
            float hv[kV];
SS2D_UNROLL
            for (int k = 0; k < kV; ++k) hv[Forward::template at<kRev>(k)] = l.above[r][k];
SS2D_UNROLL
            for (int j = 0; j < kChunks; ++j) {
              ctx.template store_if<kLoad>((l.valid >> j) & 1u, lane_carry[q],
                                           r * route_carries + band_off + Forward::template chunk_step<kRev>(j),
                                           &hv[j * kLoad]);
            }
          }
        }
        if (ahead) Forward::template load_row<kRev>(ctx, lane_u[q], row_step, l.valid, l.u);
        lane_u[q] = ctx.offset(lane_u[q], row_step);
        lane_d[q] = ctx.offset(lane_d[q], row_step);
        lane_b[q] = ctx.offset(lane_b[q], row_step);
      });
    }
  }
};

}  // namespace rows
}  // namespace vmamba2d
