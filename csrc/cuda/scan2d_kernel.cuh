// The tiled 2D selective scan v3 for both execution contexts: the forward and backward blocks
// (scan2d_forward.cuh, scan2d_backward.cuh, on the shared pieces of scan2d_tile.cuh) and the
// carry scan of the tile-parallel passes.
#pragma once

#include "scan2d_backward.cuh"
#include "scan2d_forward.cuh"

namespace vmamba2d {
namespace scan2d {

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
