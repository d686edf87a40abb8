// Shared by the CUDA kernels, their host launchers and the host emulation: tile constants, the
// plan (Geometry), the kernel parameter block, shared-memory layouts and global buffer extents.
// Plain C++ (no ATen / c10 / torch), compiles with nvcc and with the host compiler.
#pragma once

#include <cstddef>
#include <cstdint>

#include "scan2d_macros.h"

namespace vmamba2d {
namespace scan2d {

// A tile is kTile x kTile cells; a warp's lane owns one tile row (horizontal scans) or one tile
// column (vertical scans, loads, stores). Shared tiles use a row stride of kTile + 1 floats so
// that both access patterns are free of bank conflicts.
constexpr int kTile = 32;
constexpr int kTileShift = 5;
constexpr int kStride = kTile + 1;
constexpr int kTileCells = kTile * kTile;
constexpr int kTileCellShift = 2 * kTileShift;
constexpr int kTileFloats = kTile * kStride;
// The forward's shared tiles (forward_layout) have no padding: kTile floats a row, the quads of a
// row permuted by an XOR with the row (fwd_offset in scan2d_forward.cuh), so a quad of a tile row is
// one aligned 16-byte shared access and both the row walks and the column walks stay free of bank
// conflicts.
constexpr int kFwdTileFloats = kTileCells;
constexpr int kMaxState = 64;  // largest N
constexpr int kMaxWarps = 4;   // warps per block
constexpr int kBlockThreads = kMaxWarps * kTile;
// Global loads / stores of u, delta, B, C, y, du, ddelta move quads: kQuad consecutive cells of
// a tile row as one vector access (16 bytes fp32, 8 bytes fp16 / bf16) where they are consecutive
// in memory and aligned, else one scalar access per cell. A tile row is kQuadsPerRow quads, so a
// warp covers kTile / kQuadsPerRow = 4 rows per access.
constexpr int kQuad = 4;
constexpr int kQuadsPerRow = kTile / kQuad;
constexpr int kQuadsPerRowShift = 3;
constexpr int kQuadRowStep = kTile / kQuadsPerRow;  // rows per warp-wide quad access
constexpr int kTileQuads = kTileCells / kQuad;
constexpr int kTileQuadShift = kTileCellShift - 2;
// Resource budget of every kernel (checked by `nvcc -Xptxas -v`, see the README): blocks of at
// most 128 threads; the forward and the carry scan at most 65536 / (128 * kMinBlocksPerSm) = 85
// (ptxas: 80) registers per thread, so that six 4-warp forward blocks (24 warps) fit on an SM; the
// backward at most 255 (its general variant, whose shared memory allows at most 2 blocks per SM
// anyway) or 128 (its one-state variant: four blocks per SM, backward_min_blocks_per_sm); no
// spills. Dynamic shared memory: forward_layout / backward_layout below; e.g. at N = 1 with 4
// channels per block the forward takes 33 KB (six blocks per H100 / H200 SM) and the backward 55 KB
// (four).
// plan_launch picks channels and warps per block from them.
constexpr int kMinBlocksPerSm = 6;
constexpr int kMinBackwardBlocksPerSm = 2;
constexpr int kRegistersPerSm = 65536;

// How maps are laid onto tiles, per axis:
//  * an extent larger than kTile is cut into tiles_h x tiles_w tiles walked in row-major order
//    with carries between them; the segment length along that axis is kTile (no restart inside);
//  * an extent that fits into a tile is packed pack_rows (pack_cols) times across the tile: maps
//    of consecutive batch entries of one channel, one per segment of length seg_h = height
//    (seg_w = width), at whose start the scans restart.
// Cell (r, c) of a tile belongs to pack row r / seg_h, computed as (r * magic_h) >> 16 with
// magic_h = 65536 / seg_h + 1 (exact for r, seg_h <= 32): no integer division, no index table.
// One route of the four-route op (route kernels, Variant::kRoute; inactive for the single-route
// op). The kernel works in ROUTE coordinates exactly as the single-route kernel: its grid is the
// route's grid (height x width above: (H, W), (W, H) for columns-first routes, (1, H * W) for
// flat ones) and route position p = row * width + col. Only the global addressing maps p to the
// map position of the cell (vmamba2d/ops/routes.py's to_route_order): with the route's row a and
// column b of p in its (rows, inner) grid, inner = H (columns first) or W, the map cell is
// (b, a) for columns-first routes, else (a, b), then flipped along from_bottom / from_right.
// u / dy / y / du keep the single-route planes (dim per batch entry); delta / ddelta have
// delta_planes (routes * dim) and B / C / dB / dC bc_planes (routes * N) planes per batch entry,
// the launch's pointers already at the route's first plane.
struct RouteAddressing {
  bool active;
  bool columns_first;
  bool from_bottom;
  bool from_right;
  bool reversed;     // from_bottom and from_right, not columns first: map position L - 1 - p
  bool linear;       // identity or reversed: a quad of one route row is 4 adjacent map cells
  bool accumulate;   // add into the fp32 y / du (routes after the first) instead of storing
  int map_h;
  int map_w;
  uint32_t inner;    // the route grid's row length in map cells: H (columns first) or W
  uint64_t magic;    // p / inner = (p * magic) >> shift for 0 <= p < 2^31
  int shift;
  int64_t delta_planes;
  int64_t bc_planes;
};

struct Geometry {
  int batch;
  int dim;
  int groups;
  int nstate;
  int height;
  int width;
  int64_t length;
  int pack_rows;
  int pack_cols;
  int seg_h;
  int seg_w;
  uint32_t magic_h;
  uint32_t magic_w;
  int tiles_h;
  int tiles_w;
  int batch_blocks;  // ceil(batch / (pack_rows * pack_cols))
  RouteAddressing route;
};

// Work split of one launch. A block owns `channels` channels of one group, each on
// `warps_per_channel` (wpc) warps: warp w works on channel w / wpc and, in round i, on state
// i * wpc + w % wpc (rounds: state_rounds). The block loads the B / C quads of a round's states
// once and uses them for all its channels.
//  forward:  grid (batch_blocks, dim / fwd_channels[, tiles of a map]).
//  backward: grid (batch_blocks, groups * slices[, tiles]); a block walks the dim / groups / slices
//            channels of its slice of a group bwd_channels at a time. dB / dC of a slice are summed
//            over the block's channels on chip in channel order and added once per cell and state
//            into the slice's own partial buffer (no atomics); the partials are summed in slice
//            order afterwards: deterministic.
//  tile_parallel: the forward runs the tile-parallel passes (grid z = tiles of a map) because the
//            sequential grid has too few blocks for the device's resident block slots (few maps,
//            e.g. one 200x200 map; use_tile_parallel in scan2d_driver.h): see ForwardPass;
//            bwd_tile_parallel likewise for the backward.
struct Launch {
  int fwd_channels;
  int fwd_wpc;
  int bwd_channels;
  int bwd_wpc;
  int slices;
  bool tile_parallel;
  bool bwd_tile_parallel;
  bool fwd_carry_in_registers;  // forward_carry_in_registers: the forward's layout has no carry rows
};

// Rounds of the per-tile state loop: each warp handles one state per round.
SS2D_HD inline int state_rounds(int nstate, int wpc) { return (nstate + wpc - 1) / wpc; }

// The forward's passes. kSequential: a block walks all tiles of its maps in row-major order and
// carries the states from tile to tile. Tile-parallel (one block per tile, grid z = tile):
//   kRowEdges:    per tile row and state, hh at the right edge with zero carry-in, and the product
//                 of Abar along the row (edge / prod); then carry_scan rows -> carry_h;
//   kColumnEdges: with the true carry_h, per tile column and state, h at the bottom edge with zero
//                 vertical carry-in and the product of Abar down the column; then carry_scan
//                 columns -> carry_v;
//   kFinal:       every tile from its true carries -> y.
enum ForwardPass : int { kSequential = 0, kRowEdges = 1, kColumnEdges = 2, kFinal = 3 };

struct Params {
  Geometry g;
  Launch k;
  bool softplus;
  // Inputs (element type T of the kernel for u, delta, B, C; fp32 for the rest).
  const void* u;
  const void* delta;
  const void* B;
  const void* C;
  const float* A;
  const float* D;           // nullable
  const float* delta_bias;  // nullable
  // Forward output.
  void* y;
  bool y_fp32;
  // Tile carries, fp32, [map][slot][n][kTile] with map = batch block * dim + d.
  // record == true: slot = ti * tiles_w + tj, the carries INTO every tile (h from the left in
  // carry_h, from above in carry_v), saved for the backward pass.
  // record == false: only carry_v, slot = tile column, overwritten band after band.
  float* carry_v;
  float* carry_h;
  bool record;
  // Tile-parallel forward: the pass, and per-tile edge values / Abar products (carry layout).
  int pass;
  float* edge;
  float* prod;
  // Backward.
  const void* dy;
  bool dy_fp32;
  void* du;            // T
  void* ddelta;        // T
  float* dB_part;      // [slices][batch][groups][N][L], zero-initialised
  float* dC_part;
  float* dA_part;      // [batch_blocks][dim][N]
  float* dD_part;      // [batch_blocks][dim]
  float* ddb_part;     // [batch_blocks][dim]
  float* grad_carry_v;  // [map][tile column][n][kTile]: Abar * dL/dh of the tile row below
  // Tile-parallel backward (carry layout): Abar * dL/dh flowing into each tile from below / from
  // the right. The backward's pass reuses `pass` (kColumnEdges, kRowEdges, kFinal) and edge / prod.
  float* grad_in_v;
  float* grad_in_h;
  // Route kernels at N = 1 with 2-byte inputs: each cell's fp32 dt from the backward's first phase
  // to its last ([batch][dim][L], map order; see move_route_dt). Null otherwise.
  float* dt_park;
};

// Compile-time specialisations of the forward and backward kernels (both contexts run the same
// one). kGeneral serves every plan and pass with the counts read at run time. kOneStateSequential
// serves N = 1 in the sequential pass -- the plan of the model shapes: one warp per channel, one
// state round --, with the state count, the warps per channel and the pass folded at compile time,
// so its code has no loops over a round's states and no tile-parallel branches.
// kRoute / kOneStateRoute are kGeneral / kOneStateSequential on one route of the four-route op
// (RouteAddressing): the same code with the route's addressing compiled in (so the single-route
// variants keep none of it), in the forward and in the backward.
enum class Variant : int { kGeneral = 0, kOneStateSequential = 1, kRoute = 2, kOneStateRoute = 3 };

constexpr const char* variant_name(Variant v) {
  constexpr const char* kNames[] = {"kGeneral", "kOneStateSequential", "kRoute", "kOneStateRoute"};
  return kNames[static_cast<int>(v)];
}

constexpr bool is_one_state(Variant v) { return v == Variant::kOneStateSequential || v == Variant::kOneStateRoute; }
constexpr bool is_route(Variant v) { return v == Variant::kRoute || v == Variant::kOneStateRoute; }

// The variant that runs a pass of plan p with wpc warps per channel (the launchers and the host
// emulation both ask this function).
SS2D_HD inline Variant kernel_variant(const Params& p, int wpc) {
  const bool one_state = p.g.nstate == 1 && wpc == 1 && p.pass == kSequential;
  if (p.g.route.active) return one_state ? Variant::kOneStateRoute : Variant::kRoute;
  return one_state ? Variant::kOneStateSequential : Variant::kGeneral;
}

// The archs (compute capability x 10 of the compiled code) whose forward keeps its one-state
// variants' horizontal carries in registers (forward_carry_in_registers): those where the 512 B of
// carry rows cost the model plan's 4-channel blocks (32 KiB of tiles) a block per SM -- sm_86 ..
// sm_89 (100 KiB per SM, 1 KiB reserved per block: three blocks instead of two; cc 8.7 runs the
// sm_86 code too), sm_75 (64 KiB, none reserved: two instead of one), sm_70 / sm_72 (96 KiB: three
// instead of two). Their forward is compiled for those blocks (forward_min_blocks_per_sm).
SS2D_HD constexpr bool register_carry_arch(int arch) { return arch < 80 || (arch >= 86 && arch < 90); }
#ifdef __CUDA_ARCH__
constexpr int kCompiledArch = __CUDA_ARCH__ / 10;
constexpr bool kCompilingRegisterCarry = register_carry_arch(kCompiledArch);
#else
constexpr int kCompiledArch = 0;  // the host pass (the emulation picks the form it runs)
constexpr bool kCompilingRegisterCarry = false;
#endif

// Blocks per SM each forward variant is compiled for (__launch_bounds__) on arch: six 4-warp blocks
// (24 warps) at <= 80 registers; the route variant, whose per-cell route addressing needs a few more
// registers on its per-cell path, five (20 warps, <= 102 registers). The register-carry archs: the
// 4-channel blocks their shared memory holds -- three on sm_86 .. sm_89 and sm_70 / sm_72 (<= 168
// registers), two on sm_75 (<= 255); ptxas then keeps the one-state variants' loads in flight in
// 128 .. 164 registers without spills (at four or five blocks it spills in them on sm_80 / sm_86;
// at six, the 80 registers spill in the route variants there).
constexpr int forward_min_blocks_per_sm(Variant v, int arch) {
  if (!register_carry_arch(arch)) return is_route(v) ? kMinBlocksPerSm - 1 : kMinBlocksPerSm;
  return arch >= 75 && arch < 80 ? 2 : 3;
}

// Blocks per SM each backward variant is compiled for (__launch_bounds__): the one-state variants
// (single-route and route) read u, dy and delta (for dt) again in their last phase instead of
// keeping them on chip (one state round, see backward_layout), which with 128 registers lets four
// 4-warp blocks share an SM (16 warps on an H100).
constexpr int backward_min_blocks_per_sm(Variant v) {
  return is_one_state(v) ? 2 * kMinBackwardBlocksPerSm : kMinBackwardBlocksPerSm;
}

// One carry propagation between tile-parallel passes (carry_scan_block).
struct CarryScan {
  bool rows;      // along tile rows (else down tile columns)
  bool reverse;   // from the last tile backwards (the backward's gradient carries)
  const float* edge;
  const float* prod;
  float* carry;
};

SS2D_HD inline size_t align16(size_t bytes) { return (bytes + 15) & ~static_cast<size_t>(15); }

// Element counts of the global buffers (the host emulation bounds-checks every access).
SS2D_HD inline int64_t ud_numel(const Geometry& g) {
  return static_cast<int64_t>(g.batch) * g.dim * g.length;
}
SS2D_HD inline int64_t bc_numel(const Geometry& g) {
  return static_cast<int64_t>(g.batch) * g.groups * g.nstate * g.length;
}
SS2D_HD inline int64_t maps(const Geometry& g) { return static_cast<int64_t>(g.batch_blocks) * g.dim; }
SS2D_HD inline int64_t carry_numel(const Geometry& g, bool record) {
  const int slots = record ? g.tiles_h * g.tiles_w : g.tiles_w;
  return maps(g) * slots * g.nstate * kTile;
}
// Threads of the carry scan: one per (map, state, lane line, band of tiles along the scan).
SS2D_HD inline int64_t carry_scan_lines(const Geometry& g, bool rows) {
  return maps(g) * g.nstate * kTile * (rows ? g.tiles_h : g.tiles_w);
}
SS2D_HD inline int64_t grad_carry_numel(const Geometry& g) {
  return maps(g) * g.tiles_w * g.nstate * kTile;
}

// Byte offsets into a block's dynamic shared memory. Every tile is kTileFloats floats (the
// forward's: kFwdTileFloats). Per-channel
// tiles that only carry values from one state round to the next exist only with several rounds.
struct ForwardLayout {
  size_t consts;  // route kernels: float[kForwardConstRows][kMaxWarps], then the column starts (below)
  size_t dt;    // tile per channel (several rounds): dt (0 on padding, so Abar = 1)
  size_t u;     // tile per channel (several rounds): u (0 on padding, so x = 0)
  size_t y;     // tile per channel (several rounds): D * u + C * h of the rounds so far
  size_t x;     // tile per warp (every other tile from here): x = dt * B * u, then hh, then h
  size_t abar;  // tile per warp right after its x tile: exp(dt * A[n]) (one base serves both)
  size_t hcar;  // float[channels][N][kTile]: horizontal carry to the next tile (none in registers)
  size_t total;
};
// Whether the forward's lanes keep their horizontal carries to the next tile in registers instead
// of carry rows in shared memory: on the register-carry archs at N = 1 with one warp per channel
// (the one-state variants; the tile-parallel passes take their carries from global memory). A warp
// then scans the same channel's rows in every tile, and a 4-channel block's shared memory is its x
// and Abar tiles alone, 32 KiB. Elsewhere the carry rows stay: the register would cost a spill
// within the 80 registers of six blocks per SM (sm_90), and on sm_80 the half KiB frees no block.
SS2D_HD inline bool forward_carry_in_registers(int nstate, int wpc, int arch) {
  return register_carry_arch(arch) && nstate == 1 && wpc == 1;
}
// The one-state route forward's per-block constants (ForwardLayout::consts, at offset 0: addressed
// without a register): row kBiasRow delta_bias, kA2Row A * log2(e), kSkipRow D of each of the
// block's channels (0 past them or where absent), then one uint32: segment_starts(seg_w).
constexpr int kBiasRow = 0;
constexpr int kA2Row = 1;
constexpr int kSkipRow = 2;
constexpr int kForwardConstRows = 3;
constexpr int kForwardColumnStarts = kForwardConstRows * kMaxWarps;  // its index in floats

struct BackwardLayout {
  size_t dt;     // tile per channel (backward_keeps_dt): dt
  size_t u;      // tile per channel (several rounds): u
  size_t dy;     // tile per channel (several rounds): dy
  size_t sum_b;  // tile per channel (several rounds): sum over states of dL/dx * B
  size_t ddt;    // tile per channel (several rounds): dL/ddt so far
  size_t b;      // tile per warp of a channel (wpc): B of the round's states
  size_t warp;   // kBackwardWarpTiles tiles per warp (below)
  size_t hcar;   // float[channels][N][kTile]: reverse horizontal carry
  size_t dA;     // float[channels][N]
  size_t lane;   // float[nwarps][kTile]: per-lane dA partials
  size_t top;    // float[nwarps][kTile]: h flowing into a tile's first row from the tile above
  size_t consts; // float[channels][kBackwardChannelConsts + N]: delta_bias, D, then A of each state
  size_t total;
};
// Per channel of a channel set, before its A of each state: delta_bias and D (0 where absent).
constexpr int kBackwardChannelConsts = 2;
// Per warp: Abar (then the state's dL/ddt term, or dL/dAbar * Abar where dt is not kept), h (hh,
// then h), g (dy * C, then dL/dh, then dL/dx). The final dD / ddelta_bias (/ dA) reduction reuses
// this region.
constexpr int kBackwardWarpTiles = 3;

struct LayoutBuilder {
  size_t off = 0;
  SS2D_HD size_t take(size_t bytes) {
    const size_t at = off;
    off = align16(off + bytes);
    return at;
  }
};

// routed: a route kernel's layout (the consts region; empty for the single-route kernels, whose
// other offsets it leaves unchanged).
// carry_in_registers: forward_carry_in_registers of the launch (Launch::fwd_carry_in_registers).
SS2D_HD inline ForwardLayout forward_layout(int channels, int wpc, int nstate, bool routed, bool carry_in_registers) {
  LayoutBuilder b;
  ForwardLayout l{};
  const size_t tile = sizeof(float) * kFwdTileFloats;
  const int nwarps = channels * wpc;
  const int carried = state_rounds(nstate, wpc) > 1 ? channels : 0;
  l.consts = b.take(routed ? sizeof(float) * (kForwardColumnStarts + 1) : 0);
  l.dt = b.take(tile * carried);
  l.u = b.take(tile * carried);
  l.y = b.take(tile * carried);
  l.x = b.take(2 * tile * nwarps);
  l.abar = l.x + tile;
  l.hcar = b.take(carry_in_registers ? 0 : sizeof(float) * channels * nstate * kTile);
  l.total = b.off;
  return l;
}

// Whether the backward keeps dt on chip from its first phase to its last. At N = 1 (one warp per
// channel, one state round) it recomputes dt in the last phase from delta instead (read again from
// L2 like u and dy), and the warps keep dL/dAbar * Abar for that phase, which also sums dA: four
// 4-warp blocks then fit into an H100 SM.
// A route kernel parks dt too (move_route_dt): its du is the fp32 sum over the routes, so fp32 dt
// goes into the route's own ddelta cells, a 2-byte type's into Params::dt_park.
SS2D_HD inline bool backward_keeps_dt(int nstate) { return nstate > 1; }

SS2D_HD inline BackwardLayout backward_layout(int channels, int wpc, int nstate) {
  LayoutBuilder b;
  BackwardLayout l{};
  const size_t tile = sizeof(float) * kTileFloats;
  const int nwarps = channels * wpc;
  const int carried = state_rounds(nstate, wpc) > 1 ? channels : 0;
  // First: at a fixed place, so the block phases address the constants without a register.
  l.consts = b.take(sizeof(float) * channels * (kBackwardChannelConsts + nstate));
  l.dt = b.take(tile * (backward_keeps_dt(nstate) ? channels : 0));
  l.u = b.take(tile * carried);
  l.dy = b.take(tile * carried);
  l.sum_b = b.take(tile * carried);
  l.ddt = b.take(tile * carried);
  l.b = b.take(tile * wpc);
  l.warp = b.take(tile * kBackwardWarpTiles * nwarps);
  l.hcar = b.take(sizeof(float) * channels * nstate * kTile);
  l.dA = b.take(sizeof(float) * channels * nstate);
  l.lane = b.take(sizeof(float) * nwarps * kTile);
  l.top = b.take(sizeof(float) * nwarps * kTile);
  l.total = b.off;
  return l;
}

// kQuad elements as one aligned vector: the unit of the vectorised global accesses.
template <class T>
struct alignas(kQuad * sizeof(T)) Vec4 {
  T v[kQuad];
};

enum class ElementType { kFloat32, kFloat16, kBFloat16 };

}  // namespace scan2d
}  // namespace vmamba2d
