"""The Triton row-streaming forward (RS) of the single-route 2D scan at N = 1 (the models' path).

One program scans ``BLOCK_M`` consecutive channels of one map (a (batch, group of B / C) pair, so
the channels share B and C) and walks the map's rows top-down (route code 0, the single-route
op; the other 2D route codes walk the rows or columns in their order). Per row it loads u, delta
and the row of B / C as ``[BLOCK_M, BLOCK_W]`` tiles (``BLOCK_W`` the power of two >= W; columns
past W are masked and scan as the identity step), and in fp32:

    dt   = softplus(delta + delta_bias)          (or delta + delta_bias)
    Abar = exp(dt * A)
    hh   = scan of (Abar, dt * B * u) along the row   (tl.associative_scan, combine below)
    h    = Abar * h_prev + hh                     (h_prev: the previous row's h, carried in the loop)
    y    = C * h + D * u                          (stored in y's dtype)

so nothing but u, delta, B, C in and y out touches memory: no tile carries, no scratch, no barrier
in the loop. Imported (triton with it) on the first launch by :mod:`~vmamba2d.ops.triton.rows_plan`,
which holds the rule choosing this kernel and its launch.

The launch picks ``BLOCK_M`` and ``num_warps`` among ``rows_plan.tuning_configs`` (tied so that the
row layout stays the same) with vmamba2d.ops.tuning on the first call per key.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _row_combine(decay_left, value_left, decay_right, value_right):
    # Two steps h -> decay * h + value composed, the left one (earlier along the row) first.
    return decay_left * decay_right, decay_right * value_left + value_right


@triton.jit
def rows_fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, y_ptr,
    chans, param_groups, height, width,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, ROUTE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """Grid (maps, cdiv(chans, BLOCK_M)). u, delta, y (maps, chans, H, W); B, C (maps, H, W);
    A, D, delta_bias (param_groups * chans,): map m reads the rows of group m % param_groups.

    ``ROUTE``: a 2D route code (0-7, :class:`vmamba2d.ops.routes.Route`) as index arithmetic: the
    loop walks lines (the map's rows, or its columns when columns-first) and scans each along
    its cells; a flip reverses the lines or the cells of a line."""
    COLUMNS_FIRST: tl.constexpr = (ROUTE & 4) != 0
    if COLUMNS_FIRST:
        n_lines, line_len, line_step, cell_step = width, height, 1, width
        REVERSE_LINES: tl.constexpr = (ROUTE & 1) != 0
        REVERSE_CELLS: tl.constexpr = (ROUTE & 2) != 0
    else:
        n_lines, line_len, line_step, cell_step = height, width, width, 1
        REVERSE_LINES: tl.constexpr = (ROUTE & 2) != 0
        REVERSE_CELLS: tl.constexpr = (ROUTE & 1) != 0
    map_index = tl.program_id(0)
    chan = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    lane = tl.arange(0, BLOCK_W)
    chan_ok = chan < chans
    col_ok = lane < line_len
    if REVERSE_CELLS:
        col = (line_len - 1 - lane) * cell_step
    else:
        col = lane * cell_step
    mask = chan_ok[:, None] & col_ok[None, :]
    length = height * width
    # int64 offsets: maps * chans * L exceeds 2**31 at batch 128 on the largest maps.
    plane = (map_index * chans + chan).to(tl.int64) * length
    param = (map_index % param_groups) * chans + chan
    A = tl.load(A_ptr + param, mask=chan_ok, other=0.0).to(tl.float32)[:, None]
    if HAS_D:
        skip = tl.load(D_ptr + param, mask=chan_ok, other=0.0).to(tl.float32)[:, None]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + param, mask=chan_ok, other=0.0).to(tl.float32)[:, None]
    bc_row = B_ptr + map_index.to(tl.int64) * length
    cc_row = C_ptr + map_index.to(tl.int64) * length
    offsets = plane[:, None] + col[None, :]
    h = tl.zeros((BLOCK_M, BLOCK_W), dtype=tl.float32)
    for line in range(n_lines):
        if REVERSE_LINES:
            row = (n_lines - 1 - line) * line_step
        else:
            row = line * line_step
        cells = offsets + row
        u = tl.load(u_ptr + cells, mask=mask, other=0.0).to(tl.float32)
        z = tl.load(delta_ptr + cells, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            z = z + bias
        if SOFTPLUS:
            # softplus(z) = max(z, 0) + log(1 + exp(-|z|)), as the tiled kernels compute it.
            dt = tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))
        else:
            dt = z
        Bv = tl.load(bc_row + row + col, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        Cv = tl.load(cc_row + row + col, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        decay = tl.where(mask, tl.exp(dt * A), 1.0)
        _, hh = tl.associative_scan((decay, dt * Bv * u), 1, _row_combine)
        h = decay * h + hh
        y = Cv * h
        if HAS_D:
            y = y + skip * u
        tl.store(y_ptr + cells, y.to(y_ptr.dtype.element_ty), mask=mask)

