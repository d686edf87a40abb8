"""Triton kernels of the 2D selective scan (imported lazily: importing this module imports triton).

One kernel pair serves both ops: the four-route op (K routes of one map summed into y) and the
single-route op (K = 1, route code 0). A launch scans ``maps`` maps of ``dim`` channels; the
single-route op's G groups of B / C become G maps per batch element (map m = b * G + g holds the
channels of group g, which read parameter rows of group m % ``param_groups``), so a group is one
configuration of the same code, not a second kernel family.

Work split: one program per (map, group of ``sets`` consecutive blocks of ``BLOCK_D``
channels); the program runs all K routes of its channels, route k = 0..K-1 in turn. The route
codes are compile-time constants: a run-time loop over the routes branches to each route's body,
built with that route's directions (one body per route, none hoisted into another). Within a
route the program walks the tiles in the route's order and, per tile, its channel blocks one
after another: B and C tiles are loaded once for all of them (the forward's 2D routes read a
2-byte C once per channel block instead, see C_PER_SET). Data stay in map layout
(map, ..., H, W); a route is index arithmetic:

* 2D routes walk ``TILE_H x TILE_W`` tiles of the map in the route's order (tile rows from the
  bottom when ``from_bottom``, tile columns from the right when ``from_right``). A tile holds
  ``[BLOCK_D, BLOCK_N, TILE_H, TILE_W]`` (channel, state, row, column) in registers, always in map
  orientation; the route's first pass scans axis 3 (rows-first) or axis 2 (columns-first), the
  second pass the other axis, each forwards or reversed (``tl.associative_scan(reverse=...)``)
  by the route's direction along that axis. The states entering a tile from its neighbours
  (horizontal pass: last column of the tile before; vertical pass: last row of the tile row
  before) go through per-channel-block scratch rows, written and re-read around barriers.
* Flat (1D) routes walk the route's sequence in chunks of ``TILE_H * TILE_W`` consecutive steps
  held as ``[BLOCK_D, BLOCK_N, 1, TILE_H * TILE_W]``; each step's map offset is computed from its
  index (row / column order and directions), the state runs on from chunk to chunk.

Route codes are ``Route.code`` bit fields: 1 from_right, 2 from_bottom, 4 columns_first, 8 flat.

Route outputs are summed into y in route order: route 0 writes an accumulator (fp32, fp64 for
fp64 inputs), routes 1..K-2 add to it and route K-1 adds and writes y in its dtype (du likewise
in the backward; with K = 1 route 0 writes y directly). The same program touches the same
accumulator cells in every route (barriers between routes order them). The routes visit the tiles
in different orders, so u is read once per route (no copy of it is made) and y goes through the
accumulator.

The forward kernel can save every tile's incoming states (``SAVE_CARRIES``), so that the backward
kernel rebuilds a tile's states from its own inputs without another forward sweep. The backward
walks each route's tiles in reverse and runs the adjoint recurrences in the opposite directions:

    lam = dL/d(second-pass state):  lam[i] = C[i] dy[i] + Abar[next(i)] lam[next(i)]
    mu  = dL/d(first-pass state):   mu[i]  = lam[i]     + Abar[next(i)] mu[next(i)]

where next(i) is the following cell along the pass. The coefficient belongs to the next cell, so
the adjoint scans carry the last element's decay through their combine (``_shifted_combine``):
exp(dt * A) is evaluated once per cell and state in both kernels. The adjoint states cross tile
boundaries premultiplied by the decay of the cell they leave. Gradients of the decays follow
from the recomputed states: Abar[i] h1[prev(i)] = h1[i] - x[i] along the first pass and
Abar[i] h2[prev(i)] = h2[i] - h1[i] along the second.

Shared inputs are reduced without atomics: per tile, dB / dC of a route are summed over the
program's channels in registers and stored once, one partial per program group; dA / dD /
d(delta_bias) are per-(map, route, channel) partials the program adds to tile by tile; the host sums
partials in a fixed order. Padding cells (past the map's edge or
the sequence's end) take Abar = 1 and x = 0, so they never change a state, and their gradient
terms are masked out.
"""
from __future__ import annotations

import triton
import triton.language as tl



@triton.jit
def _linear_combine(decay_left, value_left, decay_right, value_right):
    # Composition of two steps h -> decay * h + value, the left one (earlier in scan order) first.
    return decay_left * decay_right, decay_right * value_left + value_right


@triton.jit
def _shifted_combine(inner_left, decay_left, value_left, inner_right, decay_right, value_right):
    # Steps g -> value + (incoming) where the incoming term is the previous step's g times the
    # previous step's decay. A segment keeps (product of its decays but the last, its last
    # decay, its last g from a zero incoming term).
    passed = inner_right * decay_left
    return passed * inner_left, decay_right, value_right + passed * value_left


@triton.jit
def _softplus_and_sigmoid(z):
    # softplus(z) = max(z, 0) + log(1 + exp(-|z|)); sigmoid(z) from the same exp.
    e = tl.exp(-tl.abs(z))
    softplus = tl.maximum(z, 0.0) + tl.log(1.0 + e)
    sigmoid = tl.where(z >= 0, 1.0, e) / (1.0 + e)
    return softplus, sigmoid


@triton.jit
def _slice(block, index, AXIS: tl.constexpr, SIZE: tl.constexpr):
    """The slice ``index`` of a 4-D block along ``AXIS`` (2 or 3), that axis removed."""
    if AXIS == 2:
        sel = tl.arange(0, SIZE)[None, None, :, None] == index
    else:
        sel = tl.arange(0, SIZE)[None, None, None, :] == index
    return tl.sum(tl.where(sel, block, 0.0), axis=AXIS)


@triton.jit
def _expand(carry, AXIS: tl.constexpr):
    """A carry with ``AXIS`` removed, broadcastable against the 4-D block again."""
    if AXIS == 2:
        out = carry[:, :, None, :]
    else:
        out = carry[:, :, :, None]
    return out


@triton.jit
def _pass(decay, values, carry, AXIS: tl.constexpr, REVERSE: tl.constexpr):
    """States of h = decay * h[prev] + values along AXIS, entering with ``carry``."""
    cumulative, states = tl.associative_scan((decay, values), AXIS, _linear_combine, reverse=REVERSE)
    return states + cumulative * _expand(carry, AXIS)


@triton.jit
def _adjoint_pass(decay, values, carry, AXIS: tl.constexpr, REVERSE: tl.constexpr):
    """g = values + decay[next] * g[next] along AXIS (``next`` in the scan's order reversed, i.e.
    ``REVERSE`` is the adjoint's direction), entering with ``carry`` = decay * g of the cell
    beyond the tile."""
    ones = tl.full(decay.shape, 1.0, decay.dtype)
    inner, _, states = tl.associative_scan((ones, decay, values), AXIS, _shifted_combine, reverse=REVERSE)
    return states + inner * _expand(carry, AXIS)


@triton.jit
def _first_along(block, decay, AXIS: tl.constexpr, SIZE: tl.constexpr, BACKWARDS: tl.constexpr):
    """decay * block at the first cell of the tile along AXIS in a pass's direction (the adjoint
    carry handed to the tile before)."""
    if BACKWARDS:
        index = SIZE - 1
    else:
        index = 0
    return _slice(decay * block, index, AXIS, SIZE)


@triton.jit
def _last_along(block, AXIS: tl.constexpr, SIZE: tl.constexpr, BACKWARDS: tl.constexpr):
    """block at the last cell of the tile along AXIS in a pass's direction (the carry handed on)."""
    if BACKWARDS:
        index = 0
    else:
        index = SIZE - 1
    return _slice(block, index, AXIS, SIZE)


@triton.jit
def _program_layout(n_groups, nstate, n_tile_cols, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                    TILE_H: tl.constexpr, TILE_W: tl.constexpr):
    """The program's (map, program group), its state lanes and their mask, and the offsets of a
    (BLOCK_D, BLOCK_N, ...) block of tile-edge carries: a padded tile row, a tile column, one
    value per (channel, state). Shared by the forward and backward kernels."""
    pid = tl.program_id(0).to(tl.int64)
    map_index = pid // n_groups
    group = (pid % n_groups).to(tl.int32)
    n1 = tl.arange(0, BLOCK_N)
    state_ok = n1 < nstate
    d1 = tl.arange(0, BLOCK_D)
    carry_one = d1[:, None, None] * BLOCK_N + n1[None, :, None]
    carry_row = carry_one * (n_tile_cols * TILE_W) + tl.arange(0, TILE_W)[None, None, :]
    carry_col = carry_one * TILE_H + tl.arange(0, TILE_H)[None, None, :]
    return map_index, group, n1, state_ok, carry_row, carry_col, carry_one


@triton.jit
def _group_parameters(A_ptr, D_ptr, bias_ptr, map_index, param_groups, dim, nstate, NUM_ROUTES: tl.constexpr):
    """A / D / delta_bias pointers moved to the rows of map ``map_index``'s parameter group
    (map_index % param_groups; its K * dim rows)."""
    rows = (map_index % param_groups) * NUM_ROUTES * dim
    return A_ptr + rows * nstate, D_ptr + rows, bias_ptr + rows


@triton.jit
def _map_length(height, width, WIDTH_ALIGN: tl.constexpr):
    """Cells per map, hinted as a multiple of WIDTH_ALIGN (rows start aligned: vector loads).

    The hint is left out when WIDTH_ALIGN is 1: it says nothing then, and a 1 x 1 map makes both
    sizes compile-time ones (Triton specialises integer arguments equal to 1), whose product
    tl.multiple_of rejects."""
    length = height * width
    if WIDTH_ALIGN > 1:
        length = tl.multiple_of(length, WIDTH_ALIGN)
    return length


@triton.jit
def _tile_cells(tr, tc, height, width, TILE_H: tl.constexpr, TILE_W: tl.constexpr, WIDTH_ALIGN: tl.constexpr):
    """Map offsets (TILE_H, TILE_W) of tile (tr, tc) and which are inside the map.

    Hints: every row starts at a multiple of WIDTH_ALIGN and the column test is constant over
    aligned runs of WIDTH_ALIGN columns, so loads of a row can be vectorised."""
    rows = tr * TILE_H + tl.arange(0, TILE_H)[:, None]
    cols = tc * TILE_W + tl.arange(0, TILE_W)[None, :]
    row_start = tl.multiple_of(rows * width, [WIDTH_ALIGN, 1])
    col_limit = tl.multiple_of(tl.full([1, TILE_W], width, tl.int32), [1, WIDTH_ALIGN])
    ok = (rows < height) & (cols < col_limit)
    return row_start + cols, ok


@triton.jit
def _chunk_cells(chunk, height, width, CODE: tl.constexpr, LENGTH: tl.constexpr):
    """Map offsets (1, LENGTH) of steps chunk * LENGTH ... of a flat route's sequence."""
    step = chunk * LENGTH + tl.arange(0, LENGTH)[None, :]
    ok = step < height * width
    if CODE & 4:  # columns_first: column-major sequence
        col = step // height
        row = step % height
    else:
        row = step // width
        col = step % width
    if CODE & 2:  # from_bottom
        row = height - 1 - row
    if CODE & 1:  # from_right
        col = width - 1 - col
    return tl.where(ok, row * width + col, 0), ok


@triton.jit
def _route_params(A_ptr, D_ptr, bias_ptr, route_index, dim, nstate, d_index, chan_ok, n1, state_ok,
                  HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, ACC: tl.constexpr):
    """The route's A (BLOCK_D, BLOCK_N, 1, 1), D and delta_bias (BLOCK_D, 1, 1) of the channels
    (0.0 for an absent D / delta_bias)."""
    row = route_index * dim + d_index
    A = tl.load(A_ptr + row[:, None] * nstate + n1[None, :], mask=chan_ok[:, None] & state_ok[None, :],
                other=0.0).to(ACC)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + row, mask=chan_ok, other=0.0).to(ACC)[:, None, None]
    else:
        bias = 0.0
    if HAS_D:
        skip = tl.load(D_ptr + row, mask=chan_ok, other=0.0).to(ACC)[:, None, None]
    else:
        skip = 0.0
    return A[:, :, None, None], skip, bias


@triton.jit
def _step_inputs(u_ptr, delta_ptr, chan3, pos, chan_mask, cell_ok, Bt, A4, bias,
                 SOFTPLUS: tl.constexpr, ACC: tl.constexpr):
    """u, dt, d(dt)/d(delta) (BLOCK_D, rows, cols); decay, x (4-D) of a tile with B tile ``Bt``."""
    u = tl.load(u_ptr + chan3 + pos[None], mask=chan_mask, other=0.0).to(ACC)
    z = tl.load(delta_ptr + chan3 + pos[None], mask=chan_mask, other=0.0).to(ACC) + bias
    if SOFTPLUS:
        dt, dz = _softplus_and_sigmoid(z)
    else:
        dt = z
        dz = tl.full(z.shape, 1.0, ACC)
    decay = tl.where(cell_ok[None, None], tl.exp(dt[:, None] * A4), 1.0)
    x = (dt * u)[:, None] * Bt[None]
    return u, dt, dz, decay, x


@triton.jit
def _accumulate(value, acc_ptr, out_ptr, offsets, mask, FIRST: tl.constexpr, LAST: tl.constexpr):
    """Add ``value`` to the running route sum at ``offsets``: the last route writes ``out_ptr``."""
    if not FIRST:
        value += tl.load(acc_ptr + offsets, mask=mask, other=0.0)
    if LAST:
        tl.store(out_ptr + offsets, value.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(acc_ptr + offsets, value, mask=mask)


@triton.jit
def _set_channels(cb, dim, length, state_ok, cell_ok, BLOCK_D: tl.constexpr):
    """Channel block ``cb``: (d_index, chan_ok (BLOCK_D,), int32 offsets of its maps (BLOCK_D, 1, 1),
    the tile's (channel, cell) mask, the (channel, state) carry mask)."""
    d_index = cb * BLOCK_D + tl.arange(0, BLOCK_D)
    chan_ok = d_index < dim
    chan_mask = chan_ok[:, None, None] & cell_ok[None]
    return d_index, chan_ok, (d_index * length)[:, None, None], chan_mask, chan_ok[:, None, None] & state_ok[None, :, None]


@triton.jit
def _route_forward(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, y_ptr, yacc_ptr, vcarry_ptr, hcarry_ptr, hstate_ptr,
    map_index, group, n1, state_ok, carry_row, carry_col, carry_one,
    dim, nstate, height, width, n_chan_blocks, sets, n_tile_rows, n_tile_cols, n_chunks,
    route_index, k: tl.constexpr, CODE: tl.constexpr, NUM_ROUTES: tl.constexpr,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, SAVE_CARRIES: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    WIDTH_ALIGN: tl.constexpr, ACC: tl.constexpr,
):
    """Route k (code ``CODE``) of ``scan2d_fwd_kernel``'s program: tiles in route order, the
    program's channel sets one after another within each tile."""
    length = _map_length(height, width, WIDTH_ALIGN)
    state_ok3 = state_ok[:, None, None]
    route = map_index * NUM_ROUTES + route_index
    delta_ptr += route * dim * length
    B_ptr += route * nstate * length
    C_ptr += route * nstate * length
    state3 = (n1 * length)[:, None, None]
    padded_width = n_tile_cols * TILE_W
    vslot = BLOCK_D * BLOCK_N * padded_width
    hslot = BLOCK_D * BLOCK_N * TILE_H
    n_slots = n_tile_rows if SAVE_CARRIES else 1
    route_hcarry = n_tile_rows * n_tile_cols * hslot if SAVE_CARRIES else 0
    first_block = map_index * n_chan_blocks + group * sets
    tl.debug_barrier()  # the previous route's accumulator and scratch accesses are done
    if CODE & 8:  # flat route
        for chunk in range(n_chunks):
            pos, cell_ok = _chunk_cells(chunk, height, width, CODE, TILE_H * TILE_W)
            state_mask = state_ok3 & cell_ok[None]
            Bt = tl.load(B_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
            Ct = tl.load(C_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
            for s in range(sets):
                block = first_block + s
                d_index, chan_ok, chan3, chan_mask, carry_ok = _set_channels(group * sets + s, dim, length, state_ok,
                                                                             cell_ok, BLOCK_D)
                A4, skip, bias = _route_params(A_ptr, D_ptr, bias_ptr, route_index, dim, nstate, d_index, chan_ok,
                                               n1, state_ok, HAS_D, HAS_BIAS, ACC)
                state_slot = hstate_ptr + block * hslot + carry_one
                tl.debug_barrier()
                carry = tl.load(state_slot, mask=carry_ok & (chunk > 0), other=0.0)
                tl.debug_barrier()
                if SAVE_CARRIES:
                    tl.store(hcarry_ptr + (block * NUM_ROUTES + route_index) * route_hcarry
                             + chunk * BLOCK_D * BLOCK_N + carry_one, carry, mask=carry_ok)
                u, dt, dz, decay, x = _step_inputs(u_ptr, delta_ptr, chan3, pos, chan_mask, cell_ok, Bt, A4, bias,
                                                   SOFTPLUS, ACC)
                h = _pass(decay, x, carry, 3, False)
                tl.store(state_slot, _last_along(h, 3, TILE_H * TILE_W, False), mask=carry_ok)
                y = tl.sum(h * Ct[None], axis=1) + skip * u
                _accumulate(y, yacc_ptr, y_ptr, chan3 + pos[None], chan_mask, k == 0, k == NUM_ROUTES - 1)
    else:
        REV_H: tl.constexpr = (CODE & 1) != 0
        REV_V: tl.constexpr = (CODE & 2) != 0
        # 2-byte inputs: C is read again for every channel set rather than held across them (the
        # tile held in ACC spilled at the 128-register cap, bf16 on sm_90); the re-read hits cache.
        C_PER_SET: tl.constexpr = C_ptr.dtype.element_ty.primitive_bitwidth < 32
        for rr in range(n_tile_rows):
            tr = n_tile_rows - 1 - rr if REV_V else rr
            read_slot = rr if SAVE_CARRIES else 0
            write_slot = rr + 1 if SAVE_CARRIES else 0
            for cc in range(n_tile_cols):
                tc = n_tile_cols - 1 - cc if REV_H else cc
                pos, cell_ok = _tile_cells(tr, tc, height, width, TILE_H, TILE_W, WIDTH_ALIGN)
                state_mask = state_ok3 & cell_ok[None]
                Bt = tl.load(B_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
                if not C_PER_SET:
                    Ct = tl.load(C_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
                for s in range(sets):
                    block = first_block + s
                    d_index, chan_ok, chan3, chan_mask, carry_ok = _set_channels(group * sets + s, dim, length,
                                                                                 state_ok, cell_ok, BLOCK_D)
                    A4, skip, bias = _route_params(A_ptr, D_ptr, bias_ptr, route_index, dim, nstate, d_index,
                                                   chan_ok, n1, state_ok, HAS_D, HAS_BIAS, ACC)
                    vbase = vcarry_ptr + (block * NUM_ROUTES + route_index) * n_slots * vslot + carry_row + tc * TILE_W
                    state_slot = hstate_ptr + block * hslot + carry_col
                    tl.debug_barrier()  # the previous tile's writes of these scratch rows are visible
                    vcarry = tl.load(vbase + read_slot * vslot, mask=carry_ok & (rr > 0), other=0.0)
                    hcarry = tl.load(state_slot, mask=carry_ok & (cc > 0), other=0.0)
                    tl.debug_barrier()  # every thread has read them before they are overwritten
                    if SAVE_CARRIES:
                        tl.store(hcarry_ptr + (block * NUM_ROUTES + route_index) * route_hcarry
                                 + (tr * n_tile_cols + tc) * hslot + carry_col, hcarry, mask=carry_ok)
                    u, dt, dz, decay, x = _step_inputs(u_ptr, delta_ptr, chan3, pos, chan_mask, cell_ok, Bt, A4, bias,
                                                       SOFTPLUS, ACC)
                    if CODE & 4:  # columns first
                        vstate = _pass(decay, x, vcarry, 2, REV_V)
                        h = _pass(decay, vstate, hcarry, 3, REV_H)
                        hstate = h
                    else:
                        hstate = _pass(decay, x, hcarry, 3, REV_H)
                        h = _pass(decay, hstate, vcarry, 2, REV_V)
                        vstate = h
                    tl.store(state_slot, _last_along(hstate, 3, TILE_W, REV_H), mask=carry_ok)
                    tl.store(vbase + write_slot * vslot, _last_along(vstate, 2, TILE_H, REV_V),
                             mask=carry_ok & (rr + 1 < n_tile_rows))
                    if C_PER_SET:
                        Ct = tl.load(C_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
                    y = tl.sum(h * Ct[None], axis=1) + skip * u
                    _accumulate(y, yacc_ptr, y_ptr, chan3 + pos[None], chan_mask, k == 0, k == NUM_ROUTES - 1)


@triton.jit
def scan2d_fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, y_ptr, yacc_ptr, vcarry_ptr, hcarry_ptr, hstate_ptr,
    dim, nstate, height, width, n_chan_blocks, n_groups, sets, n_tile_rows, n_tile_cols, n_chunks, param_groups,
    ROUTES: tl.constexpr, NUM_ROUTES: tl.constexpr,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, SAVE_CARRIES: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    WIDTH_ALIGN: tl.constexpr, ACC: tl.constexpr,
):
    """Forward of every route of one program's ``sets`` channel blocks (block = map *
    n_chan_blocks + group * sets + s); per tile, B (and C, but for 2-byte 2D routes) is loaded
    once for all of them.

    Inputs: u (maps, dim, H, W), delta (maps, K, dim, H, W), B / C (maps, K, N, H, W), A
    (param_groups * K * dim, N), D / delta_bias (param_groups * K * dim,); map m takes the rows of
    parameter group m % param_groups. ``ROUTES``: the K route codes, 4 bits each (route k in bits
    4k..4k+3). ``yacc_ptr``: the route sum's accumulator (maps, dim, H, W) in ACC (may be
    ``y_ptr``). Per channel block and route: ``vcarry_ptr`` (slots, BLOCK_D, BLOCK_N,
    n_tile_cols * TILE_W) vertical-pass states entering each tile row (slots = n_tile_rows when
    saving, slot 0 unused, else 1 scratch slot); ``hcarry_ptr`` (SAVE_CARRIES only) (n_tile_rows * n_tile_cols, BLOCK_D, BLOCK_N, TILE_H)
    horizontal-pass states entering each tile, or for flat routes (n_chunks, BLOCK_D, BLOCK_N)
    the state entering each chunk. Per channel block: ``hstate_ptr`` (BLOCK_D, BLOCK_N, TILE_H)
    scratch for the horizontal-pass (flat: the sequence's) state between tiles.
    """
    length = _map_length(height, width, WIDTH_ALIGN)
    map_index, group, n1, state_ok, carry_row, carry_col, carry_one = _program_layout(
        n_groups, nstate, n_tile_cols, BLOCK_D, BLOCK_N, TILE_H, TILE_W)
    # Scalar pointers to the program's map and its parameter group's rows, int32 offsets within them.
    A_ptr, D_ptr, bias_ptr = _group_parameters(A_ptr, D_ptr, bias_ptr, map_index, param_groups, dim, nstate, NUM_ROUTES)
    u_ptr += map_index * dim * length
    y_ptr += map_index * dim * length
    yacc_ptr += map_index * dim * length

    # A run-time loop over the routes, each iteration branching to its route's compiled body: the
    # compiler cannot hoist one route's address arithmetic into another's (fewer live registers).
    for route_index in range(NUM_ROUTES):
        for k in tl.static_range(NUM_ROUTES):
            if route_index == k:
                _route_forward(
                    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, y_ptr, yacc_ptr, vcarry_ptr, hcarry_ptr,
                    hstate_ptr, map_index, group, n1, state_ok, carry_row, carry_col, carry_one,
                    dim, nstate, height, width, n_chan_blocks, sets, n_tile_rows, n_tile_cols, n_chunks,
                    route_index, k, (ROUTES >> (4 * k)) & 15, NUM_ROUTES, HAS_D, HAS_BIAS, SOFTPLUS, SAVE_CARRIES,
                    BLOCK_D, BLOCK_N, TILE_H, TILE_W, WIDTH_ALIGN, ACC)


@triton.jit
def _tile_gradients(grad_decay, grad_x, u, dt, dz, dy, Bt, A4, skip, chan_mask):
    """Per-cell gradients of a tile from dL/dAbar * Abar (``grad_decay``) and dL/dx (``grad_x``):
    (du, ddelta (BLOCK_D, rows, cols), dB (BLOCK_N, rows, cols) summed over channels,
    dA (BLOCK_D, BLOCK_N), dD, d(delta_bias) (BLOCK_D,) summed over cells)."""
    grad_xB = tl.sum(grad_x * Bt[None], axis=1)
    du = grad_xB * dt + skip * dy
    ddt = tl.sum(grad_decay * A4, axis=1) + grad_xB * u
    ddelta = tl.where(chan_mask, ddt * dz, 0.0)
    dA = tl.sum(tl.sum(grad_decay * dt[:, None], axis=3), axis=2)
    dD = tl.sum(tl.sum(dy * u, axis=2), axis=1)
    dbias = tl.sum(tl.sum(ddelta, axis=2), axis=1)
    dB = tl.sum(grad_x * (dt * u)[:, None], axis=0)
    return du, ddelta, dB, dA, dD, dbias


@triton.jit
def _add_to(ptr, offsets, value, mask):
    """ptr[offsets] += value (one program owns these cells: a fixed-order sum, no atomics)."""
    tl.store(ptr + offsets, tl.load(ptr + offsets, mask=mask, other=0.0) + value, mask=mask)


@triton.jit
def _set_backward(
    u_ptr, delta_ptr, A_ptr, D_ptr, bias_ptr, dy_ptr, cb, n1, state_ok, pos, cell_ok, Bt, Ct, dim, nstate, length,
    route_index, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr, ACC: tl.constexpr,
):
    """What one channel set needs of a tile before its scans: (d_index, chan_ok, chan3, chan_mask,
    carry_ok, A4, skip, u, dt, dz, dy, decay, x, grad_out)."""
    d_index, chan_ok, chan3, chan_mask, carry_ok = _set_channels(cb, dim, length, state_ok, cell_ok, BLOCK_D)
    A4, skip, bias = _route_params(A_ptr, D_ptr, bias_ptr, route_index, dim, nstate, d_index, chan_ok, n1, state_ok,
                                   HAS_D, HAS_BIAS, ACC)
    u, dt, dz, decay, x = _step_inputs(u_ptr, delta_ptr, chan3, pos, chan_mask, cell_ok, Bt, A4, bias, SOFTPLUS, ACC)
    dy = tl.load(dy_ptr + chan3 + pos[None], mask=chan_mask, other=0.0).to(ACC)
    return d_index, chan_ok, chan3, chan_mask, carry_ok, A4, skip, u, dt, dz, dy, decay, x, dy[:, None] * Ct[None]


@triton.jit
def _set_gradients(
    grad_decay, grad_x, u, dt, dz, dy, Bt, A4, skip, d_index, chan_ok, chan3, chan_mask, pos, route, dim, nstate, n1,
    state_ok, du_ptr, duacc_ptr, ddelta_ptr, dA_part_ptr, dD_part_ptr, dbias_part_ptr,
    k: tl.constexpr, NUM_ROUTES: tl.constexpr, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """Store one channel set's du / ddelta of a tile, add its dA / dD / d(delta_bias) to the
    partials; return its dB (summed over the set's channels)."""
    du, ddelta, dB, dA, dD, dbias = _tile_gradients(grad_decay, grad_x, u, dt, dz, dy, Bt, A4, skip, chan_mask)
    rows = route * dim + d_index
    _add_to(dA_part_ptr, rows[:, None] * nstate + n1[None, :], dA, chan_ok[:, None] & state_ok[None, :])
    if HAS_D:
        _add_to(dD_part_ptr, rows, dD, chan_ok)
    if HAS_BIAS:
        _add_to(dbias_part_ptr, rows, dbias, chan_ok)
    tl.store(ddelta_ptr + chan3 + pos[None], ddelta, mask=chan_mask)
    _accumulate(du, duacc_ptr, du_ptr, chan3 + pos[None], chan_mask, k == 0, k == NUM_ROUTES - 1)
    return dB


@triton.jit
def _route_backward(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, dy_ptr, vcarry_ptr, hcarry_ptr, vadj_ptr, hadj_ptr,
    du_ptr, duacc_ptr, ddelta_ptr, dA_part_ptr, dB_part_ptr, dC_part_ptr, dD_part_ptr, dbias_part_ptr,
    map_index, group, n1, state_ok, carry_row, carry_col, carry_one,
    dim, nstate, height, width, n_chan_blocks, n_groups, sets, n_tile_rows, n_tile_cols, n_chunks,
    route_index, k: tl.constexpr, CODE: tl.constexpr, NUM_ROUTES: tl.constexpr,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    WIDTH_ALIGN: tl.constexpr, ACC: tl.constexpr,
):
    """Route k (code ``CODE``) of ``scan2d_bwd_kernel``'s program: tiles in reverse route
    order, the program's channel sets one after another within each tile."""
    length = height * width
    state_ok3 = state_ok[:, None, None]
    route = map_index * NUM_ROUTES + route_index
    delta_ptr += route * dim * length
    ddelta_ptr += route * dim * length
    B_ptr += route * nstate * length
    C_ptr += route * nstate * length
    dB_part_ptr += (route * n_groups + group) * nstate * length
    dC_part_ptr += (route * n_groups + group) * nstate * length
    state3 = (n1 * length)[:, None, None]
    padded_width = n_tile_cols * TILE_W
    vslot = BLOCK_D * BLOCK_N * padded_width
    hslot = BLOCK_D * BLOCK_N * TILE_H
    route_vcarry = n_tile_rows * vslot
    route_hcarry = n_tile_rows * n_tile_cols * hslot
    first_block = map_index * n_chan_blocks + group * sets
    tl.debug_barrier()  # the previous route's accumulator and scratch accesses are done
    if CODE & 8:  # flat route
        for rc in range(n_chunks):
            chunk = n_chunks - 1 - rc
            pos, cell_ok = _chunk_cells(chunk, height, width, CODE, TILE_H * TILE_W)
            state_mask = state_ok3 & cell_ok[None]
            Bt = tl.load(B_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
            Ct = tl.load(C_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
            dB_tile = tl.zeros([BLOCK_N, 1, TILE_H * TILE_W], dtype=ACC)
            dC_tile = tl.zeros([BLOCK_N, 1, TILE_H * TILE_W], dtype=ACC)
            for s in range(sets):
                block = first_block + s
                d_index, chan_ok, chan3, chan_mask, carry_ok, A4, skip, u, dt, dz, dy, decay, x, grad_out = \
                    _set_backward(u_ptr, delta_ptr, A_ptr, D_ptr, bias_ptr, dy_ptr, group * sets + s, n1, state_ok,
                                  pos, cell_ok, Bt, Ct, dim, nstate, length, route_index, HAS_D, HAS_BIAS, SOFTPLUS, BLOCK_D,
                                  ACC)
                adj_slot = hadj_ptr + block * hslot + carry_one
                tl.debug_barrier()
                adj = tl.load(adj_slot, mask=carry_ok & (rc > 0), other=0.0)
                tl.debug_barrier()
                carry = tl.load(hcarry_ptr + (block * NUM_ROUTES + route_index) * route_hcarry + chunk * BLOCK_D * BLOCK_N
                                + carry_one, mask=carry_ok, other=0.0)
                h = _pass(decay, x, carry, 3, False)
                dC_tile += tl.sum(h * dy[:, None], axis=0)
                decayed_prev = h - x  # Abar * h[prev]
                g = _adjoint_pass(decay, grad_out, adj, 3, True)
                tl.store(adj_slot, _first_along(g, decay, 3, TILE_H * TILE_W, False), mask=carry_ok)
                grad_decay = tl.where(cell_ok[None, None], g * decayed_prev, 0.0)
                dB_tile += _set_gradients(grad_decay, g, u, dt, dz, dy, Bt, A4, skip, d_index, chan_ok, chan3,
                                          chan_mask, pos, route, dim, nstate, n1, state_ok, du_ptr, duacc_ptr,
                                          ddelta_ptr, dA_part_ptr, dD_part_ptr, dbias_part_ptr, k, NUM_ROUTES,
                                          HAS_D, HAS_BIAS)
            tl.store(dB_part_ptr + state3 + pos[None], dB_tile, mask=state_mask)
            tl.store(dC_part_ptr + state3 + pos[None], dC_tile, mask=state_mask)
    else:
        REV_H: tl.constexpr = (CODE & 1) != 0
        REV_V: tl.constexpr = (CODE & 2) != 0
        for rr_back in range(n_tile_rows):
            rr = n_tile_rows - 1 - rr_back
            tr = n_tile_rows - 1 - rr if REV_V else rr
            for cc_back in range(n_tile_cols):
                cc = n_tile_cols - 1 - cc_back
                tc = n_tile_cols - 1 - cc if REV_H else cc
                pos, cell_ok = _tile_cells(tr, tc, height, width, TILE_H, TILE_W, WIDTH_ALIGN)
                state_mask = state_ok3 & cell_ok[None]
                Bt = tl.load(B_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
                Ct = tl.load(C_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
                dB_tile = tl.zeros([BLOCK_N, TILE_H, TILE_W], dtype=ACC)
                dC_tile = tl.zeros([BLOCK_N, TILE_H, TILE_W], dtype=ACC)
                for s in range(sets):
                    block = first_block + s
                    d_index, chan_ok, chan3, chan_mask, carry_ok, A4, skip, u, dt, dz, dy, decay, x, grad_out = \
                        _set_backward(u_ptr, delta_ptr, A_ptr, D_ptr, bias_ptr, dy_ptr, group * sets + s, n1,
                                      state_ok, pos, cell_ok, Bt, Ct, dim, nstate, length, route_index, HAS_D, HAS_BIAS,
                                      SOFTPLUS, BLOCK_D, ACC)
                    vadj_slot = vadj_ptr + block * vslot + carry_row + tc * TILE_W
                    hadj_slot = hadj_ptr + block * hslot + carry_col
                    tl.debug_barrier()
                    vadj = tl.load(vadj_slot, mask=carry_ok & (rr_back > 0), other=0.0)
                    hadj = tl.load(hadj_slot, mask=carry_ok & (cc_back > 0), other=0.0)
                    tl.debug_barrier()
                    vcarry = tl.load(vcarry_ptr + (block * NUM_ROUTES + route_index) * route_vcarry + rr * vslot + carry_row
                                     + tc * TILE_W, mask=carry_ok & (rr > 0), other=0.0)
                    hcarry = tl.load(hcarry_ptr + (block * NUM_ROUTES + route_index) * route_hcarry
                                     + (tr * n_tile_cols + tc) * hslot + carry_col, mask=carry_ok, other=0.0)
                    if CODE & 4:  # columns first
                        first = _pass(decay, x, vcarry, 2, REV_V)
                        h = _pass(decay, first, hcarry, 3, REV_H)
                    else:
                        first = _pass(decay, x, hcarry, 3, REV_H)
                        h = _pass(decay, first, vcarry, 2, REV_V)
                    dC_tile += tl.sum(h * dy[:, None], axis=0)
                    decayed_second = h - first  # Abar * (second-pass state before)
                    decayed_first = first - x  # Abar * (first-pass state before)
                    if CODE & 4:  # columns first
                        lam = _adjoint_pass(decay, grad_out, hadj, 3, not REV_H)
                        mu = _adjoint_pass(decay, lam, vadj, 2, not REV_V)
                        hadj_out = _first_along(lam, decay, 3, TILE_W, REV_H)
                        vadj_out = _first_along(mu, decay, 2, TILE_H, REV_V)
                    else:
                        lam = _adjoint_pass(decay, grad_out, vadj, 2, not REV_V)
                        mu = _adjoint_pass(decay, lam, hadj, 3, not REV_H)
                        hadj_out = _first_along(mu, decay, 3, TILE_W, REV_H)
                        vadj_out = _first_along(lam, decay, 2, TILE_H, REV_V)
                    tl.store(vadj_slot, vadj_out, mask=carry_ok)
                    tl.store(hadj_slot, hadj_out, mask=carry_ok)
                    grad_decay = tl.where(cell_ok[None, None], lam * decayed_second + mu * decayed_first, 0.0)
                    dB_tile += _set_gradients(grad_decay, mu, u, dt, dz, dy, Bt, A4, skip, d_index, chan_ok, chan3,
                                              chan_mask, pos, route, dim, nstate, n1, state_ok, du_ptr, duacc_ptr,
                                              ddelta_ptr, dA_part_ptr, dD_part_ptr, dbias_part_ptr, k, NUM_ROUTES,
                                              HAS_D, HAS_BIAS)
                tl.store(dB_part_ptr + state3 + pos[None], dB_tile, mask=state_mask)
                tl.store(dC_part_ptr + state3 + pos[None], dC_tile, mask=state_mask)


@triton.jit
def scan2d_bwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, dy_ptr, vcarry_ptr, hcarry_ptr, vadj_ptr, hadj_ptr,
    du_ptr, duacc_ptr, ddelta_ptr, dA_part_ptr, dB_part_ptr, dC_part_ptr, dD_part_ptr, dbias_part_ptr,
    dim, nstate, height, width, n_chan_blocks, n_groups, sets, n_tile_rows, n_tile_cols, n_chunks, param_groups,
    ROUTES: tl.constexpr, NUM_ROUTES: tl.constexpr,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    WIDTH_ALIGN: tl.constexpr, ACC: tl.constexpr,
):
    """Backward of every route of one program's ``sets`` channel blocks from the carries the
    forward saved (the forward's programs are the channel blocks: block = map *
    n_chan_blocks + group * sets + s); inputs as ``scan2d_fwd_kernel``.

    Per tile, B and C are loaded once and dB / dC are summed over the program's channel sets in
    registers, then stored once. ``vcarry_ptr`` / ``hcarry_ptr``: written by
    ``scan2d_fwd_kernel`` with ``SAVE_CARRIES`` and the same tiling. Scratch per channel
    block: ``vadj_ptr`` (BLOCK_D, BLOCK_N, n_tile_cols * TILE_W) the vertical adjoint entering
    each tile row, ``hadj_ptr`` (BLOCK_D, BLOCK_N, TILE_H) the horizontal adjoint entering each
    tile (a flat route's adjoint entering each chunk). ``duacc_ptr``: du's route-sum accumulator
    in ACC (may be ``du_ptr``). Outputs: du (maps, dim, H, W); ddelta (maps, K, dim, H, W); partials
    (zero-initialised) dA (maps, K * dim, N), dB / dC (maps, K, n_groups, N, H, W), dD /
    d(delta_bias) (maps, K * dim).
    """
    length = height * width
    map_index, group, n1, state_ok, carry_row, carry_col, carry_one = _program_layout(
        n_groups, nstate, n_tile_cols, BLOCK_D, BLOCK_N, TILE_H, TILE_W)
    # Scalar pointers to the program's map and its parameter group's rows, int32 offsets within them.
    A_ptr, D_ptr, bias_ptr = _group_parameters(A_ptr, D_ptr, bias_ptr, map_index, param_groups, dim, nstate, NUM_ROUTES)
    u_ptr += map_index * dim * length
    dy_ptr += map_index * dim * length
    du_ptr += map_index * dim * length
    duacc_ptr += map_index * dim * length

    # Run-time route loop branching to each route's body (see scan2d_fwd_kernel).
    for route_index in range(NUM_ROUTES):
        for k in tl.static_range(NUM_ROUTES):
            if route_index == k:
                _route_backward(
                    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, dy_ptr, vcarry_ptr, hcarry_ptr, vadj_ptr,
                    hadj_ptr, du_ptr, duacc_ptr, ddelta_ptr, dA_part_ptr, dB_part_ptr, dC_part_ptr, dD_part_ptr,
                    dbias_part_ptr, map_index, group, n1, state_ok, carry_row, carry_col, carry_one,
                    dim, nstate, height, width, n_chan_blocks, n_groups, sets, n_tile_rows, n_tile_cols, n_chunks,
                    route_index, k, (ROUTES >> (4 * k)) & 15, NUM_ROUTES, HAS_D, HAS_BIAS, SOFTPLUS,
                    BLOCK_D, BLOCK_N, TILE_H, TILE_W, WIDTH_ALIGN, ACC)
