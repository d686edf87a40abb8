// PL, the v4 one-plane-per-lane forward of the 2D selective scan at N = 1 for planes of at most 64
// cells (the model's 7x7 stage; docs/kernels.md, "PL"), written once for two execution contexts like
// RS (scan2d_rows.cuh):
//   * PlanesDeviceCtx (scan2d_planes_device.cuh): one CUDA thread per thread of the CTA;
//     each_thread runs the body for the calling thread, barrier is __syncthreads, copies are
//     cp.async (sm_80+) or a load and a shared store (sm_75);
//   * the host context (emulation/scan2d_planes_emulate.cpp): one CPU thread runs the CTA's
//     threads one after another in a chosen order in every phase; an asynchronous copy is issued at
//     one point and lands only at the issuing thread's wait; every shared and global access is
//     checked (bounds, alignment, races between barriers, reads of bytes still in flight, copies
//     into bytes read since the last barrier).
// Rules that keep the two equivalent: threads exchange values only through shared memory, ordered
// by ctx.barrier() (called between each_thread phases, which every thread reaches); no state lives
// across phases except what the phase recomputes from the parameters.
//
// The design: a CTA of T threads takes chunks of T consecutive maps (planes), persistent over the
// grid. Per chunk, u, delta, B and C are staged in shared memory by copy_bytes-wide asynchronous
// copies (one contiguous run per tensor and batch entry), double-buffered: the copy of the CTA's
// next chunk is issued before the scan of the current one and waited for after it. Thread t scans
// plane t sequentially in the route's order, the recurrence state in registers (min(lines, cells)
// <= 8 values: the previous line's h, or each line's running hh when the plane is walked column by
// column -- the same operations per cell in either order), and writes y into shared memory (over
// its own u plane when y has the inputs' type); the CTA then stores the chunk's y as copy_bytes-wide
// stores of contiguous bytes. Two barriers per chunk; every input byte read once, y written once.
#pragma once

#include "scan2d_math.cuh"
#include "scan2d_planes_common.h"

namespace vmamba2d {
namespace planes {

using scan2d::exp2_flush;
using scan2d::kLog2e;
using scan2d::softplus;

// Staging bugs the host emulation can inject to show its checker catches them (its ctx.bug(); the
// device context's is always kBugNone):
//   kBugNoWait              the scan starts without waiting for the chunk's copies;
//   kBugNoBarrierAfterWait  each thread waits for its own copies, but no barrier follows before the
//                           threads read each other's;
//   kBugRefillWhileRead     the next chunk's copy goes into the buffer being scanned, issued before
//                           the barrier that ends its readers' phase.
enum : int { kBugNone = 0, kBugNoWait = 1, kBugNoBarrierAfterWait = 2, kBugRefillWhileRead = 3 };

// E: the element type's traits (Raw, the storage type; to_float / from_float). kH, kW, kRoute: the
// plane's shape and the route code compiled in (the GPU entry), or -1 (each) to take them from the
// parameters (the host emulation). kCopy: bytes per asynchronous copy and per staged store.
template <class E, int kH, int kW, int kRoute, int kCopy>
struct PlanesForward {
  using Raw = typename E::Raw;
  static constexpr int kElem = static_cast<int>(sizeof(Raw));
  static constexpr bool kFixed = kH > 0 && kW > 0 && kRoute >= 0;
  static_assert(kCopy == 4 || kCopy == 8 || kCopy == 16, "copies of 4, 8 or 16 bytes");
  static_assert(!kFixed || kH * kW <= kMaxCells, "PL scans planes of at most 64 cells");

  // The element at a (non-negative) byte offset of a tensor of kBytes elements: an unsigned shift.
  template <int kBytes>
  static SS2D_HD SS2D_INLINE long long element(long long byte) {
    return static_cast<long long>(static_cast<unsigned long long>(byte) / kBytes);
  }

  // Cells of a plane (compiled in where the shape is).
  static SS2D_HD SS2D_INLINE int cells(const PlanesParams& p) { return kFixed ? kH * kW : p.height * p.width; }

  // Where one chunk's planes of each tensor sit in a buffer.
  struct Chunk {
    int first;  // first map
    int count;  // maps in the chunk
    Staging u, delta, b, c, y;
  };

  static SS2D_HD SS2D_INLINE Chunk chunk_of(const PlanesParams& p, const PlanesLayout& s, int k) {
    const int maps = p.batch * p.dim;
    const int per_group = planes_div(p.dim, p.groups);
    Chunk ch;
    ch.first = k * p.chunk;
    ch.count = maps - ch.first < p.chunk ? maps - ch.first : p.chunk;
    const int last = ch.first + ch.count - 1;
    const int delta_planes = static_cast<int>(p.delta_planes);
    const int bc_planes = static_cast<int>(p.bc_planes);
    ch.u = Staging{ch.first, ch.count, p.dim, p.dim, s.u, kElem};
    ch.delta = Staging{ch.first, ch.count, p.dim, delta_planes, s.delta, kElem};
    // B / C: entry (b, g) is key m / per_group of map m = b * dim + d (dim = groups * per_group).
    const int key = planes_div(ch.first, per_group);
    const int keys = planes_div(last, per_group) - key + 1;
    ch.b = Staging{key, keys, p.groups, bc_planes, s.b, kElem};
    ch.c = Staging{key, keys, p.groups, bc_planes, s.c, kElem};
    ch.y = s.y < 0 ? ch.u : Staging{ch.first, ch.count, p.dim, p.dim, s.y, 4};
    return ch;
  }

  // Thread t's share of the copies of one tensor's chunk planes into the buffer at `buffer`:
  // per contiguous run (batch entry), the copy_bytes-aligned pieces from the one holding the run's
  // first byte to the one holding its last (the last piece reads only up to the run's end; the
  // first may start up to copy_bytes - elem bytes before the run, inside the tensor).
  template <class Ctx, class View>
  static SS2D_HD SS2D_INLINE void stage(Ctx& ctx, const View& src, const Staging& s, int length, int buffer, int t,
                                        int threads) {
    const int plane = length * s.elem;
    const int pitch = planes_pitch(length, s.elem, kCopy);
    const int b0 = planes_div(s.first, s.per);
    const int runs = s.stride == s.per ? 1 : planes_div(s.first + s.count - 1, s.per) - b0 + 1;
    for (int seg = 0; seg < runs; ++seg) {
      const int js = seg == 0 ? 0 : (b0 + seg) * s.per - s.first;
      const int next = (b0 + seg + 1) * s.per - s.first;
      const int end_j = runs == 1 || next > s.count ? s.count : next;
      const long long begin = planes_global_plane(s, s.first + js) * plane;
      const int bytes_run = (end_j - js) * plane;
      const int lead = static_cast<int>(begin % kCopy);
      const long long aligned = begin - lead;
      const int dst = buffer + s.region + kCopy * (2 * seg + js * pitch / kCopy);
      const int pieces = (lead + bytes_run + kCopy - 1) / kCopy;
      for (int i = t; i < pieces; i += threads) {
        const int left = lead + bytes_run - i * kCopy;
        ctx.template copy_async<kCopy>(dst + planes_piece_at(i, plane, pitch, kCopy), src,
                                       element<kElem>(aligned + i * kCopy), left < kCopy ? left : kCopy);
      }
    }
  }

  // Issue thread t's copies of chunk k into the buffer at `buffer`, as one commit group.
  template <class Ctx, class Views>
  static SS2D_HD SS2D_INLINE void stage_chunk(Ctx& ctx, const Views& v, const PlanesParams& p, const PlanesLayout& s,
                                              int k, int buffer, int t) {
    const int length = cells(p);
    const Chunk ch = chunk_of(p, s, k);
    stage(ctx, v.u, ch.u, length, buffer, t, p.chunk);
    stage(ctx, v.delta, ch.delta, length, buffer, t, p.chunk);
    stage(ctx, v.B, ch.b, length, buffer, t, p.chunk);
    stage(ctx, v.C, ch.c, length, buffer, t, p.chunk);
    ctx.commit();
  }

  // Thread t's share of storing the chunk's staged y: copy_bytes-wide stores of the aligned pieces
  // wholly inside the chunk's bytes of y, element stores at the two ragged ends.
  template <class Out, class Ctx, class YView>
  static SS2D_HD SS2D_INLINE void store_y(Ctx& ctx, const YView& y, const Staging& s, int length, int base, int t,
                                          int threads) {
    constexpr int kOut = static_cast<int>(sizeof(Out));
    const long long begin = static_cast<long long>(s.first) * length * kOut;
    const int bytes = s.count * length * kOut;
    const int lead = static_cast<int>(begin % kCopy);
    const long long aligned = begin - lead;
    const int plane = length * kOut;
    const int pitch = planes_pitch(length, kOut, kCopy);
    const int dst = base + s.region;
    const int pieces = (lead + bytes + kCopy - 1) / kCopy;
    for (int i = t; i < pieces; i += threads) {
      const int from = i * kCopy;  // bytes from `aligned`
      const int at = dst + planes_piece_at(i, plane, pitch, kCopy);
      if (from >= lead && from + kCopy <= lead + bytes) {
        ctx.template shared_to_global<kCopy>(y, element<kOut>(aligned + from), at);
      } else {
        for (int b = from > lead ? from : lead; b < lead + bytes && b < from + kCopy; b += kOut) {
          ctx.template shared_to_global<kOut>(y, element<kOut>(aligned + b), at + (b - from));
        }
      }
    }
  }

  // Thread t's plane of chunk k in the buffer at `buffer`: the scan, y into shared memory.
  template <class Out, class Ctx, class Views>
  static SS2D_HD SS2D_INLINE void scan_plane(Ctx& ctx, const Views& v, const PlanesParams& p, const PlanesLayout& s,
                                             int k, int buffer, int t) {
    const Chunk ch = chunk_of(p, s, k);
    if (t >= ch.count) return;
    const int length = cells(p);
    const int m = ch.first + t;
    const int d = planes_mod(m, p.dim);
    const int per_group = planes_div(p.dim, p.groups);
    const int su = buffer + planes_plane_at(ch.u, t, length, kCopy);
    const int sd = buffer + planes_plane_at(ch.delta, t, length, kCopy);
    const int key = planes_div(m, per_group) - ch.b.first;
    const int sb = buffer + planes_plane_at(ch.b, key, length, kCopy);
    const int sc = buffer + planes_plane_at(ch.c, key, length, kCopy);
    // fp32 y of 2-byte inputs has its own region (planes_layout), else y goes over u.
    constexpr bool y_apart = sizeof(Out) != sizeof(Raw);
    const int sy = y_apart ? planes_plane_at(ch.y, t, length, kCopy) : su;
    const float a2 = ctx.read(v.A, d) * kLog2e;
    const float bias = p.delta_bias != nullptr ? ctx.read(v.bias, d) : 0.f;
    const float skip = p.D != nullptr ? ctx.read(v.skip, d) : 0.f;
    const bool use_softplus = p.softplus != 0;

    // Cell idx (map order): Abar, x = dt * B * u and D * u.
    auto cell = [&](int idx, float& a, float& x, float& du) {
      const float z = E::to_float(ctx.template lds<Raw>(sd + idx * kElem)) + bias;
      const float dt = use_softplus ? softplus(z) : z;
      const float uk = E::to_float(ctx.template lds<Raw>(su + idx * kElem));
      a = exp2_flush(dt * a2);
      x = dt * E::to_float(ctx.template lds<Raw>(sb + idx * kElem)) * uk;
      du = skip * uk;
    };
    // y = C * h + D * u of cell idx, into shared memory (u of the cell has been read).
    auto emit = [&](int idx, float h, float du) {
      const float out = fmaf(E::to_float(ctx.template lds<Raw>(sc + idx * kElem)), h, du);
      if constexpr (y_apart) {
        ctx.template sts<float>(sy + idx * 4, out);
      } else {
        ctx.template sts<Raw>(sy + idx * kElem, E::from_float(out));
      }
    };

    constexpr RouteGeometry kGeometry = route_geometry(kRoute < 0 ? 0 : kRoute, kH > 0 ? kH : 1, kW > 0 ? kW : 1);
    const RouteGeometry g = kFixed ? kGeometry : route_geometry(p.route, p.height, p.width);
    if (g.flat) {
      float h = 0.f;
SS2D_UNROLL
      for (int r = 0; r < g.lines; ++r) {
SS2D_UNROLL
        for (int c = 0; c < g.cells; ++c) {
          const int idx = g.start + r * g.line_step + c * g.cell_step;
          float a, x, du;
          cell(idx, a, x, du);
          h = fmaf(a, h, x);
          emit(idx, h, du);
        }
      }
    } else if (g.cells <= g.lines) {
      // Line by line: h of the line above per cell position.
      float above[kMaxState];
SS2D_UNROLL
      for (int c = 0; c < kMaxState; ++c) above[c] = 0.f;
SS2D_UNROLL
      for (int r = 0; r < g.lines; ++r) {
        float hh = 0.f;
SS2D_UNROLL
        for (int c = 0; c < g.cells; ++c) {
          const int idx = g.start + r * g.line_step + c * g.cell_step;
          float a, x, du;
          cell(idx, a, x, du);
          hh = fmaf(a, hh, x);
          const float h = fmaf(a, above[c], hh);
          above[c] = h;
          emit(idx, h, du);
        }
      }
    } else {
      // Column by column (fewer lines than cells): each line's running hh.
      float left[kMaxState];
SS2D_UNROLL
      for (int r = 0; r < kMaxState; ++r) left[r] = 0.f;
SS2D_UNROLL
      for (int c = 0; c < g.cells; ++c) {
        float h = 0.f;
SS2D_UNROLL
        for (int r = 0; r < g.lines; ++r) {
          const int idx = g.start + r * g.line_step + c * g.cell_step;
          float a, x, du;
          cell(idx, a, x, du);
          left[r] = fmaf(a, left[r], x);
          h = fmaf(a, h, left[r]);
          emit(idx, h, du);
        }
      }
    }
  }

  // CTA `block` of a grid of `grid` CTAs: its chunks block, block + grid, ...
  template <class Out, class Ctx, class Views, class YView>
  static SS2D_HD void run_typed(Ctx& ctx, const Views& v, const YView& y, const PlanesParams& p, int block,
                                int grid) {
    const PlanesLayout s = planes_layout(p, kElem);
    const int chunks = static_cast<int>(planes_chunks(p));
    const int length = cells(p);
    if (block >= chunks) return;
    ctx.each_thread([&](int t) { stage_chunk(ctx, v, p, s, block, 0, t); });
    int i = 0;
    for (int k = block; k < chunks; k += grid, ++i) {
      const int buffer = (i & 1) * s.buffer;
      const int other = s.buffer - buffer;
      const int next = k + grid;
      // This thread's copies of chunk k have landed; after the barrier everyone's have, and every
      // thread is past the previous chunk's y stores from the other buffer.
      if (ctx.bug() != kBugNoWait) ctx.each_thread([&](int) { ctx.wait_all(); });
      if (ctx.bug() != kBugNoBarrierAfterWait) ctx.barrier();
      ctx.each_thread([&](int t) {
        if (next < chunks && ctx.bug() != kBugRefillWhileRead) stage_chunk(ctx, v, p, s, next, other, t);
        scan_plane<Out>(ctx, v, p, s, k, buffer, t);
      });
      if (ctx.bug() == kBugRefillWhileRead) {
        ctx.each_thread([&](int t) {
          if (next < chunks) stage_chunk(ctx, v, p, s, next, buffer, t);
        });
      }
      ctx.barrier();
      ctx.each_thread([&](int t) {
        store_y<Out>(ctx, y, chunk_of(p, s, k).y, length, s.y >= 0 ? 0 : buffer, t, p.chunk);
      });
    }
  }

  template <class Ctx, class Views>
  static SS2D_HD void run(Ctx& ctx, const Views& v, const PlanesParams& p, int block, int grid) {
    if (p.y_fp32) {
      run_typed<float>(ctx, v, v.y_f, p, block, grid);
    } else {
      run_typed<Raw>(ctx, v, v.y_t, p, block, grid);
    }
  }
};

}  // namespace planes
}  // namespace vmamba2d
