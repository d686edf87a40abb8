// The forward block of the tiled 2D scan (contexts and rules: scan2d_tile.cuh).
#pragma once

#include <algorithm>
#include <array>
#include <stdexcept>
#include <type_traits>

#include "scan2d_tile.cuh"

namespace vmamba2d {
namespace scan2d {

// A cell's float in a forward tile: row r holds its kQuadsPerRow quads in the order quad ^ (r mod 8)
// (an XOR swizzle). A quad stays 4 consecutive floats, 16-byte aligned; the 8 lanes of a 16-byte
// access phase touch 8 different quad slots whether they take the 8 quads of one row (block phases)
// or quad q of 8 consecutive rows (a lane per row), and a warp taking cell c of one row reads each
// bank once (lane per column): no bank conflicts without padding.
SS2D_HD SS2D_INLINE int fwd_swizzle(int r) { return (r & (kQuadsPerRow - 1)) * kQuad; }
SS2D_HD SS2D_INLINE int fwd_offset(int r, int c) { return r * kTile + (c ^ fwd_swizzle(r)); }

// The quad of floats at off .. off + kQuad - 1 of a forward shared tile (off a multiple of kQuad:
// 16-byte aligned, the tiles start 16-byte aligned): one 16-byte access on the GPU, one per float
// on the host, where the race detector sees each.
template <class View>
SS2D_HD SS2D_INLINE void load_shared4(const View& tile, int off, float (&out)[kQuad]) {
#ifdef __CUDA_ARCH__
  tile.load4(off, out);
#else
  if (off % kQuad != 0) throw std::logic_error("misaligned 16-byte shared access");
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) out[k] = tile[off + k];
#endif
}

template <class View>
SS2D_HD SS2D_INLINE void store_shared4(const View& tile, int off, const float (&in)[kQuad]) {
#ifdef __CUDA_ARCH__
  tile.store4(off, in);
#else
  if (off % kQuad != 0) throw std::logic_error("misaligned 16-byte shared access");
SS2D_UNROLL
  for (int k = 0; k < kQuad; ++k) tile[off + k] = in[k];
#endif
}

// Whether tile row r starts a map other than the tile's first (packed maps: r a nonzero multiple
// of seg_h), worked out where it is used: on the GPU a volatile asm, which ptxas may not hoist out
// of the tile loop (hoisted, the lane's flag stays live through the loop's load phase and spills
// there). Two forms: bit r of the mask of such rows (starts, kept in a register), or the test on r
// itself from seg_h / magic_h (kernel parameters: no register kept). Which of them leaves every
// instantiation without spills is ptxas's register allocation: kMask (the fp32 kGeneral and kRoute
// kernels, and the fp32 kOneStateSequential compiled for a register-carry arch) the mask, the
// others the test (the fp32 kOneStateSequential spilled the mask on sm_80 at its 80 registers, and
// spills in the test on sm_86 / sm_89).
template <bool kMask>
SS2D_HD SS2D_INLINE bool starts_map_row(const Geometry& g, uint32_t starts, int r) {
#ifdef __CUDA_ARCH__
  uint32_t cut;
  if constexpr (kMask) {
    asm volatile("bfe.u32 %0, %1, %2, 1;" : "=r"(cut) : "r"(starts), "r"(r));
  } else {
    asm volatile(
        "{\n\t.reg .u32 t;\n\t.reg .pred p, q;\n\t"
        "mul.lo.u32 t, %1, %2;\n\tshr.u32 t, t, 16;\n\tmul.lo.u32 t, t, %3;\n\t"
        "setp.eq.u32 p, t, %1;\n\tsetp.ne.and.u32 q, %1, 0, p;\n\tselp.u32 %0, 1, 0, q;\n\t}"
        : "=r"(cut)
        : "r"(r), "r"(g.magic_h), "r"(g.seg_h));
  }
  return cut != 0;
#else
  // The host computes what each GPU form computes, so the emulation tests the form of every kernel.
  if constexpr (kMask) {
    return (starts >> r) & 1u;
  } else {
    return r != 0 && small_div(r, g.magic_h) * g.seg_h == r;
  }
#endif
}

// Where a quad starts -- the batch entry and map position of its first cell, as quad_place has
// them -- and whether it is one whole map row: all four cells real, no pack boundary inside
// (quad_place's one_row). That is the test of the vector path, in a few integer operations with no
// per-cell work; which cells are real and where pack boundaries lie only matters off that path,
// where quad_place works it out.
struct QuadAnchor {
  int64_t batch;
  int64_t pos;
  bool whole;
};

SS2D_HD SS2D_INLINE QuadAnchor quad_anchor(const Geometry& g, int bb, int ti, int tj, int r, int c0) {
  const int pr = small_div(r, g.magic_h);
  const int row = ti * kTile + r - pr * g.seg_h;
  const int first_pack = small_div(c0, g.magic_w);
  const int first_col = tj * kTile + c0 - first_pack * g.seg_w;
  const int64_t batch = (static_cast<int64_t>(bb) * g.pack_rows + pr) * g.pack_cols + first_pack;
  const int64_t pos = static_cast<int64_t>(row) * g.width + first_col;
  const bool whole = pr < g.pack_rows && row < g.height && first_pack < g.pack_cols && batch < g.batch &&
                     first_col + kQuad <= g.width && small_div(c0 + kQuad - 1, g.magic_w) == first_pack;
  return QuadAnchor{batch, pos, whole};
}

SS2D_HD SS2D_INLINE int64_t quad_offset(const Geometry& g, const Plane& pl, const QuadAnchor& an) {
  return (an.batch * pl.planes + pl.plane) * g.length + an.pos;
}

// quad_place's result on a whole anchor: every cell real, in one map row.
SS2D_HD SS2D_INLINE QuadPlace whole_quad(const QuadAnchor& an) {
  return QuadPlace{an.batch, an.pos, (1u << kQuad) - 1, 0u, {}};
}

// Entries kBegin .. kBegin + kCount - 1 of an array, as an array (a batch of load_quads' planes).
template <int kBegin, int kCount, class E, int kN>
SS2D_HD SS2D_INLINE E (&slice_of(E (&a)[kN]))[kCount] {
  static_assert(kBegin >= 0 && kCount > 0 && kBegin + kCount <= kN, "a batch lies inside its array");
  return *reinterpret_cast<E(*)[kCount]>(a + kBegin);
}

// Loads the quads of planes 0 .. count - 1 of quad (r, c0) (plane i of view srcs[i], its quad at
// offs[i]) as fp32 into out[i] (0 on padding cells; out[i] for i >= count is for the caller to
// ignore: the repeated plane or 0), then calls then(at, vector) with the quad's QuadPlace and
// whether the vector path ran (std::true_type / std::false_type). On a whole anchor whose quad is
// aligned in every plane -- always on maps whose H * W is a multiple of 4 and aligned tensors --
// one vector access per plane, all issued before the first conversion (planes i >= count are
// loaded too: the caller points them at a real plane, no predicated loads), and then sees the
// compile-time QuadPlace of a whole quad (its per-cell tests fold away). Else quad_place and one
// predicated scalar access per real cell of every plane, without branches, the offsets worked out
// again from the QuadPlace (keeping offs live into this path spills registers).
// Only planes i < kTested take the address test: each later plane lies a whole number of channel
// strides (g.length) past a tested plane of its buffer, so it is aligned when that plane is and
// g.length is a multiple of kQuad (the host model still checks every vector access).
// kRouted (the one-state route variant): offs are route coordinates; an.whole must include
// g.route.linear (the caller's anchor_of); the vector accesses go to the quad's map cells
// (vector_shift, elements in route order by route_element), the per-cell path through place<true>.
template <class T, int kTested, int kMax, bool kRouted = false, class Ctx, class View, class Then>
SS2D_HD SS2D_INLINE void load_quads(const Ctx& ctx, const Geometry& g, const QuadAnchor& an, int bb, int ti,
                                    int tj, int r, int c0, View* const (&srcs)[kMax], const Plane (&planes)[kMax],
                                    const int64_t (&offs)[kMax], int count, float (&out)[kMax][kQuad],
                                    Then&& then) {
  static_assert(kTested <= kMax, "tested planes are a prefix of the planes");
  bool vector = an.whole && (kTested == kMax || g.length % kQuad == 0);
  const int64_t vshift = kRouted ? vector_shift(g, whole_quad(an)) : 0;
SS2D_UNROLL
  for (int i = 0; i < kTested; ++i) vector &= ctx.vector_aligned(*srcs[i], offs[i] + vshift);
  if (vector) {
    Vec4<T> raw[kMax];
SS2D_UNROLL
    for (int i = 0; i < kMax; ++i) raw[i] = ctx.load_vector(*srcs[i], offs[i] + vshift);
SS2D_UNROLL
    for (int i = 0; i < kMax; ++i) {
SS2D_UNROLL
      for (int k = 0; k < kQuad; ++k) out[i][k] = Element<T>::load(route_element<kRouted>(g, raw[i].v, k));
    }
    then(whole_quad(an), std::true_type{});
    return;
  }
  const QuadPlace at = place<kRouted>(g, bb, ti, tj, r, c0);
SS2D_UNROLL
  for (int i = 0; i < kMax; ++i) {
    const uint32_t real = i < count ? at.real : 0u;
SS2D_UNROLL
    for (int k = 0; k < kQuad; ++k) {
      out[i][k] = ((real >> k) & 1u) ? Element<T>::load((*srcs[i])[cell_offset<kRouted>(  // scalar fallback
                                           g, planes[i], at, quad_offset(g, planes[i], at), k)])  // scalar fallback
                                     : 0.f;
    }
  }
  then(at, std::false_type{});
}

// The quad's anchor; on a route kernel whole only on a linear route (the others take the per-cell
// path).
template <bool kRouted>
SS2D_HD SS2D_INLINE QuadAnchor anchor_of(const Geometry& g, int bb, int ti, int tj, int r, int c0) {
  QuadAnchor an = quad_anchor(g, bb, ti, tj, r, c0);
  if constexpr (kRouted) an.whole = an.whole && g.route.linear;
  return an;
}

// Forward of one block: batch block bb, channels d0 .. d0 + channels - 1 of one group. Per tile and
// state round:
//   A (block): dt / u quads (first round; kept in tiles when there are more rounds) and the B quad
//      of each of the round's states, loaded once for all channels; per (channel, state) warp:
//      x = dt * B * u and Abar = exp(dt * A[n]) -- the pass's only exp;
//   (barrier) scans (warp w, its channel and state): lane r scans tile row r in place over x
//      (hh = Abar * hh_left + x, carry from the tile on the left), then lane c scans tile column
//      c (h = Abar * h_above + hh, carry from the tile above) -- shared memory only;
//   (barrier) B (block): the C quad of each of the round's states, loaded once for all channels;
//      per channel (a rolled loop) y = D * u in the first round (u from its tile with several
//      rounds, else read again: keeping no y tile between A and B lets six blocks share an SM at
//      N = 1), else y from the y tile; y += C * h; y goes back to its tile, after the last round to
//      global memory.
// Both passes are templates over Variant (scan2d_common.h): the one-state variant folds N = 1,
// one warp per channel and the sequential pass into constants, so its code keeps no state loops
// and no tile-parallel branches. Its block phases (the `if constexpr (kOne)` arms) take a quad's
// planes for all channels at once (load_quads, placed by quad_anchor with quad_place only off the
// vector path: in A B, delta, u; in B C and u, with y's stores on the same vector path),
// addresses once per quad, and A, delta_bias, D of the block's channels from registers loaded
// once per block (the one-state route variant: from shared memory, see kSharedConsts).
//
// kRegisterCarry: the code compiled for a register-carry arch (register_carry_arch), whose
// one-state variants keep the horizontal carries in registers (kCarryInRegisters); the GPU build
// derives it from the arch it compiles for, the host emulation runs either form
// (EmulationOptions::arch).

template <class T, Variant V, bool kRegisterCarry = kCompilingRegisterCarry, class Ctx>
SS2D_HD void forward_block(Ctx& ctx, const Params& p, int bb, int cblock, int tile_z, char* smem) {
  const Geometry& g = p.g;
  constexpr bool kOne = is_one_state(V);
  constexpr bool kRouted = is_route(V);
  // The one-state route variant reads its per-block constants -- delta_bias, A * log2(e), D of
  // its channels and the column segment starts -- from shared memory (ForwardLayout::consts) where
  // it uses them, and tests row starts on r itself: held in registers through the tile loop, next
  // to its route addressing and fp32's 16-byte loads, they spill on sm_75 / sm_80.
  constexpr bool kSharedConsts = kOne && kRouted;
  // Lane r of warp w keeps its horizontal carry to the next tile in hcar_reg (thread slot
  // w * kTile + r) instead of a carry row (forward_carry_in_registers).
  constexpr bool kCarryInRegisters = kOne && kRegisterCarry;
  const int nstate = kOne ? 1 : g.nstate;
  const int channels = p.k.fwd_channels;
  const int wpc = kOne ? 1 : p.k.fwd_wpc;
  const int pass = kOne ? static_cast<int>(kSequential) : p.pass;
  const int nwarps = channels * wpc;
  const int rounds = state_rounds(nstate, wpc);
  // The launch's layout (its shared memory size): without carry rows only where a one-state
  // variant's kCarryInRegisters form runs (plan_launch asks the arch the kernels were built for).
  const bool carry_in_registers = p.k.fwd_carry_in_registers;
  const ForwardLayout l = forward_layout(channels, wpc, nstate, kRouted, carry_in_registers);
  const int carried_floats = rounds > 1 ? channels * kFwdTileFloats : 0;
  auto dt_t = ctx.template shared<float>(smem, l.dt, carried_floats);
  auto u_t = ctx.template shared<float>(smem, l.u, carried_floats);
  auto y_t = ctx.template shared<float>(smem, l.y, carried_floats);
  // Warp w's x tile at x_t + w * kWarpTiles, its Abar tile right after it (forward_layout).
  constexpr int kWarpTiles = 2 * kFwdTileFloats;
  auto x_t = ctx.template shared<float>(smem, l.x, nwarps * kWarpTiles);
  auto abar_t = x_t + kFwdTileFloats;
  auto hcar = ctx.template shared<float>(smem, l.hcar, carry_in_registers ? 0 : channels * nstate * kTile);
  float hcar_reg[Ctx::kThreadSlots];
  const int64_t n_ud = ud_numel(g), n_bc = bc_numel(g);
  auto u = ctx.global(static_cast<const T*>(p.u), n_ud);
  auto delta = ctx.global(static_cast<const T*>(p.delta), kRouted ? route_delta_numel(g) : n_ud);
  auto Bg = ctx.global(static_cast<const T*>(p.B), kRouted ? route_bc_numel(g) : n_bc);
  auto Cg = ctx.global(static_cast<const T*>(p.C), kRouted ? route_bc_numel(g) : n_bc);
  // y of fp32 inputs is fp32 whatever p.y_fp32 says: one store path. A route kernel's y is the
  // fp32 sum over routes.
  const bool y_fp32 = std::is_same_v<T, float> || kRouted || p.y_fp32;
  auto y32 = ctx.global(static_cast<float*>(y_fp32 ? p.y : nullptr), n_ud);
  auto yT = ctx.global(static_cast<T*>(y_fp32 ? nullptr : p.y), n_ud);
  const bool y_planes = y_fp32 ? vector_planes(ctx, g, y32) : vector_planes(ctx, g, yT);
  const int tiles = g.tiles_h * g.tiles_w;
  const int vslots = p.record ? tiles : g.tiles_w;
  auto carry_v = ctx.global(p.carry_v, p.carry_v ? carry_numel(g, p.record) : 0);
  auto carry_h = ctx.global(p.carry_h, p.carry_h ? carry_numel(g, true) : 0);
  auto edge = ctx.global(p.edge, p.edge ? carry_numel(g, true) : 0);
  auto prod = ctx.global(p.prod, p.prod ? carry_numel(g, true) : 0);
  const uint32_t starts_h = segment_starts(g.seg_h);
  const uint32_t starts_w = segment_starts(g.seg_w);
  const int d0 = cblock * channels;
  const GroupPlanes bc_planes = kRouted ? GroupPlanes{g.route.bc_planes, 0} : group_planes(g, group_of(g, d0));
  const bool sequential = pass == kSequential;
  const bool edges_only = pass == kRowEdges || pass == kColumnEdges;
  // One-state variant: the per-channel constants, once per block (kSharedConsts: in shared memory).
  float bias_c[kMaxWarps], a2_c[kMaxWarps], dskip_c[kMaxWarps];
SS2D_UNROLL
  for (int s = 0; s < kMaxWarps; ++s) {
    const bool has = kOne && !kSharedConsts && s < channels;
    bias_c[s] = has && p.delta_bias ? p.delta_bias[d0 + s] : 0.f;
    a2_c[s] = has ? p.A[d0 + s] * kLog2e : 0.f;
    dskip_c[s] = has && p.D ? p.D[d0 + s] : 0.f;
  }
  auto consts = ctx.template shared<float>(smem, l.consts, kSharedConsts ? kForwardColumnStarts : 0);
  auto column_starts = ctx.template shared<uint32_t>(smem, l.consts + sizeof(float) * kForwardColumnStarts,
                                                     kSharedConsts ? 1 : 0);
  if constexpr (kSharedConsts) {
    ctx.each_thread([&](int t) {
      if (t == 0) column_starts[0] = starts_w;
      if (t >= kMaxWarps) return;
      const bool has = t < channels;
      consts[kBiasRow * kMaxWarps + t] = has && p.delta_bias ? p.delta_bias[d0 + t] : 0.f;
      consts[kA2Row * kMaxWarps + t] = has ? p.A[d0 + t] * kLog2e : 0.f;
      consts[kSkipRow * kMaxWarps + t] = has && p.D ? p.D[d0 + t] : 0.f;
    });
    ctx.barrier();
  }
  // Row `row` of the constants for a quad's cells: from shared memory, or `held`.
  const auto consts_of = [&](int row, const float (&held)[kMaxWarps], float (&out)[kMaxWarps]) {
    static_assert(kMaxWarps == kQuad, "a row of constants is one 16-byte shared access");
    if constexpr (kSharedConsts) {
      load_shared4(consts, row * kMaxWarps, out);
    } else {
SS2D_UNROLL
      for (int s = 0; s < kMaxWarps; ++s) out[s] = held[s];
    }
  };

  // One-state variant: views of channel s's u / delta planes (block channel s; past the block's
  // channels its last one again), made once per block, so a quad's accesses of every channel take
  // the one offset of channel 0's quad (no per-channel offset arithmetic in the tile loop).
  const auto channel_views = [&](const auto& view) {
    std::array<std::decay_t<decltype(view)>, kMaxWarps> out{view, view, view, view};
    static_assert(kMaxWarps == 4, "one view per block channel");
SS2D_UNROLL
    for (int s = 1; s < kMaxWarps; ++s) {
      if (kOne) out[s] = ctx.offset_view(view, static_cast<int64_t>(std::min(s, channels - 1)) * g.length);
    }
    return out;
  };
  auto u_of = channel_views(u);
  auto delta_of = channel_views(delta);
  const int first_tile = sequential ? 0 : tile_z;
  int ti = first_tile / g.tiles_w;  // tile (ti, tj), stepped in row-major order without a division
  int tj = first_tile - ti * g.tiles_w;
  for (int tile = first_tile; tile < (sequential ? tiles : tile_z + 1);
       ++tile, tj = tj + 1 == g.tiles_w ? 0 : tj + 1, ti += tj == 0 ? 1 : 0) {
    const int vslot_in = p.record ? tile : tj;
    const int vslot_out = p.record ? tile + g.tiles_w : tj;
    for (int round = 0; round < rounds; ++round) {
      if constexpr (kOne) {
        // B, then delta and u of each channel: every load of the quad before the first use.
        each_quad(ctx, [&](int, int r, int c0) {
          const QuadAnchor an = anchor_of<kRouted>(g, bb, ti, tj, r, c0);
          constexpr int kLoads = 1 + 2 * kMaxWarps;
          const decltype(&Bg) srcs[kLoads] = {&Bg,         &delta_of[0], &u_of[0], &delta_of[1], &u_of[1],
                                              &delta_of[2], &u_of[2],     &delta_of[3], &u_of[3]};
          const int64_t ud = quad_offset(g, Plane{g.dim, d0}, an);
          // A route's delta has its own planes (delta_plane), a fixed distance from u's quads;
          // else delta's quads are u's. Every channel's quad is at channel 0's offset of its view.
          const int64_t dd = kRouted ? quad_offset(g, delta_plane<kRouted>(g, d0), an) : ud;
          Plane planes[kLoads];
          int64_t offs[kLoads];
          planes[0] = bc_planes(0);
          offs[0] = quad_offset(g, planes[0], an);
SS2D_UNROLL
          for (int s = 0; s < kMaxWarps; ++s) {
            planes[1 + 2 * s] = delta_plane<kRouted>(g, d0);
            planes[2 + 2 * s] = Plane{g.dim, d0};
            offs[1 + 2 * s] = dd;
            offs[2 + 2 * s] = ud;
          }
          float bias[kMaxWarps], a2[kMaxWarps];
          consts_of(kBiasRow, bias_c, bias);
          consts_of(kA2Row, a2_c, a2);
          float q[kLoads][kQuad];
          load_quads<T, 3, kLoads, kRouted>(ctx, g, an, bb, ti, tj, r, c0, srcs, planes, offs, 1 + 2 * channels, q,
                                            [](const QuadPlace&, auto) {});
          // x = dt * u * B and Abar = exp(dt * A) on every cell: padding cells load u = B = 0, so
          // their x is 0 and their h never reaches a real cell (they follow the real cells of
          // their map in both scan directions, and a segment start resets h before the next map).
          // The softplus test is taken once per quad, not per cell (two copies of the cell loop).
          const auto cells = [&](auto with_softplus) {
SS2D_UNROLL
            for (int s = 0; s < kMaxWarps; ++s) {
              if (s >= channels) continue;
              float xq[kQuad], aq[kQuad];
SS2D_UNROLL
              for (int k = 0; k < kQuad; ++k) {
                const float z = q[1 + 2 * s][k] + bias[s];
                const float dt = decltype(with_softplus)::value ? softplus(z) : z;
                xq[k] = dt * q[2 + 2 * s][k] * q[0][k];
                aq[k] = exp2_flush(dt * a2[s]);
              }
              const int e = s * kWarpTiles + fwd_offset(r, c0);
              store_shared4(x_t, e, xq);
              store_shared4(abar_t, e, aq);
            }
          };
          if (p.softplus) {
            cells(std::true_type{});
          } else {
            cells(std::false_type{});
          }
        });
      } else {
      each_quad(ctx, [&](int, int r, int c0) {
        const QuadPlace at = place<kRouted>(g, bb, ti, tj, r, c0);
        float bq[kMaxWarps][kQuad];
SS2D_UNROLL
        for (int j = 0; j < kMaxWarps; ++j) {
          if (j < wpc && round * wpc + j < nstate) {
            load_quad<T, kRouted>(ctx, g, Bg, bc_planes(round * wpc + j), at, bq[j]);
          }
        }
        for (int s = 0; s < channels; ++s) {
          const int d = d0 + s;
          float dt[kQuad], uq[kQuad];
          if (round == 0) {
            const Plane pl{g.dim, d};
            float dq[kQuad];
            const uint32_t real = load_quad<T, kRouted>(ctx, g, delta, delta_plane<kRouted>(g, d), at, dq);
            load_quad<T, kRouted>(ctx, g, u, pl, at, uq);
            const float bias = p.delta_bias ? p.delta_bias[d] : 0.f;
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) dt[k] = dt_of(p, dq[k], bias, (real >> k) & 1u);
            if (rounds > 1) {
              store_shared4(dt_t, s * kFwdTileFloats + fwd_offset(r, c0), dt);
              store_shared4(u_t, s * kFwdTileFloats + fwd_offset(r, c0), uq);
            }
          } else {
            load_shared4(dt_t, s * kFwdTileFloats + fwd_offset(r, c0), dt);
            load_shared4(u_t, s * kFwdTileFloats + fwd_offset(r, c0), uq);
          }
SS2D_UNROLL
          for (int j = 0; j < kMaxWarps; ++j) {
            const int n = round * wpc + j;
            if (j >= wpc || n >= nstate) continue;
            const float a2 = p.A[static_cast<int64_t>(d) * nstate + n] * kLog2e;
            const int w = s * wpc + j;
            float xq[kQuad], aq[kQuad];
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              xq[k] = dt[k] * uq[k] * bq[j][k];
              aq[k] = exp2f(dt[k] * a2);
            }
            store_shared4(x_t, w * kWarpTiles + fwd_offset(r, c0), xq);
            store_shared4(abar_t, w * kWarpTiles + fwd_offset(r, c0), aq);
          }
        }
      });
      }
      ctx.barrier();
      ctx.each_warp([&](int w) {
        const WarpTask task = warp_task(g, nstate, bb, d0, wpc, round, w);
        if (!task.active) return;
        const int s = task.channel, n = task.state;
        const int64_t map = task.map;
        auto x = x_t + w * kWarpTiles;
        auto abar = abar_t + w * kWarpTiles;
        // Horizontal: hh = Abar * hh_left + x, in place over x.
        ctx.each_lane([&](int r) {
          const int64_t at = carry_index(map, tiles, tile, nstate, n, r);
          float h = 0.f;
          const int slot = ctx.thread_slot(w * kTile + r);
          if (sequential) {
            if (tj > 0) h = kCarryInRegisters ? hcar_reg[slot] : hcar[(s * nstate + n) * kTile + r];
            if (p.carry_h) carry_h[at] = h;
          } else if (pass != kRowEdges) {
            h = carry_h[at];
          }
          float decay = 1.f;
          const auto x_row = x + r * kTile;  // quad c0 of the row at c0 ^ swizzle (fwd_offset)
          const auto abar_row = abar + r * kTile;
          const int swizzle = fwd_swizzle(r);
          // A row that starts a map (packed small maps) cuts the vertical scan: its Abar, read
          // here first, becomes 0 for the vertical pass (h = 0 * h_above + hh), which so keeps no
          // per-cell restart test.
          const bool cut_row =
              starts_map_row<std::is_same_v<T, float> && !kSharedConsts && (!kOne || kRegisterCarry)>(g, starts_h, r);
          const uint32_t row_starts_w = kSharedConsts ? column_starts[0] : starts_w;
          const float cut[kQuad] = {0.f, 0.f, 0.f, 0.f};
SS2D_UNROLL
          for (int c0 = 0; c0 < kTile; c0 += kQuad) {  // a quad of the row per 16-byte access
            float a[kQuad], hq[kQuad];
            load_shared4(abar_row, c0 ^ swizzle, a);
            load_shared4(x_row, c0 ^ swizzle, hq);
            if (cut_row) store_shared4(abar_row, c0 ^ swizzle, cut);
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) {
              if ((row_starts_w >> (c0 + k)) & 1u) h = decay = 0.f;
              h = a[k] * h + hq[k];
              decay *= a[k];
              hq[k] = h;
            }
            store_shared4(x_row, c0 ^ swizzle, hq);
          }
          if (sequential) {
            if constexpr (kCarryInRegisters) {
              hcar_reg[slot] = h;
            } else {
              hcar[(s * nstate + n) * kTile + r] = h;
            }
          }
          if (pass == kRowEdges) {
            edge[at] = h;
            prod[at] = decay;
          }
        });
        if (pass == kRowEdges) return;
        ctx.sync_warp();
        // Vertical: h = Abar * h_above + hh, in place.
        ctx.each_lane([&](int c) {
          float v = 0.f;
          if (sequential) {
            const int64_t in = carry_index(map, vslots, vslot_in, nstate, n, c);
            if (ti > 0) {
              v = carry_v[in];
            } else if (p.record) {  // forward_impl allocates carry_v whenever it records
              carry_v[in] = 0.f;
            }
          } else if (pass == kFinal) {
            v = carry_v[carry_index(map, tiles, tile, nstate, n, c)];
          }
          float decay = 1.f;
SS2D_UNROLL
          for (int r = 0; r < kTile; ++r) {  // restarts at map rows: Abar 0 there (row pass)
            const int e = fwd_offset(r, c);
            const float a = abar[e];
            v = a * v + x[e];
            decay *= a;
            x[e] = v;
          }
          if (sequential && ti + 1 < g.tiles_h) {
            carry_v[carry_index(map, vslots, vslot_out, nstate, n, c)] = v;
          }
          if (pass == kColumnEdges) {
            const int64_t at = carry_index(map, tiles, tile, nstate, n, c);
            edge[at] = v;
            prod[at] = decay;
          }
        });
      });
      if (edges_only) {
        if (round + 1 < rounds) ctx.barrier();  // the next round's A rewrites x / Abar
        continue;
      }
      ctx.barrier();
      const bool last = round + 1 == rounds;
      if constexpr (kOne) {
        // C, then u of each channel (with D): y = D * u + C * h, stored. Placed like phase A
        // (quad_anchor; quad_place only off the vector path): a whole anchor whose C, u and y
        // quads are all aligned moves all of them as vectors; off that path each channel's y quad
        // still takes a vector store where it is one aligned map row (y is allocated aligned,
        // the inputs may not be).
        each_quad(ctx, [&](int, int r, int c0) {
          QuadAnchor an = anchor_of<kRouted>(g, bb, ti, tj, r, c0);
          constexpr int kLoads = 1 + kMaxWarps;
          const decltype(&Cg) srcs[kLoads] = {&Cg, &u_of[0], &u_of[1], &u_of[2], &u_of[3]};
          const int64_t ud = quad_offset(g, Plane{g.dim, d0}, an);
          Plane planes[kLoads];
          int64_t offs[kLoads];
          planes[0] = bc_planes(0);
          offs[0] = quad_offset(g, planes[0], an);
SS2D_UNROLL
          for (int s = 0; s < kMaxWarps; ++s) {
            planes[1 + s] = Plane{g.dim, d0};
            offs[1 + s] = ud;
          }
          // y's planes start aligned (y_planes): its quads are aligned where their offset is.
          const bool whole = an.whole;
          const int64_t vshift = kRouted ? vector_shift(g, whole_quad(an)) : 0;
          an.whole = whole && y_planes && (offs[1] + vshift) % kQuad == 0;
          float dskip[kMaxWarps];
          consts_of(kSkipRow, dskip_c, dskip);
          float q[kLoads][kQuad];
          // y of channels lo .. hi - 1 from C (q[0]), their u and h, stored.
          const auto ys = [&](auto lo, auto hi) {
            return [&](const QuadPlace& at, auto vector) {
SS2D_UNROLL
              for (int s = decltype(lo)::value; s < decltype(hi)::value; ++s) {
                if (s >= channels) continue;
                float yq[kQuad];
                load_shared4(x_t, s * kWarpTiles + fwd_offset(r, c0), yq);  // h
SS2D_UNROLL
                for (int k = 0; k < kQuad; ++k) {
                  // dskip is 0 without D: 0 * u only differs from 0 where u is not finite, where h
                  // (x = dt * u * B) is not finite either.
                  yq[k] = fmaf(q[0][k], yq[k], dskip[s] * q[1 + s][k]);
                }
                // y's quad is where u's is (offs[1 + s]), worked out again from channel 0's so the
                // loads' other offsets need not stay live.
                const Plane pl{g.dim, d0 + s};
                const int64_t off = offs[1] + static_cast<int64_t>(s) * g.length;
                if (kRouted && g.route.accumulate) {  // the earlier routes' sum
                  add_quad<kRouted>(ctx, g, y32, pl, at, vector || (whole && ctx.vector_aligned(y32, off + vshift)),
                                    off, yq);
                } else if (y_fp32) {
                  store_quad<float, kRouted>(ctx, g, y32, pl, at,
                                             vector || (whole && ctx.vector_aligned(y32, off + vshift)), off, yq);
                } else {
                  store_quad<T>(ctx, g, yT, pl, at, vector || (whole && ctx.vector_aligned(yT, off)), off, yq);
                }
              }
            };
          };
          using First = std::integral_constant<int, 0>;
          using All = std::integral_constant<int, kMaxWarps>;
          if constexpr (kRouted && sizeof(T) == 4) {
            // fp32 on a route: C and the first half of the channels' u, their y, then the rest's
            // (all five 16-byte loads at once spill on sm_75 / sm_80 under the route forward's
            // registers; the 2-byte types' 8-byte loads fit).
            using Half = std::integral_constant<int, kMaxWarps / 2>;
            constexpr int kFirst = 1 + Half::value;
            load_quads<T, 2, kFirst, kRouted>(ctx, g, an, bb, ti, tj, r, c0, slice_of<0, kFirst>(srcs),
                                              slice_of<0, kFirst>(planes), slice_of<0, kFirst>(offs), 1 + channels,
                                              slice_of<0, kFirst>(q), ys(First{}, Half{}));
            if (channels > Half::value) {
              load_quads<T, 1, kLoads - kFirst, kRouted>(
                  ctx, g, an, bb, ti, tj, r, c0, slice_of<kFirst, kLoads - kFirst>(srcs),
                  slice_of<kFirst, kLoads - kFirst>(planes), slice_of<kFirst, kLoads - kFirst>(offs),
                  1 + channels - kFirst, slice_of<kFirst, kLoads - kFirst>(q), ys(Half{}, All{}));
            }
          } else {
            load_quads<T, 2, kLoads, kRouted>(ctx, g, an, bb, ti, tj, r, c0, srcs, planes, offs, 1 + channels, q,
                                              ys(First{}, All{}));
          }
        });
        continue;
      }
      each_quad(ctx, [&](int, int r, int c0) {
        const QuadPlace at = place<kRouted>(g, bb, ti, tj, r, c0);
        // The C quads of the round's states, loaded once for all channels (registers indexed by
        // unrolled loops: no local memory).
        float cq[kMaxWarps][kQuad];
SS2D_UNROLL
        for (int j = 0; j < kMaxWarps; ++j) {
          const int n = round * wpc + j;
          if (j < wpc && n < nstate) load_quad<T, kRouted>(ctx, g, Cg, bc_planes(n), at, cq[j]);
        }
        // One channel per trip (a rolled loop: one copy of the u / y accesses in the code).
SS2D_UNROLL_BY(1)
        for (int s = 0; s < channels; ++s) {
          float yq[kQuad];
          if (round > 0) {
            load_shared4(y_t, s * kFwdTileFloats + fwd_offset(r, c0), yq);
          } else {
            // y starts at D * u. With one state round u is not kept on chip: its quad is read
            // again (from L2, the block read it in this tile's first phase).
            const float dskip = p.D ? p.D[d0 + s] : 0.f;
            float uq[kQuad] = {0.f, 0.f, 0.f, 0.f};
            if (rounds > 1) {
              load_shared4(u_t, s * kFwdTileFloats + fwd_offset(r, c0), uq);
            } else if (p.D) {
              load_quad<T, kRouted>(ctx, g, u, Plane{g.dim, d0 + s}, at, uq);
            }
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) yq[k] = dskip * uq[k];
          }
SS2D_UNROLL
          for (int j = 0; j < kMaxWarps; ++j) {
            if (j >= wpc || round * wpc + j >= nstate) continue;
            float hq[kQuad];
            load_shared4(x_t, (s * wpc + j) * kWarpTiles + fwd_offset(r, c0), hq);
SS2D_UNROLL
            for (int k = 0; k < kQuad; ++k) yq[k] += cq[j][k] * hq[k];
          }
          if (!last) {
            store_shared4(y_t, s * kFwdTileFloats + fwd_offset(r, c0), yq);
            continue;
          }
          const Plane pl{g.dim, d0 + s};
          if (kRouted && g.route.accumulate) {
            add_quad<kRouted>(ctx, g, y32, pl, at, yq);  // the cell's sum of the earlier routes
          } else if (y_fp32) {
            store_quad<float, kRouted>(ctx, g, y32, pl, at, yq);
          } else {
            store_quad<T, kRouted>(ctx, g, yT, pl, at, yq);
          }
        }
      });
      // No barrier: the next round's (or tile's) A rewrites only cells this thread itself read.
    }
  }
}

}  // namespace scan2d
}  // namespace vmamba2d
