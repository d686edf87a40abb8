"""Launches of the Triton scan kernels (``_triton_kernels``), and the four-route scan as ``torch.library`` custom ops.

    vmamba2d::cross_selective_scan_2d_triton_fwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus,
                                                 routes, out_fp32, save_carries) -> (y, vcarry, hcarry)
    vmamba2d::cross_selective_scan_2d_triton_bwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus,
                                                 routes, vcarry, hcarry, dy)
                                                 -> (du, ddelta, dA, dB, dC, dD, ddelta_bias)

Shapes as :func:`vmamba2d.ops.cross_scan.cross_selective_scan_2d`; ``routes`` are
:attr:`~vmamba2d.ops.routes.Route.code` values. Every route is scanned in place on the map (no
route-order copies). With ``save_carries`` the forward also returns the states entering each
tile (each chunk for flat routes), fp32 (fp64 for fp64 inputs): the backward rebuilds every
tile's states from them instead of sweeping the forward again; without it they are empty. Both
ops have fake implementations (``torch.compile(fullgraph=True)`` and ``torch.export`` trace
them). u / delta / B / C / dy may be fp16, bf16, fp32 or fp64 (one dtype), A / D / delta_bias
fp32 (fp64 with fp64 inputs); kernels accumulate in fp32 (fp64) and write every gradient in its
input's dtype. On CPU tensors the kernels run only in Triton's interpreter (see ``scan_triton``).

``launch_forward`` / ``launch_backward`` run the kernels for both ops: this module's with one
parameter group, the single-route op of ``scan_triton`` with route code 0 and its groups of B / C
as maps (one configuration of the same kernels).
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import List, Optional

import torch

from .scan_triton import KERNELS_MODULE, Tiling, _acc_dtype, _check_op_inputs, _tl_dtype, choose_tiling

Tensor = torch.Tensor

CROSS_FWD_OP_NAME = "vmamba2d::cross_selective_scan_2d_triton_fwd"
CROSS_BWD_OP_NAME = "vmamba2d::cross_selective_scan_2d_triton_bwd"
# Elements of one [channels, states, rows, cols] register block (the same tiling in both
# directions: the backward reads the carries the forward saved), two per thread: 4 warps per
# program, more when N > 16 makes the block larger (a tile keeps at least 16 cells). Register
# caps: forward 128 (4 programs, 16 warps per SM on sm_80 / sm_90); backward 168 for several
# routes on 4 warps (3 programs, 12 warps), else 128 (one route's body, or programs of 8 / 16
# warps: 16 warps per SM); without spills up to N = 16 (uncapped, ptxas picks fewer registers and
# spills a few bytes, or more and fewer programs fit); at N = 32 / 64 the backward spills a few
# bytes (up to 20 B) rather than halve its resident warps. Chosen from compiles without a GPU
# (tests/test_scan_triton.py holds the figures), not timed on a GPU.
BLOCK_ELEMENTS = 256
ELEMENTS_PER_THREAD = 2
FWD_MAX_REGISTERS = 128
BWD_MAX_REGISTERS = 168
BWD_NARROW_MAX_REGISTERS = 128
# Channel blocks one program runs tile by tile (B / C loaded once per tile for all of them; the
# backward sums their dB / dC on chip): at most MAX_SETS, a divisor of the number of blocks, and
# only while the grid keeps MIN_PROGRAMS programs (about two waves of resident forward programs on
# an H100, 132 SMs x 4): a batch-1 scan such as 2DMambaMIL's keeps one block per program. Not
# timed on a GPU.
MAX_SETS = 8
MIN_PROGRAMS = 1024
ROUTE_BITS = 4


def _kernels() -> ModuleType:
    """The kernel module (imports triton on first use)."""
    return importlib.import_module(KERNELS_MODULE)


def route_constant(routes: List[int]) -> int:
    """The route codes packed into one integer, ``ROUTE_BITS`` per route (route k at bit 4k)."""
    packed = 0
    for k, code in enumerate(routes):
        packed |= int(code) << (ROUTE_BITS * k)
    return packed


def cross_tiling(dim: int, nstate: int, height: int, width: int) -> Tiling:
    """The tiling of one map (``VMAMBA2D_TRITON_TILE`` overrides the tile shape)."""
    return choose_tiling(dim, nstate, height, width, BLOCK_ELEMENTS)


def _carry_numels(maps: int, dim: int, nstate: int, height: int, width: int, num_routes: int,
                  save: bool) -> tuple[int, int]:
    """Elements of the (vertical, horizontal) carry buffers the forward kernel takes."""
    t = cross_tiling(dim, nstate, height, width)
    per_route = maps * t.n_chan_blocks * num_routes * t.block_d * t.block_n
    vertical = per_route * (t.n_tile_rows if save else 1) * t.n_tile_cols * t.tile_w
    horizontal = per_route * t.n_tile_rows * t.n_tile_cols * t.tile_h if save else 0
    return vertical, horizontal


def launch_config(t: Tiling, direction: str, num_routes: int) -> tuple[int, int]:
    """(num_warps, register cap) of the ``direction`` ("fwd" / "bwd") kernel's launch."""
    warps = max(4, t.block_d * t.block_n * t.tile_h * t.tile_w // (32 * ELEMENTS_PER_THREAD))
    if direction == "fwd":
        return warps, FWD_MAX_REGISTERS
    return warps, BWD_MAX_REGISTERS if warps == 4 and num_routes > 1 else BWD_NARROW_MAX_REGISTERS


def program_sets(n_chan_blocks: int, maps: int) -> int:
    """Channel blocks per program: the largest divisor of ``n_chan_blocks`` up to ``MAX_SETS`` that
    leaves at least ``MIN_PROGRAMS`` programs for ``maps`` maps (1 when none does)."""
    return max((s for s in range(1, MAX_SETS + 1)
                if n_chan_blocks % s == 0 and maps * n_chan_blocks // s >= MIN_PROGRAMS), default=1)


def _grid_args(u: Tensor, A: Tensor, t: Tiling) -> tuple:
    _, dim, height, width = u.shape
    n_chunks = -(-(height * width) // (t.tile_h * t.tile_w))
    return (dim, A.shape[1], height, width, t.n_chan_blocks, t.n_tile_rows, t.n_tile_cols, n_chunks)


def width_alignment(width: int) -> int:
    """The largest power of two up to 16 dividing ``width`` (a hint: every map row starts there)."""
    return min(16, width & -width) if width > 0 else 1


def _constexprs(routes: List[int], D: Optional[Tensor], delta_bias: Optional[Tensor], delta_softplus: bool,
                t: Tiling, acc: torch.dtype, width: int) -> dict:
    return dict(ROUTES=route_constant(routes), NUM_ROUTES=len(routes), HAS_D=D is not None,
                HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus), BLOCK_D=t.block_d,
                BLOCK_N=t.block_n, TILE_H=t.tile_h, TILE_W=t.tile_w, WIDTH_ALIGN=width_alignment(width),
                ACC=_tl_dtype(acc))


MAX_ROUTES = 15  # the packed route codes stay within 60 bits


def _check_routes(routes: List[int], delta: Tensor) -> None:
    if len(routes) != delta.shape[1] or any(not 0 <= int(c) < 1 << ROUTE_BITS for c in routes):
        raise ValueError(f"routes must be {delta.shape[1]} route codes in [0, 16), got {list(routes)}")
    if len(routes) > MAX_ROUTES:
        raise ValueError(f"backend 'triton' scans at most {MAX_ROUTES} routes in one op, got {len(routes)}")


def launch_forward(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                   delta_bias: Optional[Tensor], delta_softplus: bool, routes: List[int], out_fp32: bool,
                   save_carries: bool, param_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Run ``scan2d_fwd_kernel`` over ``maps`` maps: (y, vcarry, hcarry) as the four-route forward op.

    Inputs contiguous, validated: u (maps, dim, H, W), delta (maps, K, dim, H, W), A
    (param_groups * K * dim, N), B / C (maps, K, N, H, W), D / delta_bias (param_groups * K * dim,)
    or None; map m reads the parameter rows of group m % param_groups.
    """
    maps, dim, height, width = u.shape
    acc = _acc_dtype(u, delta, B, C)
    y = torch.empty(u.shape, device=u.device, dtype=torch.float32 if out_fp32 else u.dtype)
    v_numel, h_numel = _carry_numels(maps, dim, A.shape[1], height, width, len(routes), save_carries)
    vcarry = torch.empty(v_numel, device=u.device, dtype=acc)
    hcarry = torch.empty(h_numel, device=u.device, dtype=acc)
    if u.numel() == 0:
        return y, vcarry, hcarry
    t = cross_tiling(dim, A.shape[1], height, width)
    sets = program_sets(t.n_chan_blocks, maps)
    yacc = y if y.dtype == acc or len(routes) == 1 else torch.empty(u.shape, device=u.device, dtype=acc)
    hstate = torch.empty(maps * t.n_chan_blocks * t.block_d * t.block_n * t.tile_h, device=u.device, dtype=acc)
    grid = _grid_args(u, A, t)
    warps, max_registers = launch_config(t, "fwd", len(routes))
    _kernels().scan2d_fwd_kernel[(maps * (t.n_chan_blocks // sets),)](
        u, delta, A, B, C, D if D is not None else u, delta_bias if delta_bias is not None else u, y, yacc,
        vcarry, hcarry if save_carries else vcarry, hstate, *grid[:5], t.n_chan_blocks // sets, sets, *grid[5:],
        param_groups, SAVE_CARRIES=save_carries, **_constexprs(routes, D, delta_bias, delta_softplus, t, acc, width),
        num_warps=warps, maxnreg=max_registers,
    )
    if not save_carries:
        vcarry = vcarry.new_empty(0)
    return y, vcarry, hcarry


def empty_carries(maps: int, dim: int, nstate: int, height: int, width: int, num_routes: int, save: bool,
                   dtype: torch.dtype, like: Tensor) -> tuple[Tensor, Tensor]:
    """Empty (vcarry, hcarry) as ``launch_forward`` returns them (for fake implementations)."""
    v_numel, h_numel = _carry_numels(maps, dim, nstate, height, width, num_routes, True) if save else (0, 0)
    return like.new_empty(v_numel, dtype=dtype), like.new_empty(h_numel, dtype=dtype)


def launch_backward(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                    delta_bias: Optional[Tensor], delta_softplus: bool, routes: List[int], vcarry: Tensor,
                    hcarry: Tensor, dy: Tensor, param_groups: int) -> tuple[Tensor, ...]:
    """Run ``scan2d_bwd_kernel`` from the carries ``launch_forward`` saved: (du, ddelta, dA, dB, dC, dD,
    ddelta_bias), each shaped and typed like its input (dD / ddelta_bias empty when D / delta_bias is
    None). Inputs as ``launch_forward``; dy (maps, dim, H, W) contiguous."""
    maps, dim, height, width = u.shape
    num_routes, nstate = len(routes), A.shape[1]
    acc = _acc_dtype(u, delta, B, C)
    expected = _carry_numels(maps, dim, nstate, height, width, num_routes, True)
    if (vcarry.numel(), hcarry.numel()) != expected:
        raise ValueError(f"the saved carries have {vcarry.numel()} / {hcarry.numel()} elements, expected "
                         f"{expected[0]} / {expected[1]}: run the forward op with save_carries=True on these inputs")
    t = cross_tiling(dim, nstate, height, width)
    sets = program_sets(t.n_chan_blocks, maps)
    n_groups = t.n_chan_blocks // sets
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dB_part = torch.zeros(maps, num_routes, n_groups, nstate, height, width, device=u.device, dtype=acc)
    dC_part = torch.zeros_like(dB_part)
    dA_part = torch.zeros(maps, num_routes * dim, nstate, device=u.device, dtype=acc)
    dD_part = torch.zeros(maps, num_routes * dim, device=u.device, dtype=acc)
    dbias_part = torch.zeros_like(dD_part)
    if u.numel() > 0:
        blocks = maps * t.n_chan_blocks
        vadj = torch.empty(blocks * t.block_d * t.block_n * t.n_tile_cols * t.tile_w, device=u.device, dtype=acc)
        hadj = torch.empty(blocks * t.block_d * t.block_n * t.tile_h, device=u.device, dtype=acc)
        duacc = du if du.dtype == acc or num_routes == 1 else torch.empty(u.shape, device=u.device, dtype=acc)
        grid = _grid_args(u, A, t)
        warps, max_registers = launch_config(t, "bwd", num_routes)
        _kernels().scan2d_bwd_kernel[(maps * n_groups,)](
            u, delta, A, B, C, D if D is not None else u, delta_bias if delta_bias is not None else u, dy,
            vcarry, hcarry, vadj, hadj, du, duacc, ddelta, dA_part, dB_part, dC_part, dD_part, dbias_part,
            *grid[:5], n_groups, sets, *grid[5:], param_groups,
            **_constexprs(routes, D, delta_bias, delta_softplus, t, acc, width),
            num_warps=warps, maxnreg=max_registers,
        )
    else:
        du.zero_()
        ddelta.zero_()
    # Fixed-order sums of the per-program partials: deterministic, no atomics. Maps of one
    # parameter group are summed over the batch (map m = batch index * param_groups + group).
    rows = param_groups * num_routes * dim
    dB = dB_part.sum(dim=2).to(B.dtype)
    dC = dC_part.sum(dim=2).to(C.dtype)
    dA = dA_part.view(maps // param_groups, rows, nstate).sum(dim=0).to(A.dtype)
    dD = dD_part.view(maps // param_groups, rows).sum(dim=0).to(D.dtype) if D is not None else A.new_empty(0)
    dbias = (dbias_part.view(maps // param_groups, rows).sum(dim=0).to(delta_bias.dtype) if delta_bias is not None
             else A.new_empty(0))
    return du, ddelta, dA, dB, dC, dD, dbias


@torch.library.custom_op(CROSS_FWD_OP_NAME, mutates_args=())
def cross_selective_scan_2d_triton_fwd(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    routes: List[int],
    out_fp32: bool,
    save_carries: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Kernel forward: (y, vcarry, hcarry). y (batch, dim, H, W), fp32 if ``out_fp32`` else u's
    dtype; the carries are 1-D buffers for the backward (empty unless ``save_carries``).

    Inputs contiguous: u (batch, dim, H, W), delta (batch, K, dim, H, W), A (K * dim, N), B / C
    (batch, K, N, H, W), D / delta_bias (K * dim,) or None.
    """
    _check_op_inputs(u, A, B)
    _check_routes(routes, delta)
    return launch_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32, save_carries, 1)


@cross_selective_scan_2d_triton_fwd.register_fake
def _fwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32, save_carries):
    batch, dim, height, width = u.shape
    carries = empty_carries(batch, dim, A.shape[1], height, width, len(routes), save_carries,
                            _acc_dtype(u, delta, B, C), u)
    return (u.new_empty(u.shape, dtype=torch.float32 if out_fp32 else u.dtype), *carries)


@torch.library.custom_op(CROSS_BWD_OP_NAME, mutates_args=())
def cross_selective_scan_2d_triton_bwd(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    routes: List[int],
    vcarry: Tensor,
    hcarry: Tensor,
    dy: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Kernel backward: (du, ddelta, dA, dB, dC, dD, ddelta_bias), each shaped and typed like its
    input (dD / ddelta_bias empty when D / delta_bias is None). ``vcarry`` / ``hcarry``: what the
    forward returned with ``save_carries``; dy (batch, dim, H, W) contiguous."""
    _check_op_inputs(u, A, B)
    _check_routes(routes, delta)
    return launch_backward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, vcarry, hcarry, dy, 1)


@cross_selective_scan_2d_triton_bwd.register_fake
def _bwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, vcarry, hcarry, dy):
    optional = tuple(torch.empty_like(t) if t is not None else A.new_empty(0) for t in (D, delta_bias))
    return tuple(torch.empty_like(t) for t in (u, delta, A, B, C)) + optional


def _setup_context(ctx, inputs, output) -> None:
    u, delta, A, B, C, D, delta_bias, delta_softplus, routes, _, _ = inputs
    _, vcarry, hcarry = output
    ctx.mark_non_differentiable(vcarry, hcarry)
    ctx.save_for_backward(u, delta, A, B, C, D, delta_bias, vcarry, hcarry)
    ctx.scan_args = (delta_softplus, routes)


def _backward(ctx, dy: Tensor, _dvcarry: Tensor, _dhcarry: Tensor):
    u, delta, A, B, C, D, delta_bias, vcarry, hcarry = ctx.saved_tensors
    du, ddelta, dA, dB, dC, dD, dbias = cross_selective_scan_2d_triton_bwd(
        u, delta, A, B, C, D, delta_bias, *ctx.scan_args, vcarry, hcarry, dy.contiguous()
    )
    return (
        du, ddelta, dA, dB, dC,
        dD if D is not None else None,
        dbias if delta_bias is not None else None,
        None, None, None, None,
    )


cross_selective_scan_2d_triton_fwd.register_autograd(_backward, setup_context=_setup_context)


def cross_selective_scan_2d_triton(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    routes: List[int],
    out_dtype: torch.dtype,
) -> Tensor:
    """Four-route scan on the Triton kernels (differentiable); shapes as
    :func:`vmamba2d.ops.cross_scan.cross_selective_scan_2d` (inputs validated there), ``routes``
    as route codes. The forward saves tile carries for the backward only when a gradient is
    needed. Returns y (batch, dim, H, W) in ``out_dtype``."""
    scan_dtype = u.dtype
    param_dtype = torch.float64 if scan_dtype == torch.float64 else torch.float32

    def prepare(t: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
        return None if t is None else t.to(dtype).contiguous()

    tensors = (u, delta, A, B, C, D, delta_bias)
    save_carries = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    out_fp32 = out_dtype == torch.float32 and scan_dtype != torch.float32
    y, _, _ = cross_selective_scan_2d_triton_fwd(
        prepare(u, scan_dtype), prepare(delta, scan_dtype), prepare(A, param_dtype), prepare(B, scan_dtype),
        prepare(C, scan_dtype), prepare(D, param_dtype), prepare(delta_bias, param_dtype), bool(delta_softplus),
        [int(c) for c in routes], out_fp32, save_carries,
    )
    return y.to(out_dtype)

