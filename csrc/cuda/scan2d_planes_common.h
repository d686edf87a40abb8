// The v4 one-plane-per-lane forward (PL, scan2d_planes.cuh): its launch parameters, the route
// geometry of a plane and the shared-memory layout of a CTA, shared by the kernel, its host
// emulation and the launcher (vmamba2d/ops/compiled/planes_launch.py mirrors planes_layout). Plain
// C++ without includes (nvcc, NVRTC and the host compiler all take it); the parameter block holds
// plain pointers, 64-bit and 32-bit ints only, so a launcher can fill it from ctypes.
#pragma once

#include "scan2d_macros.h"

namespace vmamba2d {
namespace planes {

// Largest plane PL scans (cells); min(lines, cells) of a route grid is then <= 8.
constexpr int kMaxCells = 64;
constexpr int kMaxState = 8;

// Route code bits (vmamba2d/ops/routes.py, Route.code).
constexpr int kRouteFromRight = 1;
constexpr int kRouteFromBottom = 2;
constexpr int kRouteColumnsFirst = 4;
constexpr int kRouteFlat = 8;

// One launch. Tensors are contiguous; u, y: [batch][dim][H * W]; delta: [batch][delta_planes][H * W]
// (the first dim planes of each batch entry are read); B, C: [batch][bc_planes][H * W] with N = 1,
// channel d reading plane d / (dim / groups); all in map order (row-major cells) whatever the route.
// A, D, delta_bias: fp32 [dim] (D and delta_bias may be null).
// Work: maps m = b * dim + d; chunk k holds maps k * chunk .. min((k + 1) * chunk, maps) - 1, one per
// thread of a CTA of `chunk` threads; CTA c of a grid of G runs chunks c, c + G, c + 2 G, ...
struct PlanesParams {
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
  int route;       // the route code (0 .. 15); the GPU entry compiles it in and checks it
  int chunk;       // maps per chunk = threads per CTA
  int copy_bytes;  // bytes per asynchronous copy / staged store (16, 8 or 4); every pointer aligned to it
  int softplus;    // 1: dt = softplus(delta + delta_bias), 0: dt = delta + delta_bias
  int y_fp32;      // 1: y is fp32 (whatever the input type), 0: y has the inputs' type
};

// Quotient and remainder of non-negative ints (every index here): unsigned division, without the
// sign fix-ups of int division.
SS2D_HD inline int planes_div(int a, int b) { return static_cast<int>(static_cast<unsigned>(a) / static_cast<unsigned>(b)); }
SS2D_HD inline int planes_mod(int a, int b) { return static_cast<int>(static_cast<unsigned>(a) % static_cast<unsigned>(b)); }

SS2D_HD inline long long planes_chunks(const PlanesParams& p) {
  const long long maps = static_cast<long long>(p.batch) * p.dim;
  return (maps + p.chunk - 1) / p.chunk;
}

// A plane seen in the route's order: `lines` lines of `cells` cells each, cell (r, c) of the route
// grid at map index start + r * line_step + c * cell_step. A 2D route runs the rows-first
// recurrence on this grid (vmamba2d.ops.routes: the map flipped and, columns first, transposed); a
// flat route one 1D scan whose state runs on from a line's last cell into the next line.
struct RouteGeometry {
  int lines;
  int cells;
  int start;
  int line_step;
  int cell_step;
  bool flat;
};

SS2D_HD constexpr RouteGeometry route_geometry(int code, int height, int width) {
  const bool right = code & kRouteFromRight;
  const bool bottom = code & kRouteFromBottom;
  const int start = (bottom ? (height - 1) * width : 0) + (right ? width - 1 : 0);
  const int down = bottom ? -width : width;
  const int across = right ? -1 : 1;
  if (code & kRouteColumnsFirst) return RouteGeometry{width, height, start, across, down, (code & kRouteFlat) != 0};
  return RouteGeometry{height, width, start, down, across, (code & kRouteFlat) != 0};
}

// Shared memory of one CTA: two buffers (double buffering), each with a region per input tensor,
// then, where y's element size differs from the inputs' (fp32 y of 2-byte inputs), one y region; y
// in the inputs' type is staged over the u region of the buffer it came from. A region holds the
// chunk's planes of one tensor as the asynchronous copies left them: per batch entry a segment
// (one for a tensor whose chunk planes are contiguous), each starting copy_bytes-aligned at most
// 2 * copy_bytes later than packed planes would (planes_plane_at); planes `planes_pitch` bytes apart.
struct PlanesLayout {
  int u;       // region offsets within a buffer (bytes)
  int delta;
  int b;
  int c;
  int buffer;  // bytes of one buffer
  int y;       // offset of the separate y region, or -1: y staged over u
  int total;   // dynamic shared memory of the launch
};

SS2D_HD inline int planes_round16(long long bytes) { return static_cast<int>((bytes + 15) / 16 * 16); }

// The most distinct 4-byte words one shared-memory bank serves when 32 lanes load words `bytes`
// apart (a multiple of 4): the power of two in bytes / 4, at most 32.
SS2D_HD inline int planes_bank_ways(int bytes) {
  const int words = bytes / 4;
  const int low = words & -words;
  return low < 32 ? low : 32;
}

// Bytes from one staged plane to the next. A plane of a whole number of copies may take one copy
// of padding (the pieces stay aligned, the lanes of a warp -- one plane each -- then load a cell
// from fewer words per bank: 8 x 8 fp32 planes of 64 words put all 32 lanes on one bank, 68 words
// 4 per bank); planes that are not (7 x 7: 196 or 98 bytes) are packed, as the copies leave them.
SS2D_HD inline int planes_pitch(int length, int elem, int copy) {
  const int plane = length * elem;
  if (plane % copy != 0) return plane;
  return planes_bank_ways(plane + copy) < planes_bank_ways(plane) ? plane + copy : plane;
}

SS2D_HD inline int planes_region_bytes(long long planes, long long segments, int length, int elem, int copy) {
  return planes_round16(planes * planes_pitch(length, elem, copy) + 2LL * copy * segments);
}

// Batch entries a chunk of `chunk` consecutive maps can span, and B / C planes ((b, g) pairs) it can need.
SS2D_HD inline long long planes_batches_spanned(const PlanesParams& p) {
  const long long n = (p.chunk - 1 + p.dim - 1) / p.dim + 1;
  return n < p.chunk ? n : p.chunk;
}
SS2D_HD inline long long planes_keys_spanned(const PlanesParams& p) {
  const long long per_group = p.dim / p.groups;
  const long long n = (p.chunk - 1 + per_group - 1) / per_group + 1;
  return n < p.chunk ? n : p.chunk;
}

SS2D_HD inline PlanesLayout planes_layout(const PlanesParams& p, int elem) {
  const int length = p.height * p.width;
  const int copy = p.copy_bytes;
  const long long batches = planes_batches_spanned(p);
  PlanesLayout s{};
  s.u = 0;
  s.delta = s.u + planes_region_bytes(p.chunk, 1, length, elem, copy);
  s.b = s.delta + planes_region_bytes(p.chunk, p.delta_planes == p.dim ? 1 : batches, length, elem, copy);
  const int bc = planes_region_bytes(planes_keys_spanned(p), p.bc_planes == p.groups ? 1 : batches, length, elem,
                                     copy);
  s.c = s.b + bc;
  s.buffer = s.c + bc;
  const bool y_apart = p.y_fp32 && elem != 4;
  s.y = y_apart ? 2 * s.buffer : -1;
  s.total = 2 * s.buffer + (y_apart ? planes_region_bytes(p.chunk, 1, length, 4, copy) : 0);
  return s;
}

// Planes `first` .. `first + count - 1` of one tensor staged in a region: entry e of the tensor
// lives at global plane (e / per) * stride + e % per (per entries of each batch entry are read,
// stride planes apart; stride == per: contiguous). Entries and planes fit an int (the launchers
// check maps < 2^31).
struct Staging {
  int first;
  int count;
  int per;
  int stride;
  int region;  // the region's offset within its buffer (or within shared memory)
  int elem;    // element bytes
};

// The global plane of entry e.
SS2D_HD inline long long planes_global_plane(const Staging& s, int e) {
  return s.stride == s.per ? e : static_cast<long long>(planes_div(e, s.per)) * s.stride + planes_mod(e, s.per);
}

// Shared byte (from the region's buffer) of piece i of a run whose first piece goes to byte 0: the
// copies of a padded pitch skip the padding after each plane (such a run has no lead: its planes
// are whole pieces).
SS2D_HD inline int planes_piece_at(int i, int plane, int pitch, int copy) {
  if (pitch == plane) return i * copy;
  const int per_plane = plane / copy;
  return i / per_plane * pitch + i % per_plane * copy;
}

// Byte offset (from the region's buffer) of cell 0 of local plane j (0 <= j < count).
SS2D_HD inline int planes_plane_at(const Staging& s, int j, int length, int copy) {
  const int plane = length * s.elem;
  const int pitch = planes_pitch(length, s.elem, copy);
  int seg = 0, js = 0;
  if (s.stride != s.per) {
    const int bj = planes_div(s.first + j, s.per);
    seg = bj - planes_div(s.first, s.per);
    js = seg == 0 ? 0 : bj * s.per - s.first;
  }
  const int lead = static_cast<int>(planes_global_plane(s, s.first + js) * plane % copy);
  return s.region + copy * (2 * seg + js * pitch / copy) + lead + (j - js) * pitch;
}

}  // namespace planes
}  // namespace vmamba2d
