// The backward block of the tiled 2D scan (contexts and rules: scan2d_tile.cuh).
#pragma once

#include <cstring>

#include "scan2d_forward.cuh"  // quad_anchor, whole_quad
#include "scan2d_tile.cuh"

namespace vmamba2d {
namespace scan2d {

// d softplus(z) / dz = sigmoid(z) from z and dt = softplus(z) (the kernels' softplus): sigmoid(z) =
// exp(z - softplus(z)), one exp where the backward has dt and reads delta again anyway (N = 1; half
// the instructions of softplus_grad_from_value). z - dt is exact to the rounding of dt (<= |z| 2^-24
// absolute above z = -2^-5 / below it, the error of softplus's log1p near z = 0 is < 2e-7
// absolute) and the exp's argument rounds by <= |z| log2(e) 2^-24: relative error below 1e-5 for
// z >= -87 (sigmoid a normal float; below, exp2_flush's results under 2^-126 flush to 0);
// tests/ops/compiled/test_scan_cuda.py checks it on the host build.
SS2D_HD SS2D_INLINE float sigmoid_from_softplus(float z, float dt) { return exp2_flush((z - dt) * kLog2e); }

// Where dt is not kept on chip (N = 1, backward_keeps_dt), the first block phase parks each quad's
// fp32 dt in the quad's own du / ddelta cells and the last phase reads it back just before it
// stores du / ddelta there (one global round trip, from L2, instead of softplus again). Every block
// phase maps threads to cells alike and a block owns its channels' cells, so only the parking
// thread touches them in between; the vector decision is the same quad's in both phases. fp32: dt
// in the ddelta cells. 2-byte types: dt's 32 bits over the du and ddelta cells -- on the vector
// path cells 0, 1 in du's quad and cells 2, 3 in ddelta's, else per real cell the high half in du,
// the low half in ddelta.
template <class T>
SS2D_HD SS2D_INLINE T bits_as(uint16_t bits) {
  T v;
  memcpy(&v, &bits, sizeof(v));
  return v;
}

template <class T>
SS2D_HD SS2D_INLINE uint16_t bits_of(T v) {
  uint16_t bits;
  memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// bf16 -> fp32 only places the 16 bits at the top of the float (exact). On the GPU a bf16 vector
// quad widens from its two 32-bit words by one integer operation per value (w << 16, w & 0xffff0000)
// where __bfloat162float takes two for each odd value; the host emulation's bf16 takes the same path
// (selective_scan_2d_emulate.cpp specialises WidenedByBits for it); other types: load_quad.
template <class T>
struct WidenedByBits : std::false_type {};
#ifdef __CUDACC__
template <>
struct WidenedByBits<__nv_bfloat16> : std::true_type {};
#endif

// kRouted: the per-cell path's route addressing (place<true>); a vector quad is always read in
// memory order at off (the backward's vector copies of a reversed route take it so: with_mirror).
template <class T, bool kRouted = false, class Ctx, class View>
SS2D_HD SS2D_INLINE uint32_t load_input_quad(const Ctx& ctx, const Geometry& g, const View& src, const Plane& pl,
                                             const QuadPlace& at, bool vector, int64_t off, float (&out)[kQuad]) {
  if constexpr (WidenedByBits<T>::value) {
    if (vector) {
      const Vec4<T> v = ctx.load_vector(src, off);
      uint32_t words[kQuad / 2];
      memcpy(words, &v, sizeof(words));
SS2D_UNROLL
      for (int i = 0; i < kQuad / 2; ++i) {
        const uint32_t low = words[i] << 16, high = words[i] & 0xffff0000u;
        memcpy(&out[2 * i], &low, sizeof(low));
        memcpy(&out[2 * i + 1], &high, sizeof(high));
      }
      return (1u << kQuad) - 1;
    }
  }
  if (vector) return load_quad<T>(ctx, g, src, pl, at, true, off, out);
  return load_quad<T, kRouted>(ctx, g, src, pl, at, false, off, out);
}

// A route kernel's offset of channel d0's delta / ddelta quad (delta_plane) at the quad `at`, whose
// u offset is ud0 (the single-route kernels: ud0 itself).
template <bool kRouted>
SS2D_HD SS2D_INLINE int64_t delta_offset(const Geometry& g, const QuadPlace& at, int d0, int64_t ud0) {
  if constexpr (kRouted) return quad_offset(g, delta_plane<kRouted>(g, d0), at);
  return ud0;
}

// Per quad of the tile, what the first phase worked out for the last at N = 1: the offset of the
// block's first channel in u / delta / dy / du / ddelta (-1: not a vector quad, the last phase
// places it again) and of the round's first state in B / C / dB / dC. A route kernel records the
// quad's anchor instead (ud0: its batch entry, or -1; bc0: its route position), from which the
// last phase works out these offsets and delta's, which lie in other planes than u's, and a
// reversed route's vector shift.
struct QuadRecord {
  int64_t ud0;
  int64_t bc0;
};
constexpr int kQuadRecordWords = 4;
static_assert(kQuadRecordWords * kTileQuads <= kTileFloats, "the records fit into the B tile");

SS2D_HD SS2D_INLINE int quad_index(int r, int c0) { return r * kQuadsPerRow + c0 / kQuad; }

template <class View>
SS2D_HD SS2D_INLINE void write_record(const View& records, int quad, const QuadRecord& rec) {
  const int at = quad * kQuadRecordWords;
  records[at + 0] = static_cast<uint32_t>(static_cast<uint64_t>(rec.ud0));
  records[at + 1] = static_cast<uint32_t>(static_cast<uint64_t>(rec.ud0) >> 32);
  records[at + 2] = static_cast<uint32_t>(static_cast<uint64_t>(rec.bc0));
  records[at + 3] = static_cast<uint32_t>(static_cast<uint64_t>(rec.bc0) >> 32);
}

template <class View>
SS2D_HD SS2D_INLINE QuadRecord read_record(const View& records, int quad) {
  const int at = quad * kQuadRecordWords;
  const auto word = [&](int i) { return static_cast<uint64_t>(static_cast<uint32_t>(records[at + i])); };
  return QuadRecord{static_cast<int64_t>(word(0) | word(1) << 32), static_cast<int64_t>(word(2) | word(3) << 32)};
}

template <class T, class Ctx, class View>
SS2D_HD SS2D_INLINE void park_dt(const Ctx& ctx, const Geometry& g, const View& du, const View& ddelta,
                                 const Plane& pl, const QuadPlace& at, bool vector, int64_t off,
                                 const float (&dt)[kQuad]) {
  if constexpr (sizeof(T) == sizeof(float)) {
    store_quad<T>(ctx, g, ddelta, pl, at, vector, off, dt);
  } else {
    static_assert(2 * sizeof(T) == sizeof(float), "two 2-byte cells hold one fp32 dt");
    if (vector) {
      Vec4<T> first, second;
      memcpy(&first, &dt[0], sizeof(first));
      memcpy(&second, &dt[kQuad / 2], sizeof(second));
      ctx.store_vector(du, off, first);
      ctx.store_vector(ddelta, off, second);
      return;
    }
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) {
      if (!((at.real >> k) & 1u)) continue;
      uint32_t bits;
      memcpy(&bits, &dt[k], sizeof(bits));
      const int64_t cell = cell_offset(g, pl, at, off, k);
      du[cell] = bits_as<T>(static_cast<uint16_t>(bits >> 16));  // scalar fallback
      ddelta[cell] = bits_as<T>(static_cast<uint16_t>(bits & 0xffffu));  // scalar fallback
    }
  }
}

// The dt park_dt left at the quad (0 on padding cells, which it did not touch).
template <class T, class Ctx, class View>
SS2D_HD SS2D_INLINE void unpark_dt(const Ctx& ctx, const Geometry& g, const View& du, const View& ddelta,
                                   const Plane& pl, const QuadPlace& at, bool vector, int64_t off,
                                   float (&dt)[kQuad]) {
  if constexpr (sizeof(T) == sizeof(float)) {
    load_quad<T>(ctx, g, ddelta, pl, at, vector, off, dt);
  } else {
    if (vector) {
      const Vec4<T> first = ctx.load_vector(du, off);
      const Vec4<T> second = ctx.load_vector(ddelta, off);
      memcpy(&dt[0], &first, sizeof(first));
      memcpy(&dt[kQuad / 2], &second, sizeof(second));
      return;
    }
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) {
      dt[k] = 0.f;
      if (!((at.real >> k) & 1u)) continue;
      const int64_t cell = cell_offset(g, pl, at, off, k);
      const uint32_t high = bits_of<T>(du[cell]);  // scalar fallback
      const uint32_t bits = high << 16 | bits_of<T>(ddelta[cell]);  // scalar fallback
      memcpy(&dt[k], &bits, sizeof(bits));
    }
  }
}

// A route kernel's park (N = 1): its du is the fp32 sum over the routes (no cells of the route's
// own), so fp32 dt goes into the route's ddelta cells (its own plane, stored last) and a 2-byte
// type's fp32 dt into the same cells of Params::dt_park (u's layout), a buffer of the launch alone.
// Only the parking thread reads it back; on the vector path off / doff are the vector accesses'
// (with vector_shift), the values in the order the phase holds them. kPark: stores dt there, else
// loads the dt parked at the quad (0 on padding cells).
template <bool kPark, class T, class Ctx, class TView, class FView>
SS2D_HD SS2D_INLINE void move_route_dt(const Ctx& ctx, const Geometry& g, const TView& ddelta, const FView& park,
                                       const Plane& upl, int64_t uoff, const Plane& dpl, int64_t doff,
                                       const QuadPlace& at, bool vector, float (&dt)[kQuad]) {
  const Plane& pl = sizeof(T) == sizeof(float) ? dpl : upl;
  const int64_t off = sizeof(T) == sizeof(float) ? doff : uoff;
  const auto move = [&](const auto& view) {
    if (vector) {
      Vec4<float> v;
      if constexpr (kPark) {
        memcpy(&v, dt, sizeof(v));
        ctx.store_vector(view, off, v);
      } else {
        v = ctx.load_vector(view, off);
        memcpy(dt, &v, sizeof(v));
      }
    } else if constexpr (kPark) {
      store_cells<float, true>(g, view, pl, at, off, dt);
    } else {
      load_cells<float, true>(g, view, pl, at, off, dt);
    }
  };
  if constexpr (sizeof(T) == sizeof(float)) {
    move(ddelta);
  } else {
    move(park);
  }
}

// Backward of one block: the channels of slice `cblock % slices` of group `cblock / slices`,
// `channels` at a time (warp w: channel w / wpc, in round i state i * wpc + w % wpc). Tiles are
// walked in reverse (bottom-right first), or, in the tile-parallel passes, only tile `tile_z` with
// the gradient carries into it from grad_in_v / grad_in_h. Per tile and state round:
//   A (block): the B and C quads of each of the round's states, loaded once for all channels (B
//      into the B tile at N > 1; at N = 1 the tile holds each quad's offsets instead, QuadRecord,
//      and phase B loads B again); per channel (kChannelSlots) dt, u, dy quads (first round; dt into its channel
//      tile at N > 1, else parked in global memory, park_dt / move_route_dt; u and dy too when there are more
//      rounds), and per warp of the channel Abar = exp(dt * A[n]) -- the pass's only exp --,
//      g = dy * C and x = dt * B * u;
//   (barrier) scans (warp w, shared memory only):
//      1. row lanes recompute hh from the saved carry (in place over x; the row is also kept in
//         registers for step 3);
//      2. column lanes recompute h (in place over hh), then the reverse vertical scan
//             gh[r] = dy[r] * C[r] + Abar[r+1] * gh[r+1]      (in place over g);
//      3. row lanes: the reverse horizontal scan
//             ghh[c] = gh[c] + Abar[c+1] * ghh[c+1]            (dL/dx, in place over g)
//         and dL/dAbar * Abar = gh * h[r-1] * Abar + ghh * hh[c-1] * Abar, whose dL/ddt term
//         (times A[n]) replaces Abar and whose dA term (times dt) the lanes sum -- at N = 1, with
//         no dt tile, dL/dAbar * Abar itself replaces Abar and phase B scales it;
//   (barrier) B (block; at N = 1 its vector quads placed by A's records, B loaded again):
//      per state, dB = sum over channels of ghh * dt * u and dC = sum of dy * h,
//      in channel order (the channels one per trip, kChannelSlots; u and dy from their tiles,
//      or with one state round read again from global memory / L2, so that no u / dy tiles take
//      shared memory), added once per cell into the slice's partials (one vector add per quad);
//      per channel the sums over states of ghh * B and of dL/ddt (at N = 1 dt parked by A in the
//      quad's du / ddelta cells, see park_dt, and ddelta's factor sigmoid = exp(z - dt) with
//      delta read again); after the last
//      round du = dt * sum(ghh * B) + D * dy and ddelta are stored and each thread adds its dD /
//      ddelta_bias (at N = 1 also dA) terms.
// Edge passes (kColumnEdges, kRowEdges; see backward_impl) stop after step 2's reverse scan
// (zero carry from below: the carry passed up and the product of Abar down the column) or after
// the reverse horizontal scan from the true carries (zero carry from the right).
template <class T, Variant V, class Ctx>
SS2D_HD void backward_block(Ctx& ctx, const Params& p, int bb, int cblock, int tile_z, char* smem) {
  const Geometry& g = p.g;
  constexpr bool kOne = is_one_state(V);
  constexpr bool kRouted = is_route(V);
  const int nstate = kOne ? 1 : g.nstate;
  const int channels = p.k.bwd_channels;
  const int wpc = kOne ? 1 : p.k.bwd_wpc;
  const int pass = kOne ? static_cast<int>(kSequential) : p.pass;
  // The vertical scans of the full pass: in the one-state variant h's completely and dL/dh's by 16
  // (both completely no longer fit its 128 registers without spilling), else by 8 (the general
  // variant stays below 255 registers).
  constexpr int kScanUnroll = kOne ? kTile : 8;
  constexpr int kReverseScanUnroll = kOne ? kTile / 2 : 8;
  static_assert(kTile % kReverseScanUnroll == 0 && kReverseScanUnroll < 32, "whole blocks, 32-bit shifts");
  // The block phases' channel loops: rolled in the general variant (one copy of the accesses), in
  // the one-state variant unrolled over up to kMaxWarps channels (the model plan's 4), so that
  // address arithmetic and per-channel selections fold at compile time.
  constexpr int kChannelSlots = kOne ? kMaxWarps : 1;
  const int nwarps = channels * wpc;
  const int nthreads = ctx.nthreads();
  const int rounds = state_rounds(nstate, wpc);
  const BackwardLayout l = backward_layout(channels, wpc, nstate);
  const int channel_floats = channels * kTileFloats;
  // u and dy stay on chip only when several state rounds use them, dt only at N > 1 (see
  // backward_layout); else the last phase reads them again (and dt from where the first parked it).
  const bool keep_inputs = rounds > 1;
  const bool keep_dt = !kOne && backward_keeps_dt(nstate);
  const int carried_floats = keep_inputs ? channel_floats : 0;
  auto dt_t = ctx.template shared<float>(smem, l.dt, keep_dt ? channel_floats : 0);
  auto u_t = ctx.template shared<float>(smem, l.u, carried_floats);
  auto dy_t = ctx.template shared<float>(smem, l.dy, carried_floats);
  auto sumb_t = ctx.template shared<float>(smem, l.sum_b, carried_floats);
  auto ddt_t = ctx.template shared<float>(smem, l.ddt, carried_floats);
  // At N = 1 (no dt tile) the last phase loads B again (once per quad for all channels, from L2)
  // and the B tile holds instead, per quad, the offsets the first phase worked out there
  // (QuadRecord): the last phase does not place its quads again.
  const bool records = !keep_dt;
  auto b_t = ctx.template shared<float>(smem, l.b, records ? 0 : wpc * kTileFloats);
  auto record_t = ctx.template shared<uint32_t>(smem, l.b, records ? kQuadRecordWords * kTileQuads : 0);
  auto warp_t = ctx.template shared<float>(smem, l.warp, kBackwardWarpTiles * nwarps * kTileFloats);
  auto hcar = ctx.template shared<float>(smem, l.hcar, channels * nstate * kTile);
  auto dA_s = ctx.template shared<float>(smem, l.dA, channels * nstate);
  auto lane_s = ctx.template shared<float>(smem, l.lane, nwarps * kTile);
  auto top_s = ctx.template shared<float>(smem, l.top, nwarps * kTile);
  // The channel set's delta_bias, D and A, written once per set: the block phases read them from
  // shared memory instead of global memory per quad and channel (with a null test for the optional
  // ones).
  constexpr int kConsts = kBackwardChannelConsts;
  auto consts = ctx.template shared<float>(smem, l.consts, channels * (kConsts + nstate));
  const auto bias_of = [&](int s) { return static_cast<float>(consts[s * (kConsts + nstate)]); };
  const auto dskip_of = [&](int s) { return static_cast<float>(consts[s * (kConsts + nstate) + 1]); };
  const auto a_of = [&](int s, int n) { return static_cast<float>(consts[s * (kConsts + nstate) + kConsts + n]); };
  const int64_t n_ud = ud_numel(g), n_bc = bc_numel(g);
  auto u = ctx.global(static_cast<const T*>(p.u), n_ud);
  const int64_t n_delta = kRouted ? route_delta_numel(g) : n_ud;
  const int64_t n_bc_at = kRouted ? route_bc_numel(g) : n_bc;  // from the launch's B / C pointers
  auto delta = ctx.global(static_cast<const T*>(p.delta), n_delta);
  auto Bg = ctx.global(static_cast<const T*>(p.B), n_bc_at);
  auto Cg = ctx.global(static_cast<const T*>(p.C), n_bc_at);
  // An fp32 dy (with fp32 inputs and in route kernels always) through the fp32 view: one copy of
  // its accesses.
  const bool dy_fp32 = std::is_same_v<T, float> || kRouted || p.dy_fp32;
  auto dy32 = ctx.global(static_cast<const float*>(dy_fp32 ? p.dy : nullptr), n_ud);
  auto dyT = ctx.global(static_cast<const T*>(dy_fp32 ? nullptr : p.dy), n_ud);
  // dy's type as a compile-time choice made once per quad (std::true_type: fp32), so that each copy
  // of a block phase carries the accesses of one dy view instead of both, predicated.
  const auto with_dy_type = [&](auto&& f) {
    if (dy_fp32) {
      f(std::true_type{});
    } else if constexpr (!std::is_same_v<T, float> && !kRouted) {
      f(std::false_type{});
    }
  };
  // A reversed route's vector quad holds the quad's cells in map order, the mirror of their route
  // order: its block phases take the values so (no element swaps, the accesses at vector_shift) and
  // mirror the quad's tile columns instead (std::true_type: mirrored, known at compile time, so the
  // vector copy of a phase is compiled once per order).
  const auto with_mirror = [&](auto&& f) {
    if constexpr (kRouted) {
      if (g.route.reversed) {
        f(std::true_type{});
        return;
      }
    }
    f(std::false_type{});
  };
  // A route kernel's du is the fp32 sum over routes (du32); the single-route kernels' du_g.
  auto du_g = ctx.global(static_cast<T*>(kRouted ? nullptr : p.du), kRouted ? 0 : n_ud);
  auto du32 = ctx.global(static_cast<float*>(kRouted ? p.du : nullptr), kRouted ? n_ud : 0);
  auto ddelta_g = ctx.global(static_cast<T*>(p.ddelta), n_delta);
  const int slices = p.k.slices;
  const int slice = cblock % slices;
  const int group = cblock / slices;
  const GroupPlanes bc_planes = kRouted ? GroupPlanes{g.route.bc_planes, 0} : group_planes(g, group);
  const bool sequential = pass == kSequential;
  const bool full = sequential || pass == kFinal;
  // Where a route kernel with 2-byte inputs parks dt at N = 1 (move_route_dt).
  constexpr bool kParkBuffer = kRouted && sizeof(T) != sizeof(float);
  auto dt_park = ctx.global(kParkBuffer ? p.dt_park : nullptr, kParkBuffer && full && !keep_dt ? n_ud : 0);
  // The slice's partials ([slices][batch][groups][N][L]; on a route kernel [slices][batch][routes]
  // [N][L] from the route's first plane on).
  const int64_t slice_floats = kRouted ? static_cast<int64_t>(g.batch) * g.route.bc_planes * g.length : n_bc;
  auto dB = ctx.global(full ? p.dB_part + slice * slice_floats : nullptr, full ? n_bc_at : 0);
  auto dC = ctx.global(full ? p.dC_part + slice * slice_floats : nullptr, full ? n_bc_at : 0);
  const int64_t part_rows = full ? maps(g) * (sequential ? 1 : g.tiles_h * g.tiles_w) : 0;
  auto dA_part = ctx.global(p.dA_part, part_rows * nstate);
  auto dD_part = ctx.global(p.dD_part, part_rows);
  auto ddb_part = ctx.global(p.ddb_part, part_rows);
  const int tiles = g.tiles_h * g.tiles_w;
  const int64_t carries = carry_numel(g, true);
  auto carry_v = ctx.global(p.carry_v, full && tiles > 1 ? carries : 0);
  auto carry_h = ctx.global(p.carry_h, full && tiles > 1 ? carries : 0);
  auto gcarry_v = ctx.global(p.grad_carry_v, tiles > 1 && sequential ? grad_carry_numel(g) : 0);
  auto gin_v = ctx.global(p.grad_in_v, sequential ? 0 : carries);
  auto gin_h = ctx.global(p.grad_in_h, sequential ? 0 : carries);
  auto edge = ctx.global(p.edge, full ? 0 : carries);
  auto prod = ctx.global(p.prod, full ? 0 : carries);
  const uint32_t starts_h = segment_starts(g.seg_h);
  const uint32_t starts_w = segment_starts(g.seg_w);
  const int per_slice = g.dim / g.groups / slices;
  // One decision per quad for all the planes a block phase accesses there: vector accesses when
  // every plane is aligned at its start and the quad is one aligned map row (tested per quad:
  // a block-wide flag would take a register the one-state variant does not have).
  const auto vector_at = [&](bool one_map_row, int64_t pos) {
    return one_map_row && pos % kQuad == 0 && (!kRouted || g.route.linear) &&
           vector_planes(ctx, g, u, delta, Bg, Cg) &&
           (dy_fp32 ? vector_planes(ctx, g, dy32) : vector_planes(ctx, g, dyT)) &&
           (!full || (kRouted ? vector_planes(ctx, g, du32, ddelta_g, dB, dC) &&
                                    (!kParkBuffer || keep_dt || vector_planes(ctx, g, dt_park))
                              : vector_planes(ctx, g, du_g, ddelta_g, dB, dC)));
  };
  // Per thread and channel: its share of dD (sum of dy * u), of ddelta_bias (sum of ddelta) and,
  // where dt is not kept (N = 1), of dA (sum of dL/dAbar * Abar * dt).
  constexpr int kParts = 3;
  float part[Ctx::kThreadSlots][kParts][kMaxWarps];

  // The slice's channel sets: channels d0 .. d0 + channels - 1 each.
  const int first_channel = group * (g.dim / g.groups) + slice * per_slice;
  for (int d0 = first_channel; d0 < first_channel + per_slice; d0 += channels) {
    ctx.each_thread([&](int t) {
      if (t >= channels) return;  // thread s: channel s
      const int at = t * (kConsts + nstate);
      const int d = d0 + t;
      consts[at] = p.delta_bias ? p.delta_bias[d] : 0.f;
      consts[at + 1] = p.D ? p.D[d] : 0.f;
      for (int n = 0; n < nstate; ++n) consts[at + kConsts + n] = p.A[static_cast<int64_t>(d) * nstate + n];
    });
    ctx.barrier();  // also orders the previous set's last use of the tiles before this set's first
    if (full) {
      ctx.each_thread([&](int t) {
        if (keep_dt) {
          for (int i = t; i < channels * nstate; i += nthreads) dA_s[i] = 0.f;
        }
SS2D_UNROLL
        for (int i = 0; i < kParts; ++i) {
SS2D_UNROLL
          for (int s = 0; s < kMaxWarps; ++s) part[ctx.thread_slot(t)][i][s] = 0.f;
        }
      });
    }
    for (int tile = sequential ? tiles - 1 : tile_z; tile >= (sequential ? 0 : tile_z); --tile) {
      const int ti = tile / g.tiles_w;
      const int tj = tile - ti * g.tiles_w;
      for (int round = 0; round < rounds; ++round) {
        each_quad(ctx, [&](int, int r, int c0) {
          // Placed by its anchor (quad_anchor: the first cell and a whole-row test, no per-cell
          // work); quad_place only off the vector path.
          const QuadAnchor an = quad_anchor(g, bb, ti, tj, r, c0);
          const int64_t ud0 = quad_offset(g, Plane{g.dim, d0}, an);
          // B / C offset of the round's first state (the others follow plane by plane).
          const int64_t bc0 = quad_offset(g, bc_planes(round * wpc), an);
          const bool vector = vector_at(an.whole, an.pos);
          if (full && records) {
            const QuadRecord rec =
                kRouted ? QuadRecord{vector ? an.batch : -1, an.pos} : QuadRecord{vector ? ud0 : -1, bc0};
            write_record(record_t, quad_index(r, c0), rec);
          }
          // As in phase B: vector and per-cell copies, one branch per quad.
          const auto phase = [&](auto vector, const QuadPlace& at, auto dy_is_fp32, auto mirrored) {
            constexpr bool vec = decltype(vector)::value;
            constexpr bool kCells = kRouted && !vec;  // per-cell route addressing (place<true>)
            // Element k's tile column, and the vector accesses' shift (with_mirror).
            const auto col = [&](int k) { return decltype(mirrored)::value ? c0 + kQuad - 1 - k : c0 + k; };
            const int64_t vs = decltype(mirrored)::value ? vector_shift(g, at) : 0;
            // From a channel's u offset to its delta / ddelta offset (route kernels; 0 otherwise).
            const int64_t to_delta = delta_offset<kRouted>(g, at, d0, ud0) - ud0;
            // The C (and B) quads of the round's states, loaded once for all channels (registers
            // indexed by unrolled loops: no local memory).
            float bq[kMaxWarps][kQuad], cq[kMaxWarps][kQuad];
SS2D_UNROLL
            for (int j = 0; j < kMaxWarps; ++j) {
              const int n = round * wpc + j;
              if (j >= wpc || n >= nstate) continue;
              const Plane bpl = bc_planes(n);
              const int64_t bc_off = bc0 + j * g.length;
              load_input_quad<T, kCells>(ctx, g, Cg, bpl, at, vec, bc_off + vs, cq[j]);
              if (full) {
                load_input_quad<T, kCells>(ctx, g, Bg, bpl, at, vec, bc_off + vs, bq[j]);
                if (!records) {
SS2D_UNROLL
                  for (int k = 0; k < kQuad; ++k) b_t[j * kTileFloats + tile_offset(r, col(k))] = bq[j][k];
                }
              }
            }
            // One channel per trip (kChannelSlots).
SS2D_UNROLL_BY(kChannelSlots)
            for (int s = 0; s < (kOne ? kMaxWarps : channels); ++s) {
              if (s >= channels) continue;
              float dt[kQuad], uq[kQuad] = {0.f, 0.f, 0.f, 0.f}, dyq[kQuad];
              if (round == 0) {
                const int d = d0 + s;
                const Plane pl{g.dim, d};
                const int64_t off = ud0 + s * g.length + vs;
                const Plane dpl = delta_plane<kRouted>(g, d);
                const int64_t doff = off + to_delta;
                float dq[kQuad];
                const uint32_t real = load_input_quad<T, kCells>(ctx, g, delta, dpl, at, vec, doff, dq);
                if (full) load_input_quad<T, kCells>(ctx, g, u, pl, at, vec, off, uq);
                if constexpr (decltype(dy_is_fp32)::value) {
                  load_input_quad<float, kCells>(ctx, g, dy32, pl, at, vec, off, dyq);
                } else {
                  load_input_quad<T, kCells>(ctx, g, dyT, pl, at, vec, off, dyq);
                }
                const float bias = bias_of(s);
SS2D_UNROLL
                for (int k = 0; k < kQuad; ++k) {
                  const int e = s * kTileFloats + tile_offset(r, col(k));
                  dt[k] = dt_of(p, dq[k], bias, (real >> k) & 1u);
                  if (keep_dt) dt_t[e] = dt[k];
                  if (keep_inputs) {
                    if (full) u_t[e] = uq[k];
                    dy_t[e] = dyq[k];
                  }
                }
                if (full && !keep_dt) {
                  if constexpr (kRouted) {
                    move_route_dt<true, T>(ctx, g, ddelta_g, dt_park, pl, off, dpl, doff, at, vec, dt);
                  } else {
                    park_dt<T>(ctx, g, du_g, ddelta_g, pl, at, vec, off, dt);
                  }
                }
              } else {
SS2D_UNROLL
                for (int k = 0; k < kQuad; ++k) {
                  const int e = s * kTileFloats + tile_offset(r, col(k));
                  dt[k] = dt_t[e];
                  if (full) uq[k] = u_t[e];
                  dyq[k] = dy_t[e];
                }
              }
SS2D_UNROLL
              for (int j = 0; j < kMaxWarps; ++j) {
                const int n = round * wpc + j;
                if (j >= wpc || n >= nstate) continue;
                const int w = s * wpc + j;
                const float a2 = a_of(s, n) * kLog2e;
SS2D_UNROLL
                for (int k = 0; k < kQuad; ++k) {
                  const int e = tile_offset(r, col(k));
                  warp_t[(w * kBackwardWarpTiles + 0) * kTileFloats + e] = exp2_flush(dt[k] * a2);  // as the forward
                  warp_t[(w * kBackwardWarpTiles + 2) * kTileFloats + e] = dyq[k] * cq[j][k];
                  if (full) warp_t[(w * kBackwardWarpTiles + 1) * kTileFloats + e] = dt[k] * uq[k] * bq[j][k];
                }
              }
            }
          };
          with_dy_type([&](auto dy_is_fp32) {
            if (vector) {
              with_mirror([&](auto mirrored) { phase(std::true_type{}, whole_quad(an), dy_is_fp32, mirrored); });
            } else {
              phase(std::false_type{}, place<kRouted>(g, bb, ti, tj, r, c0), dy_is_fp32, std::false_type{});
            }
          });
        });
        ctx.barrier();
        ctx.each_warp([&](int w) {
          const WarpTask task = warp_task(g, nstate, bb, d0, wpc, round, w);
          if (!task.active) return;
          const int s = task.channel, n = task.state;
          const int64_t map = task.map;
          auto abar = warp_t + (w * kBackwardWarpTiles + 0) * kTileFloats;  // Abar, then dL/ddt term
          auto hv = warp_t + (w * kBackwardWarpTiles + 1) * kTileFloats;    // x, hh, then h
          auto gv = warp_t + (w * kBackwardWarpTiles + 2) * kTileFloats;    // dy * C, gh, then ghh
          if (!full) {
            ctx.each_lane([&](int c) {
              const int64_t at = carry_index(map, tiles, tile, nstate, n, c);
              float gnext = pass == kColumnEdges ? 0.f : static_cast<float>(gin_v[at]);
              float decay = 1.f;
SS2D_UNROLL_BY(8)
              for (int r = kTile - 1; r >= 0; --r) {
                if (r + 1 < kTile && ((starts_h >> (r + 1)) & 1u)) gnext = decay = 0.f;
                const int e = tile_offset(r, c);
                const float a = abar[e];
                const float gh = gv[e] + gnext;
                gv[e] = gh;
                gnext = a * gh;
                decay *= a;
              }
              if (pass == kColumnEdges) {
                edge[at] = gnext;
                prod[at] = decay;
              }
            });
            if (pass == kColumnEdges) return;
            ctx.sync_warp();
            ctx.each_lane([&](int r) {
              float gnext = 0.f;
              float decay = 1.f;
SS2D_UNROLL_BY(8)
              for (int c = kTile - 1; c >= 0; --c) {
                if (c + 1 < kTile && ((starts_w >> (c + 1)) & 1u)) gnext = decay = 0.f;
                const int e = tile_offset(r, c);
                const float a = abar[e];
                gnext = a * (gv[e] + gnext);
                decay *= a;
              }
              const int64_t at = carry_index(map, tiles, tile, nstate, n, r);
              edge[at] = gnext;
              prod[at] = decay;
            });
            return;
          }
          auto dts = dt_t + (keep_dt ? s * kTileFloats : 0);
          auto top = top_s + w * kTile;
          auto lane_dA = lane_s + w * kTile;
          // The tile's carries in (lane k: row / column k), recorded by the forward.
          const int64_t carry0 = carry_index(map, tiles, tile, nstate, n, 0);
          float hh_row[Ctx::kLaneSlots][kTile];
          float h_in_row[Ctx::kLaneSlots];
          ctx.each_lane([&](int r) {
            float h = tiles > 1 ? static_cast<float>(carry_h[carry0 + r]) : 0.f;
            h_in_row[ctx.lane_slot(r)] = h;
            float* hrow = hh_row[ctx.lane_slot(r)];
SS2D_UNROLL
            for (int c = 0; c < kTile; ++c) {
              if ((starts_w >> c) & 1u) h = 0.f;
              const int e = tile_offset(r, c);
              h = abar[e] * h + hv[e];
              hv[e] = h;
              hrow[c] = h;
            }
          });
          ctx.sync_warp();
          ctx.each_lane([&](int c) {
            const float v_in = tiles > 1 ? static_cast<float>(carry_v[carry0 + c]) : 0.f;
            float v = v_in;
SS2D_UNROLL_BY(kScanUnroll)
            for (int r = 0; r < kTile; ++r) {
              if ((starts_h >> r) & 1u) v = 0.f;
              const int e = tile_offset(r, c);
              v = abar[e] * v + hv[e];
              hv[e] = v;
            }
            const int64_t gslot = carry_index(map, g.tiles_w, tj, nstate, n, c);
            float gnext = 0.f;
            if (!sequential) {
              gnext = gin_v[carry0 + c];
            } else if (ti + 1 < g.tiles_h) {
              gnext = gcarry_v[gslot];
            }
            float gh = 0.f;
            // In blocks of rows, the last first, each testing constant bits of its own shifted copy
            // of the segment starts (bit i + 1: row r0 + i + 1 starts a map; zero past the tile).
SS2D_UNROLL_BY(1)
            for (int r0 = kTile - kReverseScanUnroll; r0 >= 0; r0 -= kReverseScanUnroll) {
              const uint32_t starts = starts_h >> r0;
SS2D_UNROLL
              for (int i = kReverseScanUnroll - 1; i >= 0; --i) {
                if ((starts >> (i + 1)) & 1u) gnext = 0.f;
                const int e = tile_offset(r0 + i, c);
                gh = gv[e] + gnext;
                gv[e] = gh;
                gnext = abar[e] * gh;
              }
            }
            top[c] = v_in;
            if (sequential && ti > 0) gcarry_v[gslot] = gnext;
          });
          ctx.sync_warp();
          ctx.each_lane([&](int r) {
            const float a_n = keep_dt ? a_of(s, n) : 0.f;
            const float h_in = h_in_row[ctx.lane_slot(r)];
            float gnext = 0.f;
            if (!sequential) {
              gnext = gin_h[carry0 + r];
            } else if (tj + 1 < g.tiles_w) {
              gnext = hcar[(s * nstate + n) * kTile + r];
            }
            // dL/dAbar * Abar = (gh * h_above + ghh * hh_left) * Abar: h_above from the row above, in
            // the tile's first row from the tile above (top), none in the first row of a packed map;
            // hh_left none in a packed map's first column. The lane's row-start flag is worked out
            // here (starts_map_row): hoisted out of the tile loop it stayed live through every phase
            // and spilled in the fp32 one-state variants (sm_80 to sm_90, at their 128 registers).
            const bool map_top = starts_map_row<true>(g, starts_h, r);
            const auto above = r == 0 ? top : hv + (r - 1) * kStride;
            const float* hrow = hh_row[ctx.lane_slot(r)];
            float dA_lane = 0.f;
SS2D_UNROLL
            for (int c = kTile - 1; c >= 0; --c) {
              if (c + 1 < kTile && ((starts_w >> (c + 1)) & 1u)) gnext = 0.f;
              const int e = tile_offset(r, c);
              const float a = abar[e];
              const float gh = gv[e];
              const float ghh = gh + gnext;
              const float hh_left = c == 0 ? h_in : (((starts_w >> c) & 1u) ? 0.f : hrow[c - 1]);
              const float h_above = map_top ? 0.f : static_cast<float>(above[c]);
              const float dabar = fmaf(gh, h_above, ghh * hh_left) * a;
              gv[e] = ghh;
              if (keep_dt) {
                abar[e] = dabar * a_n;
                dA_lane += dabar * dts[e];
              } else {
                abar[e] = dabar;
              }
              gnext = a * ghh;
            }
            if (sequential) hcar[(s * nstate + n) * kTile + r] = gnext;
            if (keep_dt) lane_dA[r] = dA_lane;
          });
          if (!keep_dt) return;
          ctx.sync_warp();
          ctx.each_lane([&](int lane) {
            if (lane != 0) return;
            float total = 0.f;
SS2D_UNROLL
            for (int i = 0; i < kTile; ++i) total += lane_dA[i];
            dA_s[s * nstate + n] += total;
          });
        });
        if (!full) {
          if (round + 1 < rounds) ctx.barrier();  // the next round's A rewrites the warp tiles
          continue;
        }
        ctx.barrier();
        const bool last = round + 1 == rounds;
        each_quad(ctx, [&](int t, int r, int c0) {
          // The phase in two copies, vector and per-cell accesses for all of the quad's planes:
          // one branch per quad (at: unused on the single-route kernels' vector path).
          const auto phase = [&](auto vector, const QuadPlace& at, int64_t ud0, int64_t bc0, auto dy_is_fp32,
                                 auto mirrored) {
            constexpr bool vec = decltype(vector)::value;
            constexpr bool kCells = kRouted && !vec;  // as in the first phase
            const auto col = [&](int k) { return decltype(mirrored)::value ? c0 + kQuad - 1 - k : c0 + k; };
            const int64_t vs = decltype(mirrored)::value ? vector_shift(g, at) : 0;
            // From a channel's u offset to its delta / ddelta offset (route kernels; 0 otherwise).
            const int64_t to_delta = delta_offset<kRouted>(g, at, d0, ud0) - ud0;
            // B of the round's states: from the B tile, or at N = 1 loaded again.
            float bq[kMaxWarps][kQuad];
            if (records) {
SS2D_UNROLL
              for (int j = 0; j < kMaxWarps; ++j) {
                const int n = round * wpc + j;
                if (j >= wpc || n >= nstate) continue;
                load_input_quad<T, kCells>(ctx, g, Bg, bc_planes(n), at, vec, bc0 + j * g.length + vs, bq[j]);
              }
            }
            // Per-state dB / dC sums over the channels, in registers indexed by unrolled loops (no
            // local memory); the channels one per trip (kChannelSlots).
            float db[kMaxWarps][kQuad], dc[kMaxWarps][kQuad];
SS2D_UNROLL
            for (int j = 0; j < kMaxWarps; ++j) {
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) db[j][k] = dc[j][k] = 0.f;
            }
SS2D_UNROLL_BY(kRouted && !vec ? 1 : kChannelSlots)
            for (int s = 0; s < (kOne ? kMaxWarps : channels); ++s) {
              if (s >= channels) continue;
              const Plane pl{g.dim, d0 + s};
              const int64_t off = ud0 + s * g.length + vs;
              const Plane dpl = delta_plane<kRouted>(g, d0 + s);
              const int64_t doff = off + to_delta;
              // u and dy: kept on chip with several rounds, else read again (from L2: the block read
              // them in this tile's first phase), which leaves room for a third block per SM.
              float uq[kQuad], dyq[kQuad];
              if (keep_inputs) {
SS2D_UNROLL
                for (int k = 0; k < kQuad; ++k) {
                  const int ce = s * kTileFloats + tile_offset(r, col(k));
                  uq[k] = u_t[ce];
                  dyq[k] = dy_t[ce];
                }
              } else {
                load_input_quad<T, kCells>(ctx, g, u, pl, at, vec, off, uq);
                if constexpr (decltype(dy_is_fp32)::value) {
                  load_input_quad<float, kCells>(ctx, g, dy32, pl, at, vec, off, dyq);
                } else {
                  load_input_quad<T, kCells>(ctx, g, dyT, pl, at, vec, off, dyq);
                }
              }
              // dt and, with softplus, d dt / d(delta + bias) (0 on padding cells): from the dt tile,
              // or parked by the first phase (sigmoid from it and delta read again).
              float dtq[kQuad], slope[kQuad];
              if (keep_dt) {
SS2D_UNROLL
                for (int k = 0; k < kQuad; ++k) {
                  dtq[k] = dt_t[s * kTileFloats + tile_offset(r, col(k))];
                  slope[k] = p.softplus ? softplus_grad_from_value(dtq[k]) : 1.f;
                }
              } else {
                float dq[kQuad];
                const uint32_t real = load_input_quad<T, kCells>(ctx, g, delta, dpl, at, vec, doff, dq);
                if constexpr (kRouted) {
                  move_route_dt<false, T>(ctx, g, ddelta_g, dt_park, pl, off, dpl, doff, at, vec, dtq);
                } else {
                  unpark_dt<T>(ctx, g, du_g, ddelta_g, pl, at, vec, off, dtq);
                }
                const float bias = bias_of(s);
SS2D_UNROLL
                for (int k = 0; k < kQuad; ++k) {
                  const bool is_real = (real >> k) & 1u;
                  // Evaluated on every cell and then selected: no branch around the exp.
                  const float sg = sigmoid_from_softplus(dq[k] + bias, dtq[k]);
                  slope[k] = is_real ? sg : 0.f;
                }
              }
              // The sums over states so far: from the earlier rounds' tiles, else set by the round's
              // first state (no adds to 0).
              float sumb[kQuad], ddt[kQuad], dA_terms = 0.f;
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const int ce = s * kTileFloats + tile_offset(r, col(k));
                sumb[k] = round > 0 ? static_cast<float>(sumb_t[ce]) : 0.f;
                ddt[k] = round > 0 ? static_cast<float>(ddt_t[ce]) : 0.f;
              }
SS2D_UNROLL
              for (int j = 0; j < kMaxWarps; ++j) {
                const int n = round * wpc + j;
                if (j >= wpc || n >= nstate) continue;
                const int w = s * wpc + j;
                // Without a dt tile the warps left dL/dAbar * Abar, scaled here (by A[n]: the dL/ddt
                // term; by dt: the dA terms).
                const float a_n = keep_dt ? 1.f : a_of(s, n);
SS2D_UNROLL
                for (int k = 0; k < kQuad; ++k) {
                  const int e = tile_offset(r, col(k));
                  const float ghh = warp_t[(w * kBackwardWarpTiles + 2) * kTileFloats + e];
                  const float uv = uq[k];
                  const float bv = records ? bq[j][k] : static_cast<float>(b_t[j * kTileFloats + e]);
                  const float dabar = warp_t[(w * kBackwardWarpTiles + 0) * kTileFloats + e];
                  db[j][k] += ghh * dtq[k] * uv;
                  dc[j][k] += dyq[k] * warp_t[(w * kBackwardWarpTiles + 1) * kTileFloats + e];
                  const float ghh_b = ghh * bv;
                  const float state_ddt = (keep_dt ? dabar : dabar * a_n) + ghh_b * uv;
                  const bool first = round == 0 && j == 0;
                  sumb[k] = first ? ghh_b : sumb[k] + ghh_b;
                  ddt[k] = first ? state_ddt : ddt[k] + state_ddt;
                  if (!keep_dt) dA_terms += dabar * dtq[k];
                }
              }
              if (!last) {
SS2D_UNROLL
                for (int k = 0; k < kQuad; ++k) {
                  const int ce = s * kTileFloats + tile_offset(r, col(k));
                  sumb_t[ce] = sumb[k];
                  ddt_t[ce] = ddt[k];
                }
                continue;
              }
              // Padding cells: dy = u = 0 and no gradient reaches them, so their terms are 0; their
              // du / ddelta are not stored.
              const float dskip = dskip_of(s);
              float duq[kQuad], ddq[kQuad];
              float dD_terms = 0.f, ddb_terms = 0.f;
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const float dt = dtq[k];
                const float dyv = dyq[k];
                duq[k] = dt * sumb[k] + dskip * dyv;
                ddq[k] = p.softplus ? ddt[k] * slope[k] : ddt[k];
                dD_terms += dyv * uq[k];
                ddb_terms += ddq[k];
              }
              // The thread's shares of channel s (selected, not indexed at run time: no local memory).
SS2D_UNROLL
              for (int i = 0; i < kMaxWarps; ++i) {
                if (i != s) continue;
                part[ctx.thread_slot(t)][0][i] += dD_terms;
                part[ctx.thread_slot(t)][1][i] += ddb_terms;
                part[ctx.thread_slot(t)][2][i] += dA_terms;
              }
              if constexpr (kRouted) {
                if (g.route.accumulate) {
                  add_quad<kCells>(ctx, g, du32, pl, at, vec, off, duq);  // the earlier routes' sum
                } else {
                  store_quad<float, kCells>(ctx, g, du32, pl, at, vec, off, duq);
                }
                store_quad<T, kCells>(ctx, g, ddelta_g, dpl, at, vec, doff, ddq);
              } else {
                store_quad<T>(ctx, g, du_g, pl, at, vec, off, duq);
                store_quad<T>(ctx, g, ddelta_g, pl, at, vec, off, ddq);
              }
            }
SS2D_UNROLL
            for (int j = 0; j < kMaxWarps; ++j) {
              const int n = round * wpc + j;
              if (j >= wpc || n >= nstate) continue;
              const Plane bpl = bc_planes(n);
              const int64_t bc_off = bc0 + j * g.length + vs;
              add_quad<kCells>(ctx, g, dB, bpl, at, vec, bc_off, db[j]);
              add_quad<kCells>(ctx, g, dC, bpl, at, vec, bc_off, dc[j]);
            }
          };
          with_dy_type([&](auto dy_is_fp32) {
            if (records) {
              const QuadRecord rec = read_record(record_t, quad_index(r, c0));
              if constexpr (kRouted) {
                if (rec.ud0 >= 0) {  // the anchor of a vector quad
                  const QuadAnchor an{rec.ud0, rec.bc0, true};
                  with_mirror([&](auto mirrored) {
                    phase(std::true_type{}, whole_quad(an), quad_offset(g, Plane{g.dim, d0}, an),
                          quad_offset(g, bc_planes(round * wpc), an), dy_is_fp32, mirrored);
                  });
                  return;
                }
              } else if (rec.ud0 >= 0) {
                phase(std::true_type{}, QuadPlace{}, rec.ud0, rec.bc0, dy_is_fp32, std::false_type{});
                return;
              }
            }
            const QuadPlace at = place<kRouted>(g, bb, ti, tj, r, c0);
            const int64_t ud0 = quad_offset(g, Plane{g.dim, d0}, at);
            const int64_t bc0 = quad_offset(g, bc_planes(round * wpc), at);
            if (!records && vector_at(one_row(at), at.pos)) {
              with_mirror([&](auto mirrored) { phase(std::true_type{}, at, ud0, bc0, dy_is_fp32, mirrored); });
            } else {
              phase(std::false_type{}, at, ud0, bc0, dy_is_fp32, std::false_type{});
            }
          });
        });
        // No barrier: the next round's (or tile's) A rewrites only cells this thread itself read.
      }
    }
    if (full) {
      // dD / ddelta_bias (/ dA without a dt tile): the threads' shares summed in thread order (the
      // warp tiles are free now).
      ctx.barrier();
      const int nparts = keep_dt ? 2 : kParts;
      auto red = ctx.template shared<float>(smem, l.warp, nparts * channels * nthreads);
      ctx.each_thread([&](int t) {
SS2D_UNROLL
        for (int i = 0; i < kParts; ++i) {
SS2D_UNROLL
          for (int s = 0; s < kMaxWarps; ++s) {
            if (i >= nparts || s >= channels) continue;
            red[(i * channels + s) * nthreads + t] = part[ctx.thread_slot(t)][i][s];
          }
        }
      });
      ctx.barrier();
      ctx.each_thread([&](int t) {
        if (t >= channels) return;
        float sums[kParts] = {0.f, 0.f, 0.f};
        for (int i = 0; i < nthreads; ++i) {
SS2D_UNROLL
          for (int j = 0; j < kParts; ++j) {
            if (j < nparts) sums[j] += red[(j * channels + t) * nthreads + i];
          }
        }
        const int64_t map = static_cast<int64_t>(bb) * g.dim + d0 + t;
        const int64_t row = (sequential ? 0 : tile_z) * maps(g) + map;
        dD_part[row] = sums[0];
        ddb_part[row] = sums[1];
        if (keep_dt) {
          for (int n = 0; n < nstate; ++n) dA_part[row * nstate + n] = dA_s[t * nstate + n];
        } else {
          dA_part[row] = sums[2];
        }
      });
    }
  }
}

}  // namespace scan2d
}  // namespace vmamba2d
