// The v4 row-streaming forward (RS, scan2d_rows.cuh): its launch parameters and plan, shared by the
// kernel, its host emulation and the launchers. Plain C++ without includes (nvcc, NVRTC and the
// host compiler all take it): the parameter block holds plain pointers, 64-bit and 32-bit ints
// only, so a launcher can fill it from ctypes.
#pragma once

#include "scan2d_macros.h"

namespace vmamba2d {
namespace rows {

constexpr int kWarpLanes = 32;
// Steps of the segmented warp scan: segments of up to 32 lanes.
constexpr int kScanSteps = 5;

// Route code bits (vmamba2d/ops/routes.py, Route.code).
constexpr int kRouteFromRight = 1;
constexpr int kRouteFromBottom = 2;
constexpr int kRouteColumnsFirst = 4;
constexpr int kRouteFlat = 8;

// The order of the passes along a streamed row, compiled into the kernel (with from_right; from_bottom
// only reverses the row order and is a run-time parameter; the plan: vmamba2d/ops/compiled/rows_plan.py):
//   kRowsFirst     2D, rows first (the paper's order): the row scan, then h = Abar * h_above + hh;
//   kColumnsFirst  2D, columns first: v = Abar * v_above + x down the columns, then the row scan of v;
//   kFlat          flat row-major route: one 1D scan whose state runs on from a row's last cell
//                  into the next row's first (the row scan with that carry in).
// Flat column-major routes (codes 12 .. 15) are no row stream: rows_route_supported is false.
enum class Order : int { kRowsFirst = 0, kColumnsFirst = 1, kFlat = 2 };

SS2D_HD inline bool rows_route_supported(int code) {
  return code >= 0 && code < 16 && !((code & kRouteFlat) && (code & kRouteColumnsFirst));
}

SS2D_HD inline Order rows_order(int code) {
  if (code & kRouteFlat) return Order::kFlat;
  return (code & kRouteColumnsFirst) ? Order::kColumnsFirst : Order::kRowsFirst;
}

// One launch. Tensors are contiguous; u, y: [batch][dim][H * W], delta: [batch][delta_planes][H * W]
// (dim planes for the single-route op), B, C: [batch][bc_planes][H * W] with N = 1 (groups planes),
// all in map order (row-major cells), whatever the route. Channel d reads B / C plane
// d / (dim / groups). A, D, delta_bias: fp32 [dim] (A[d] is the channel's only state's A; D and
// delta_bias may be null).
// Work: maps (b, d) in the order b * dim + d; warp item k takes maps k * maps_per_warp ..
// (k + 1) * maps_per_warp - 1, one per segment of seg_lanes lanes (rows_items items); global warp k
// of the grid runs item k. Every output cell is written by exactly one lane.
struct RowsParams {
  const void* u;
  const void* delta;
  const void* B;
  const void* C;
  const float* A;
  const float* D;
  const float* delta_bias;
  void* y;
  long long delta_planes;
  long long bc_planes;
  int batch;
  int dim;
  int groups;
  int height;
  int width;
  int seg_lanes;      // S = ceil(width / V): lanes per map
  int maps_per_warp;  // M = 32 / S
  int softplus;       // 1: dt = softplus(delta + delta_bias), 0: dt = delta + delta_bias
  int y_fp32;         // 1: y is fp32 (whatever the input type), 0: y has the inputs' type
  int from_bottom;    // 1: rows are streamed from the last up (route bit 2)
};

// The parameter of the four-route entry with folded step sizes (CrossRowsForward's kFold): RowsParams
// in the four-route layout but for delta, which holds the low-rank step sizes [batch][4 * rank][L]
// (delta_planes = 4 * rank, route k's planes from k * rank), and the fp32 projection delta_proj
// [4 * dim][rank] (rank >= 1): channel d of route k steps by sum_r delta_proj[k * dim + d][r] *
// delta[b][k * rank + r]. A struct of its own: two more fields in RowsParams change what ptxas makes
// of the single-route kernel.
struct RowsFoldParams {
  RowsParams rows;
  const float* delta_proj;
  int rank;
};

// The RowsParams of either parameter block, and the projection of a folding one (null / 0 for plain).
SS2D_HD inline const RowsParams& rows_of(const RowsParams& p) { return p; }
SS2D_HD inline const RowsParams& rows_of(const RowsFoldParams& p) { return p.rows; }
SS2D_HD inline const float* fold_weights(const RowsParams&) { return nullptr; }
SS2D_HD inline const float* fold_weights(const RowsFoldParams& p) { return p.delta_proj; }
SS2D_HD inline int fold_rank(const RowsParams&) { return 0; }
SS2D_HD inline int fold_rank(const RowsFoldParams& p) { return p.rank; }

SS2D_HD inline long long rows_items(const RowsParams& p) {
  const long long maps = static_cast<long long>(p.batch) * p.dim;
  return (maps + p.maps_per_warp - 1) / p.maps_per_warp;
}

// Scan steps a segment of seg_lanes lanes needs: ceil(log2(seg_lanes)).
SS2D_HD inline int rows_scan_steps(int seg_lanes) {
  int steps = 0;
  while ((1 << steps) < seg_lanes) ++steps;
  return steps;
}

// Rows of a band of the RS backward (scan2d_rows_backward.cuh): the forward that saves carries
// stores h of every band's last row but the map's last band's, the backward recomputes a band from
// the row above it.
constexpr int kBandRows = 8;

// Saved carry rows per map: the bands after the first one, ceil(H / kBandRows) - 1.
SS2D_HD inline int rows_carry_rows(int height) { return (height - 1) / kBandRows; }

}  // namespace rows
}  // namespace vmamba2d
