"""Triton kernels of the 2D selective scan (imported lazily: importing this module imports triton).

Work split: one program per (batch, group, block of ``BLOCK_D`` channels of that group). A program
walks its ``height x width`` maps tile by tile (``TILE_H x TILE_W``), row of tiles by row of tiles,
holding a tile of every (channel, state) pair in registers as a ``[BLOCK_D, BLOCK_N, TILE_H,
TILE_W]`` block. B and C tiles are loaded once and shared by the block's channels; exp(dt * A) is
evaluated once per cell and state and serves both scans.

Per tile the forward runs ``tl.associative_scan`` along the rows (hh, the horizontal state) and
then along the columns (h), with the linear-recurrence combine
``(a1, b1) o (a2, b2) = (a1 * a2, a2 * b1 + b2)``; the cumulative decay it also returns applies the
carries from the neighbouring tiles: hh of the last column of the tile to the left (kept in
registers) and h of the last row of the tile above (kept in a per-program scratch row, written
and re-read around barriers because different threads hold the row before and after).

The backward recomputes: a first launch of the forward kernel (``SAVE_CARRIES``) stores every
tile's incoming carries, then the backward kernel walks the tiles in reverse, rebuilds h and hh of
each tile from its saved carries and runs the adjoint recurrences as reverse scans:

    gh[i, j]  = C[i, j] dy[i, j] + Abar[i + 1, j] gh[i + 1, j]     (vertical, dL/dh)
    ghh[i, j] = gh[i, j] + Abar[i, j + 1] ghh[i, j + 1]             (horizontal, dL/dhh = dL/dx)

The shifted decays are recomputed from the neighbouring delta values (two more exps per cell and
state in the backward). Gradients of shared inputs are reduced without atomics: a program sums
dB / dC over its own channels and writes one partial per channel block; dA / dD / d(delta_bias)
are per-(batch, channel) partials; the host sums partials in a fixed order.

Padding cells (past the map's edge) use Abar = 1 and x = 0, so they never change a carry.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _linear_combine(decay_left, value_left, decay_right, value_right):
    # Composition of two steps h -> decay * h + value, the left one applied first.
    return decay_left * decay_right, decay_right * value_left + value_right


@triton.jit
def _softplus(z):
    # log(1 + exp(z)) without overflow: max(z, 0) + log(1 + exp(-|z|)).
    return tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))


@triton.jit
def _sigmoid(z):
    e = tl.exp(-tl.abs(z))
    return tl.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def _biased_delta(delta_ptr, offsets, mask, bias, ACC: tl.constexpr):
    """z = delta + delta_bias at ``offsets`` (0 + bias where masked)."""
    return tl.load(delta_ptr + offsets, mask=mask, other=0.0).to(ACC) + bias


@triton.jit
def _step_size(z, SOFTPLUS: tl.constexpr):
    """dt = softplus(z), or z itself."""
    if SOFTPLUS:
        dt = _softplus(z)
    else:
        dt = z
    return dt


@triton.jit
def _row(tile, index, AXIS: tl.constexpr, SIZE: tl.constexpr):
    """The slice ``index`` of a 4-D tile along ``AXIS`` (2 = rows, 3 = columns)."""
    if AXIS == 2:
        sel = tl.arange(0, SIZE)[None, None, :, None] == index
    else:
        sel = tl.arange(0, SIZE)[None, None, None, :] == index
    return tl.sum(tl.where(sel, tile, 0.0), axis=AXIS)


@triton.jit
def _program_position(groups, n_chan_blocks):
    """(batch, group, channel block) of this program."""
    pid = tl.program_id(0).to(tl.int64)
    return pid // (n_chan_blocks * groups), (pid // n_chan_blocks) % groups, pid % n_chan_blocks


@triton.jit
def _row_offsets(batch, group, chan_block, dim, groups, chans_per_group, nstate, length,
                 BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """(chan_base, chan_ok, d_index, state_base, state_ok): offsets of the program's rows of
    u / delta (BLOCK_D,) and of B / C (BLOCK_N,), their validity, and the channel indices."""
    local = chan_block * BLOCK_D + tl.arange(0, BLOCK_D)
    chan_ok = local < chans_per_group
    d_index = group * chans_per_group + local
    chan_base = (batch * dim + d_index) * length
    states = tl.arange(0, BLOCK_N)
    state_ok = states < nstate
    state_base = ((batch * groups + group) * nstate + states) * length
    return chan_base, chan_ok, d_index, state_base, state_ok


@triton.jit
def scan2d_fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, y_ptr,
    above_ptr, left_ptr,
    dim, groups, chans_per_group, nstate, height, width, n_chan_blocks, n_tile_rows, n_tile_cols,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    STORE_Y: tl.constexpr, SAVE_CARRIES: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    ACC: tl.constexpr,
):
    """Forward sweep over one program's maps.

    ``above_ptr``: fp scratch (programs, slots, BLOCK_D, BLOCK_N, n_tile_cols * TILE_W) for the h
    row entering each tile row (slots = n_tile_rows when ``SAVE_CARRIES`` else 1; slot 0 unused
    when saving). ``left_ptr`` (``SAVE_CARRIES`` only): (programs, n_tile_rows, n_tile_cols,
    BLOCK_D, BLOCK_N, TILE_H) hh columns entering each tile.
    """
    length = height * width
    batch, group, chan_block = _program_position(groups, n_chan_blocks)
    chan_base, chan_ok, d_index, state_base, state_ok = _row_offsets(
        batch, group, chan_block, dim, groups, chans_per_group, nstate, length, BLOCK_D, BLOCK_N)
    pid = tl.program_id(0).to(tl.int64)

    d1 = tl.arange(0, BLOCK_D)
    n1 = tl.arange(0, BLOCK_N)
    h1 = tl.arange(0, TILE_H)
    w1 = tl.arange(0, TILE_W)
    chan3 = chan_base[:, None, None]
    chan_ok3 = chan_ok[:, None, None]
    state3 = state_base[:, None, None]
    state_ok3 = state_ok[:, None, None]
    A = tl.load(A_ptr + d_index[:, None] * nstate + n1[None, :],
                mask=chan_ok[:, None] & state_ok[None, :], other=0.0).to(ACC)
    A4 = A[:, :, None, None]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d_index, mask=chan_ok, other=0.0).to(ACC)[:, None, None]
    else:
        bias = 0.0
    if HAS_D:
        skip = tl.load(D_ptr + d_index, mask=chan_ok, other=0.0).to(ACC)[:, None, None]

    padded_width = n_tile_cols * TILE_W
    n_slots = n_tile_rows if SAVE_CARRIES else 1
    # (d, n, column) offsets of one scratch row; slot offsets are added per tile row.
    carry_row = (d1[:, None, None] * BLOCK_N + n1[None, :, None]) * padded_width + w1[None, None, :]
    carry_ok = chan_ok[:, None, None] & state_ok[None, :, None]
    above_base = above_ptr + pid * n_slots * BLOCK_D * BLOCK_N * padded_width
    left_col = (d1[:, None, None] * BLOCK_N + n1[None, :, None]) * TILE_H + h1[None, None, :]

    for tr in range(n_tile_rows):
        left_carry = tl.zeros([BLOCK_D, BLOCK_N, TILE_H], dtype=ACC)
        read_slot = tr if SAVE_CARRIES else 0
        write_slot = tr + 1 if SAVE_CARRIES else 0
        for tc in range(n_tile_cols):
            rows = tr * TILE_H + h1[:, None]
            cols = tc * TILE_W + w1[None, :]
            cell_ok = (rows < height) & (cols < width)
            pos = rows * width + cols
            chan_mask = chan_ok3 & cell_ok[None]

            tl.debug_barrier()  # the previous tile row's writes of this scratch row are visible
            above = tl.load(
                above_base + read_slot * BLOCK_D * BLOCK_N * padded_width + carry_row + tc * TILE_W,
                mask=carry_ok & (tr > 0), other=0.0)
            tl.debug_barrier()  # every thread has read the scratch row before it is overwritten
            if SAVE_CARRIES:
                tile_id = tr * n_tile_cols + tc
                tl.store(left_ptr + (pid * n_tile_rows * n_tile_cols + tile_id) * BLOCK_D * BLOCK_N * TILE_H
                         + left_col, left_carry, mask=carry_ok & (tc > 0))

            u = tl.load(u_ptr + chan3 + pos[None], mask=chan_mask, other=0.0).to(ACC)
            dt = _step_size(_biased_delta(delta_ptr, chan3 + pos[None], chan_mask, bias, ACC), SOFTPLUS)
            Bt = tl.load(B_ptr + state3 + pos[None], mask=state_ok3 & cell_ok[None], other=0.0).to(ACC)
            decay = tl.where(cell_ok[None, None], tl.exp(dt[:, None] * A4), 1.0)
            x = (dt * u)[:, None] * Bt[None]

            decay_h, hh = tl.associative_scan((decay, x), 3, _linear_combine)
            hh = hh + decay_h * left_carry[:, :, :, None]
            left_carry = _row(hh, TILE_W - 1, 3, TILE_W)
            decay_v, h = tl.associative_scan((decay, hh), 2, _linear_combine)
            h = h + decay_v * above[:, :, None, :]
            tl.store(above_base + write_slot * BLOCK_D * BLOCK_N * padded_width + carry_row + tc * TILE_W,
                     _row(h, TILE_H - 1, 2, TILE_H), mask=carry_ok & (tr + 1 < n_tile_rows))

            if STORE_Y:
                Ct = tl.load(C_ptr + state3 + pos[None], mask=state_ok3 & cell_ok[None], other=0.0).to(ACC)
                y = tl.sum(h * Ct[None], axis=1)
                if HAS_D:
                    y += skip * u
                tl.store(y_ptr + chan3 + pos[None], y, mask=chan_mask)


@triton.jit
def scan2d_bwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, dy_ptr,
    above_ptr, left_ptr, below_ptr,
    du_ptr, ddelta_ptr, dA_part_ptr, dB_part_ptr, dC_part_ptr, dD_part_ptr, dbias_part_ptr,
    dim, groups, chans_per_group, nstate, height, width, n_chan_blocks, n_tile_rows, n_tile_cols,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    ACC: tl.constexpr,
):
    """Reverse sweep: gradients of one program's maps from the carries saved by the forward kernel.

    ``above_ptr`` / ``left_ptr``: the carries written by ``scan2d_fwd_kernel`` with
    ``SAVE_CARRIES`` and the same tiling. ``below_ptr``: scratch (programs, BLOCK_D, BLOCK_N,
    n_tile_cols * TILE_W) for dL/dh of the first row of the tile row below. Outputs: du, ddelta
    (batch, dim, L); partials dA (batch, dim, N), dB / dC (batch, groups, n_chan_blocks, N, L),
    dD / d(delta_bias) (batch, dim).
    """
    length = height * width
    batch, group, chan_block = _program_position(groups, n_chan_blocks)
    chan_base, chan_ok, d_index, state_base, state_ok = _row_offsets(
        batch, group, chan_block, dim, groups, chans_per_group, nstate, length, BLOCK_D, BLOCK_N)
    pid = tl.program_id(0).to(tl.int64)

    d1 = tl.arange(0, BLOCK_D)
    n1 = tl.arange(0, BLOCK_N)
    h1 = tl.arange(0, TILE_H)
    w1 = tl.arange(0, TILE_W)
    chan3 = chan_base[:, None, None]
    chan_ok3 = chan_ok[:, None, None]
    state3 = state_base[:, None, None]
    state_ok3 = state_ok[:, None, None]
    param_mask = chan_ok[:, None] & state_ok[None, :]
    A = tl.load(A_ptr + d_index[:, None] * nstate + n1[None, :], mask=param_mask, other=0.0).to(ACC)
    A4 = A[:, :, None, None]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d_index, mask=chan_ok, other=0.0).to(ACC)[:, None, None]
    else:
        bias = 0.0
    if HAS_D:
        skip = tl.load(D_ptr + d_index, mask=chan_ok, other=0.0).to(ACC)[:, None, None]

    padded_width = n_tile_cols * TILE_W
    carry_row = (d1[:, None, None] * BLOCK_N + n1[None, :, None]) * padded_width + w1[None, None, :]
    carry_ok = chan_ok[:, None, None] & state_ok[None, :, None]
    slot_size = BLOCK_D * BLOCK_N * padded_width
    above_base = above_ptr + pid * n_tile_rows * slot_size
    below_base = below_ptr + pid * slot_size
    left_col = (d1[:, None, None] * BLOCK_N + n1[None, :, None]) * TILE_H + h1[None, None, :]
    # dB / dC partial of this channel block: (batch, group, chan_block, n, L).
    part_base = (((batch * groups + group) * n_chan_blocks + chan_block) * nstate + n1) * length
    part3 = part_base[:, None, None]

    dA_acc = tl.zeros([BLOCK_D, BLOCK_N], dtype=ACC)
    dD_acc = tl.zeros([BLOCK_D], dtype=ACC)
    dbias_acc = tl.zeros([BLOCK_D], dtype=ACC)

    for rr in range(n_tile_rows):
        tr = n_tile_rows - 1 - rr
        right_carry = tl.zeros([BLOCK_D, BLOCK_N, TILE_H], dtype=ACC)
        for cc in range(n_tile_cols):
            tc = n_tile_cols - 1 - cc
            rows = tr * TILE_H + h1[:, None]
            cols = tc * TILE_W + w1[None, :]
            cell_ok = (rows < height) & (cols < width)
            pos = rows * width + cols
            chan_mask = chan_ok3 & cell_ok[None]
            state_mask = state_ok3 & cell_ok[None]

            tl.debug_barrier()
            below = tl.load(below_base + carry_row + tc * TILE_W, mask=carry_ok & (rr > 0), other=0.0)
            tl.debug_barrier()
            above = tl.load(above_base + tr * slot_size + carry_row + tc * TILE_W,
                            mask=carry_ok & (tr > 0), other=0.0)
            tile_id = tr * n_tile_cols + tc
            left = tl.load(left_ptr + (pid * n_tile_rows * n_tile_cols + tile_id) * BLOCK_D * BLOCK_N * TILE_H
                           + left_col, mask=carry_ok & (tc > 0), other=0.0)

            u = tl.load(u_ptr + chan3 + pos[None], mask=chan_mask, other=0.0).to(ACC)
            dy = tl.load(dy_ptr + chan3 + pos[None], mask=chan_mask, other=0.0).to(ACC)
            z = _biased_delta(delta_ptr, chan3 + pos[None], chan_mask, bias, ACC)
            dt = _step_size(z, SOFTPLUS)
            Bt = tl.load(B_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
            Ct = tl.load(C_ptr + state3 + pos[None], mask=state_mask, other=0.0).to(ACC)
            decay = tl.where(cell_ok[None, None], tl.exp(dt[:, None] * A4), 1.0)
            x = (dt * u)[:, None] * Bt[None]

            # Recompute the forward states of this tile from its incoming carries.
            decay_h, hh = tl.associative_scan((decay, x), 3, _linear_combine)
            hh = hh + decay_h * left[:, :, :, None]
            decay_v, h = tl.associative_scan((decay, hh), 2, _linear_combine)
            h = h + decay_v * above[:, :, None, :]

            # Decays of the cell below / to the right (the adjoint recurrences' coefficients).
            below_mask = chan_ok3 & (rows + 1 < height) & (cols < width)
            dt_down = _step_size(_biased_delta(delta_ptr, chan3 + pos[None] + width, below_mask, bias, ACC),
                                 SOFTPLUS)
            right_mask = chan_ok3 & (rows < height) & (cols + 1 < width)
            dt_right = _step_size(_biased_delta(delta_ptr, chan3 + pos[None] + 1, right_mask, bias, ACC),
                                  SOFTPLUS)
            decay_down = tl.exp(dt_down[:, None] * A4)
            decay_right = tl.exp(dt_right[:, None] * A4)

            grad_out = dy[:, None] * Ct[None]
            carry_v, gh = tl.associative_scan((decay_down, grad_out), 2, _linear_combine, reverse=True)
            gh = gh + carry_v * below[:, :, None, :]
            tl.store(below_base + carry_row + tc * TILE_W, _row(gh, 0, 2, TILE_H),
                     mask=carry_ok & (tr > 0))
            carry_h, ghh = tl.associative_scan((decay_right, gh), 3, _linear_combine, reverse=True)
            ghh = ghh + carry_h * right_carry[:, :, :, None]
            right_carry = _row(ghh, 0, 3, TILE_W)

            # dL/dAbar * Abar: Abar * h[i-1, j] = h - hh and Abar * hh[i, j-1] = hh - x.
            grad_decay = gh * (h - hh) + ghh * (hh - x)
            dA_acc += tl.sum(tl.sum(grad_decay * dt[:, None], axis=3), axis=2)
            grad_xB = tl.sum(ghh * Bt[None], axis=1)
            du = grad_xB * dt
            ddt = tl.sum(grad_decay * A4, axis=1) + grad_xB * u
            if HAS_D:
                du += skip * dy
            if SOFTPLUS:
                ddelta = ddt * _sigmoid(z)
            else:
                ddelta = ddt
            ddelta = tl.where(chan_mask, ddelta, 0.0)
            dbias_acc += tl.sum(tl.sum(ddelta, axis=2), axis=1)
            dD_acc += tl.sum(tl.sum(dy * u, axis=2), axis=1)
            tl.store(du_ptr + chan3 + pos[None], du, mask=chan_mask)
            tl.store(ddelta_ptr + chan3 + pos[None], ddelta, mask=chan_mask)
            tl.store(dB_part_ptr + part3 + pos[None], tl.sum(ghh * (dt * u)[:, None], axis=0), mask=state_mask)
            tl.store(dC_part_ptr + part3 + pos[None], tl.sum(h * dy[:, None], axis=0), mask=state_mask)

    chan_out = batch * dim + d_index
    tl.store(dA_part_ptr + chan_out[:, None] * nstate + n1[None, :], dA_acc, mask=param_mask)
    if HAS_D:
        tl.store(dD_part_ptr + chan_out, dD_acc, mask=chan_ok)
    if HAS_BIAS:
        tl.store(dbias_part_ptr + chan_out, dbias_acc, mask=chan_ok)
