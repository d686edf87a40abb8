// Shared by the CUDA kernels, their host launchers and the host emulation: tile constants, the
// kernel parameter block and the shared-memory layout. Plain C++ (no ATen), compiles with nvcc
// and with the host compiler.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define SS2D_HD __host__ __device__
#define SS2D_INLINE __forceinline__
#define SS2D_UNROLL _Pragma("unroll")
#else
#define SS2D_HD
#define SS2D_INLINE inline
#define SS2D_UNROLL
#endif

namespace vmamba2d {
namespace scan2d {

// A tile is kTile x kTile cells; a warp's lane owns one tile row (horizontal scans) or one tile
// column (vertical scans). Shared tiles use a row stride of kTile + 1 floats so that both the
// row-wise and the column-wise access patterns are free of bank conflicts.
constexpr int kTile = 32;
constexpr int kStride = kTile + 1;
constexpr int kTileCells = kTile * kTile;
constexpr int kTileFloats = kTile * kStride;
constexpr int kMaxPack = 64;   // most small maps packed into one tile
constexpr int kMaxState = 64;  // largest N
constexpr int kMaxWarps = 4;   // warps per block; warp w owns states w, w + nwarps, ...
constexpr int kForwardWarpBuffers = 1;   // B tile, then h; finally the warp's y partial
constexpr int kBackwardWarpBuffers = 4;  // B (then du partial), C (then dL/dh), hh, dL/ddt

// How maps are laid onto tiles, per axis:
//  * an extent larger than kTile is cut into tiles_h x tiles_w tiles walked in row-major order
//    with carries between them; the segment length along that axis is kTile (no restart inside);
//  * an extent that fits into a tile is packed pack_rows (pack_cols) times across the tile: maps
//    of consecutive batch entries of one channel, one per segment of length seg_h = height
//    (seg_w = width), at whose start the scans restart.
// A block handles one channel and one batch block of pack_rows * pack_cols maps.
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
  int tiles_h;
  int tiles_w;
  int batch_blocks;  // ceil(batch / (pack_rows * pack_cols))
};

struct Params {
  Geometry g;
  bool softplus;
  // Inputs (element type T of the kernel for u, delta, B, C; fp32 for the rest).
  const void* u;
  const void* delta;
  const void* B;
  const void* C;
  const float* A;
  const float* D;           // nullable
  const float* delta_bias;  // nullable
  // Forward output (nullable: the backward's carry-recording pass writes no y).
  void* y;
  bool y_fp32;
  // Tile carries, fp32, [block][slot][n][kTile] with block = batch block * dim + d.
  // record == false: slot = tile column, overwritten band after band (vertical carries only).
  // record == true: slot = ti * tiles_w + tj, the carries INTO every tile (h from the left in
  // carry_h, from above in carry_v), kept for the backward pass.
  float* carry_v;
  float* carry_h;
  bool record;
  // Backward.
  const void* dy;
  bool dy_fp32;
  void* du;         // T
  void* ddelta;     // T
  float* dB;        // (batch, groups, N, L) fp32 accumulators, zero-initialised
  float* dC;
  float* dA_part;   // (batch_blocks, dim, N)
  float* dD_part;   // (batch_blocks, dim)
  float* ddb_part;  // (batch_blocks, dim)
  // [block][tile column][n][kTile]: Abar * dL/dh of the first row of the tile below.
  float* grad_carry_v;
  int channels_per_block;  // 1, or dim / groups in deterministic mode
  bool atomic_bc;          // accumulate dB / dC with atomics (false: the block owns its group)
};

SS2D_HD inline size_t align16(size_t bytes) { return (bytes + 15) & ~static_cast<size_t>(15); }

// Byte offsets into a block's dynamic shared memory.
struct SmemLayout {
  size_t base_ud;    // int64[kMaxPack]: offset of map slot s in u / delta / y (-1: no map)
  size_t base_bc;    // int64[kMaxPack]: offset of map slot s's (b, g) in B / C
  size_t cell_pos;   // int[kTileCells]: position of a tile cell in its map (-1: padding)
  size_t cell_slot;  // int[kTileCells]: map slot of a tile cell
  size_t dt;         // float tile: dt (0 on padding, so Abar = 1)
  size_t u;          // float tile: u (0 on padding, so x = 0)
  size_t dy;         // float tile: dy (backward)
  size_t warp;       // per warp: kForwardWarpBuffers / kBackwardWarpBuffers float tiles
  size_t hcar;       // float[N][kTile]: horizontal carry (forward) / reverse carry (backward)
  size_t dA;         // float[N] (backward)
  size_t lane;       // float[nwarps][kTile] (backward): per-lane dA partials
  size_t red;        // float[2][nthreads] (backward): per-thread dD and ddelta_bias partials
  size_t total;
};

SS2D_HD inline SmemLayout smem_layout(bool backward, int nwarps, int nstate) {
  SmemLayout s{};
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off = align16(off + bytes);
    return at;
  };
  const size_t tile_bytes = sizeof(float) * kTileFloats;
  s.base_ud = take(sizeof(int64_t) * kMaxPack);
  s.base_bc = take(sizeof(int64_t) * kMaxPack);
  s.cell_pos = take(sizeof(int) * kTileCells);
  s.cell_slot = take(sizeof(int) * kTileCells);
  s.dt = take(tile_bytes);
  s.u = take(tile_bytes);
  s.dy = backward ? take(tile_bytes) : 0;
  s.warp = take(tile_bytes * nwarps * (backward ? kBackwardWarpBuffers : kForwardWarpBuffers));
  s.hcar = take(sizeof(float) * nstate * kTile);
  s.dA = backward ? take(sizeof(float) * nstate) : 0;
  s.lane = backward ? take(sizeof(float) * nwarps * kTile) : 0;
  s.red = backward ? take(sizeof(float) * 2 * nwarps * kTile) : 0;
  s.total = off;
  return s;
}

enum class ElementType { kFloat32, kFloat16, kBFloat16 };

}  // namespace scan2d
}  // namespace vmamba2d
