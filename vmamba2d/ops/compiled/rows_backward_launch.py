"""Launching the RS backward of the single-route scan along any 2D route (codes 0-7, N = 1;
csrc/cuda/scan2d_rows_backward.cuh) and the RS forward that saves its band carries, through the NVRTC
launcher.

The backward takes the carries -- fp32 h of every 8th row, (batch * dim, (H - 1) // 8, W) -- from
:func:`launch_forward_save`; it writes du, ddelta and fp32 partials of the reduced gradients, which
:func:`reduce_partials` sums in a fixed order (dB / dC over the warps' channel chunks, dA / dD /
ddelta_bias over the batch): the gradients are bitwise the same on every run.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from vmamba2d.ops.compiled import rows_plan
from vmamba2d.ops.compiled.cuda_kernels import ROWS_DTYPE_CODES, KernelSpec
from vmamba2d.ops.compiled.rows_launch import rows_params

SOURCE = "entries/scan2d_rows_backward_entry.cu"
BACKWARD_SYMBOL = "vmamba2d_rows_backward"
SAVE_SYMBOL = "vmamba2d_rows_forward_save"
CROSS_SAVE_SYMBOL = "vmamba2d_rows_cross_save"
BAND_ROWS = 8  # kBandRows of csrc/cuda/scan2d_rows_common.h
MAX_VEC = 4  # the backward's widest lane (its band buffers are sized for it)
WARPS_PER_BLOCK = rows_plan.ROWS_THREADS // rows_plan.WARP_LANES
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class RowsBackwardParams(ctypes.Structure):
    """csrc/cuda/scan2d_rows_backward.cuh ``struct RowsBackwardParams``, field for field."""

    _fields_ = [
        ("u", ctypes.c_void_p), ("delta", ctypes.c_void_p), ("B", ctypes.c_void_p), ("C", ctypes.c_void_p),
        ("A", ctypes.c_void_p), ("D", ctypes.c_void_p), ("delta_bias", ctypes.c_void_p), ("dy", ctypes.c_void_p),
        ("carries", ctypes.c_void_p), ("du", ctypes.c_void_p), ("ddelta", ctypes.c_void_p),
        ("dBC_part", ctypes.c_void_p), ("dA_part", ctypes.c_void_p),
        ("dD_part", ctypes.c_void_p), ("ddb_part", ctypes.c_void_p), ("du_sum", ctypes.c_void_p),
        ("delta_planes", ctypes.c_longlong), ("bc_planes", ctypes.c_longlong),
        ("batch", ctypes.c_int), ("dim", ctypes.c_int), ("groups", ctypes.c_int), ("height", ctypes.c_int),
        ("width", ctypes.c_int), ("seg_lanes", ctypes.c_int), ("maps_per_warp", ctypes.c_int),
        ("chunks", ctypes.c_int), ("softplus", ctypes.c_int), ("dy_fp32", ctypes.c_int), ("from_bottom", ctypes.c_int),
        ("du_fp32", ctypes.c_int),
    ]


def backward_plan(elem_bytes: int, dy_bytes: int, width: int, aligned_bytes: int = 16) -> Optional[rows_plan.RowsPlan]:
    """The backward's lane layout for a map width, or None where it does not apply (W > 32 lanes of 4).

    V: the widest of 4, 2, 1 that divides W with ceil(W / V) <= 32 lanes, else the narrowest that fits
    (a ragged last lane; 33 <= W <= 128 only). Vector accesses where V > 1 divides W and ``aligned_bytes`` (alignment of
    u, delta, B, C, dy) holds a vector of the inputs and of dy; fp32 carries and partials are the
    launcher's own allocations.
    """
    if elem_bytes not in (2, 4) or dy_bytes not in (2, 4):
        raise ValueError(f"elem_bytes, dy_bytes: expected 2 or 4, got {elem_bytes}, {dy_bytes}")
    if not 1 <= width <= rows_plan.WARP_LANES * MAX_VEC:
        return None
    fits = [v for v in (4, 2, 1) if -(-width // v) <= rows_plan.WARP_LANES]
    vec = next((v for v in fits if width % v == 0), fits[-1])
    vector = (vec > 1 and width % vec == 0 and aligned_bytes % min(16, vec * elem_bytes) == 0
              and aligned_bytes % min(16, vec * dy_bytes) == 0)
    return rows_plan.layout(width, vec, vec if vector else 1)


def channel_chunks(dim: int, groups: int, maps_per_warp: int) -> int:
    """Warps per (batch, group): ceil(channels per group / maps per warp)."""
    return -(-(dim // groups) // maps_per_warp)


def carry_rows(height: int) -> int:
    """Saved rows per map: (H - 1) // 8 (every band's top but the first one's)."""
    return (height - 1) // BAND_ROWS


def check_route_layout(u: torch.Tensor, delta: torch.Tensor, B: torch.Tensor, C: torch.Tensor, routes: int,
                       route_index: int) -> None:
    """ValueError unless delta (batch, routes * dim, L) and B, C (batch, routes * groups, 1, L) hold
    ``routes`` routes' planes for u (batch, dim, L) and 0 <= route_index < routes."""
    if not 0 <= route_index < routes:
        raise ValueError(f"route_index: expected [0, {routes}), got {route_index}")
    batch, dim, length = u.shape
    if delta.shape != (batch, routes * dim, length):
        raise ValueError(f"delta: expected {(batch, routes * dim, length)} ({routes} routes' planes), got "
                         f"{tuple(delta.shape)}")
    if (B.dim() != 4 or B.shape[0] != batch or B.shape[1] % routes or B.shape[1] == 0 or B.shape[2:] != (1, length)
            or C.shape != B.shape):
        raise ValueError(f"B, C: expected (batch, {routes} * groups, 1, L) = ({batch}, {routes} * groups, 1, {length}), "
                         f"got {tuple(B.shape)} and {tuple(C.shape)}")


def check_route(route: int) -> int:
    """``route`` if it is a 2D route code (0-7: the routes with an RS backward), else ValueError."""
    if isinstance(route, bool) or not isinstance(route, int) or not 0 <= route < 8:
        raise ValueError(f"route: expected a 2D route code in [0, 8), got {route!r}")
    return route


def du_in_fp32(dtype: torch.dtype, du_fp32: bool) -> bool:
    """Whether the backward's du is an fp32 tensor of its own type: asked for (``du_fp32``) with 2-byte
    inputs (fp32 inputs have an fp32 du either way, and compile no du type)."""
    return bool(du_fp32) and dtype != torch.float32


def backward_spec(plan: rows_plan.RowsPlan, dtype: torch.dtype, route: int = 0, du_fp32: bool = False) -> KernelSpec:
    """The NVRTC entry of the backward for a plan, input type, 2D route code (all three bits compiled)
    and du type (``du_fp32``: fp32, a 2-byte instance's running-sum form; name suffix "f")."""
    compiled = check_route(route)
    wide = du_in_fp32(dtype, du_fp32)
    defines = (("VMAMBA2D_RSB_DTYPE", ROWS_DTYPE_CODES[_DTYPE_NAMES[dtype]]), ("VMAMBA2D_RSB_VEC", plan.vec),
               ("VMAMBA2D_RSB_LOAD", plan.load), ("VMAMBA2D_RSB_STEPS", plan.scan_steps),
               ("VMAMBA2D_RSB_MAPS", plan.maps_per_warp), ("VMAMBA2D_RSB_ROUTE", compiled),
               ("VMAMBA2D_RSB_DU_F32", int(wide)))
    return KernelSpec(name=f"rows_backward.{_DTYPE_NAMES[dtype]}.v{plan.vec}l{plan.load}s{plan.scan_steps}"
                           f"m{plan.maps_per_warp}r{compiled}{'f' if wide else ''}",
                      source=SOURCE, symbol=BACKWARD_SYMBOL, name_expression=False,
                      defines=tuple((name, str(value)) for name, value in defines))


def save_spec(plan: rows_plan.RowsPlan, dtype: torch.dtype, route: int = 0) -> KernelSpec:
    """The NVRTC entry of the forward that saves the band carries, for a plan, input type and 2D route
    (from_bottom, bit 2, is a field of its parameters, as for the RS forward)."""
    compiled = check_route(route) & ~2
    defines = (("VMAMBA2D_RSB_SAVE", 1), ("VMAMBA2D_RSB_DTYPE", ROWS_DTYPE_CODES[_DTYPE_NAMES[dtype]]),
               ("VMAMBA2D_RSB_VEC", plan.vec), ("VMAMBA2D_RSB_LOAD", plan.load),
               ("VMAMBA2D_RSB_PREFETCH", plan.prefetch), ("VMAMBA2D_RSB_STEPS", plan.scan_steps),
               ("VMAMBA2D_RSB_ROUTE", compiled))
    return KernelSpec(
        name=f"rows_forward_save.{_DTYPE_NAMES[dtype]}.v{plan.vec}l{plan.load}p{plan.prefetch}s{plan.scan_steps}"
             f"r{compiled}",
        source=SOURCE, symbol=SAVE_SYMBOL, name_expression=False,
        defines=tuple((name, str(value)) for name, value in defines))


def cross_save_spec(plan: rows_plan.RowsPlan, dtype: torch.dtype) -> KernelSpec:
    """The NVRTC entry of the four cross routes' band carries in one launch (plan.vec must divide W)."""
    defines = (("VMAMBA2D_RSB_SAVE", 2), ("VMAMBA2D_RSB_DTYPE", ROWS_DTYPE_CODES[_DTYPE_NAMES[dtype]]),
               ("VMAMBA2D_RSB_VEC", plan.vec), ("VMAMBA2D_RSB_LOAD", plan.load),
               ("VMAMBA2D_RSB_STEPS", plan.scan_steps))
    return KernelSpec(name=f"rows_cross_save.{_DTYPE_NAMES[dtype]}.v{plan.vec}l{plan.load}s{plan.scan_steps}",
                      source=SOURCE, symbol=CROSS_SAVE_SYMBOL, name_expression=False,
                      defines=tuple((name, str(value)) for name, value in defines))


def launch_cross_save(launcher, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                      C: torch.Tensor, D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor], softplus: bool,
                      height: int, width: int, plan: rows_plan.RowsPlan) -> torch.Tensor:
    """The band carries of VMamba's four cross routes (CROSS_ROUTES, codes 0, 4, 3, 7, in that order)
    from one launch on the current stream: fp32 (4, batch * dim, carry_rows(H), W), route k's as
    :func:`launch_forward_save` stores them for that route alone (its
    :func:`launch_rows_backward` input).

    u (batch, dim, L); delta (batch, 4 * dim, L); B, C (batch, 4 * groups, 1, L) (C is not read); A
    (4 * dim, 1); D (not read), delta_bias (4 * dim,) or None; contiguous, A / delta_bias fp32;
    ``plan`` from :func:`backward_plan` with plan.vec dividing W.

    Raises:
        ValueError: a plan whose V does not divide W, or inputs not in the four-route layout.
    """
    if width % plan.vec:
        raise ValueError(f"plan: V = {plan.vec} must divide W = {width} (the cross carries take no ragged lane)")
    check_route_layout(u, delta, B, C, 4, 0)
    batch, dim, _ = u.shape
    if A.shape != (4 * dim, 1) or (delta_bias is not None and delta_bias.shape != (4 * dim,)):
        raise ValueError(f"A, delta_bias: expected {(4 * dim, 1)} and {(4 * dim,)} or None, got {tuple(A.shape)} and "
                         f"{None if delta_bias is None else tuple(delta_bias.shape)}")
    spec = cross_save_spec(plan, u.dtype)
    carries = torch.empty((4, batch * dim, carry_rows(height), width), dtype=torch.float32, device=u.device)
    if u.numel() == 0 or carries.numel() == 0:
        return carries
    params = rows_params(u, delta, A, B, C, None, delta_bias, None, softplus, height, width, plan, 4, 0)
    launcher.launch(spec, (plan.blocks(batch, dim, WARPS_PER_BLOCK), 1, 1), rows_plan.ROWS_THREADS, 0,
                    [bytes(params), bytes(ctypes.c_void_p(carries.data_ptr()))])
    return carries


def launch_forward_save(launcher, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                        C: torch.Tensor, D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor],
                        softplus: bool, height: int, width: int, out_fp32: bool,
                        plan: rows_plan.RowsPlan, route: int = 0, store_y: bool = True, routes: int = 1,
                        route_index: int = 0) -> tuple[Optional[torch.Tensor], torch.Tensor]:
    """(y, carries): the RS forward along the 2D route ``route`` (code 0-7) on the current stream, y
    (batch, dim, L) fp32 if ``out_fp32`` else u's type (None with ``store_y`` False: the kernel writes
    the carries only), carries fp32 (batch * dim, carry_rows(H), W) for :func:`launch_rows_backward`
    with the same route.

    u (batch, dim, L); delta (batch, routes * dim, L); B, C (batch, routes * groups, 1, L) -- a
    multi-route op's layout, the pass reading route ``route_index``'s planes in place; A (dim, 1); D,
    delta_bias (dim,) or None; contiguous, A / D / delta_bias fp32, cells in map order; ``plan`` from
    :func:`backward_plan` or rows_plan.rows_plan.

    Raises:
        ValueError: delta, B or C not in the layout of ``routes`` routes, or route_index outside it.
    """
    spec = save_spec(plan, u.dtype, route)
    check_route_layout(u, delta, B, C, routes, route_index)
    batch, dim, _ = u.shape
    y = torch.empty(u.shape, dtype=torch.float32 if out_fp32 else u.dtype, device=u.device) if store_y else None
    carries = torch.empty((batch * dim, carry_rows(height), width), dtype=torch.float32, device=u.device)
    if u.numel() == 0:
        return y, carries
    params = rows_params(u, delta, A, B, C, D, delta_bias, y, softplus, height, width, plan, routes, route_index)
    params.from_bottom = int(bool(route & 2))
    pointer = ctypes.c_void_p(carries.data_ptr() if carries.numel() else None)
    launcher.launch(spec, (plan.blocks(batch, dim, WARPS_PER_BLOCK), 1, 1),
                    rows_plan.ROWS_THREADS, 0, [bytes(params), bytes(pointer)])
    return y, carries


def launch_rows_backward(launcher, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                         C: torch.Tensor, D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor],
                         softplus: bool, height: int, width: int, dy: torch.Tensor, carries: torch.Tensor,
                         plan: rows_plan.RowsPlan, route: int = 0,
                         ddelta_out: Optional[torch.Tensor] = None, du_sum: Optional[torch.Tensor] = None,
                         du_fp32: bool = False, routes: int = 1, route_index: int = 0) -> tuple:
    """(du, ddelta, dA, dB, dC, dD, ddelta_bias) of the scan along the 2D route ``route`` at N = 1,
    from the RS backward on the current stream and :func:`reduce_partials` (inputs as
    :func:`launch_forward_save`, the same ``routes`` / ``route_index``; dy (batch, dim, L) in u's type
    or fp32; carries from launch_forward_save with the same inputs and route; dB, dC (batch, groups,
    1, L) of the route's planes). ddelta has delta's shape, the kernel writing route ``route_index``'s
    planes only: into ``ddelta_out``, a contiguous tensor shaped and typed like delta (a multi-route
    op's gradient, each route's pass filling its planes), or by default a new one (its other routes'
    planes uninitialised).

    du is this route's du plus ``du_sum`` (a contiguous fp32 (batch, dim, L) running sum of other
    routes' du, or None), in fp32 with ``du_fp32`` (else in u's type, rounded once); with both, the
    kernel adds into ``du_sum`` in place and returns it.

    Raises:
        ValueError: a route that is not 2D, delta / B / C not in the layout of ``routes`` routes, carries,
            dy, ddelta_out or du_sum of the wrong shape / type, or 2^31 warps or more.
    """
    spec = backward_spec(plan, u.dtype, route, du_fp32)
    check_route_layout(u, delta, B, C, routes, route_index)
    batch, dim, length = u.shape
    groups = B.shape[1] // routes
    if tuple(carries.shape) != (batch * dim, carry_rows(height), width) or carries.dtype != torch.float32:
        raise ValueError(f"carries: expected fp32 of shape {(batch * dim, carry_rows(height), width)} (the saving "
                         f"forward's), got {carries.dtype} {tuple(carries.shape)}")
    if dy.shape != u.shape or dy.dtype not in (u.dtype, torch.float32) or not dy.is_contiguous():
        raise ValueError(f"dy: expected contiguous {tuple(u.shape)} in {u.dtype} or float32, got {dy.dtype} "
                         f"{tuple(dy.shape)}")
    chunks = channel_chunks(dim, groups, plan.maps_per_warp)
    if batch * groups * chunks >= 2 ** 31:
        raise ValueError(f"u: {batch} x {dim} maps need {batch * groups * chunks} warps, more than the kernel's "
                         "32-bit item index")
    f32 = {"dtype": torch.float32, "device": u.device}
    if ddelta_out is not None and (ddelta_out.shape != delta.shape or ddelta_out.dtype != delta.dtype
                                   or not ddelta_out.is_contiguous() or ddelta_out.device != delta.device):
        raise ValueError(f"ddelta_out: expected a contiguous {delta.dtype} tensor of shape {tuple(delta.shape)} on "
                         f"{delta.device}, got {ddelta_out.dtype} {tuple(ddelta_out.shape)} on {ddelta_out.device}")
    if du_sum is not None and (du_sum.shape != u.shape or du_sum.dtype != torch.float32
                               or not du_sum.is_contiguous() or du_sum.device != u.device):
        raise ValueError(f"du_sum: expected a contiguous float32 tensor of shape {tuple(u.shape)} on {u.device}, got "
                         f"{du_sum.dtype} {tuple(du_sum.shape)} on {du_sum.device}")
    wide = du_in_fp32(u.dtype, du_fp32)
    if du_sum is not None and (du_fp32 or u.dtype == torch.float32):
        du = du_sum
    else:
        du = torch.empty(u.shape, dtype=torch.float32 if wide else u.dtype, device=u.device)
    ddelta = torch.empty_like(delta) if ddelta_out is None else ddelta_out
    dBC_part = torch.empty((2, batch, groups, chunks, length), **f32)
    dA_part = torch.empty((batch, dim), **f32)
    dD_part = torch.empty((batch, dim), **f32) if D is not None else None
    ddb_part = torch.empty((batch, dim), **f32) if delta_bias is not None else None
    if u.numel() > 0:
        ptr = lambda t: None if t is None or t.numel() == 0 else t.data_ptr()  # noqa: E731
        delta_skip = route_index * dim * length * delta.element_size()
        bc_skip = route_index * groups * length * B.element_size()
        params = RowsBackwardParams(
            ptr(u), ptr(delta) + delta_skip, ptr(B) + bc_skip, ptr(C) + bc_skip, ptr(A), ptr(D), ptr(delta_bias),
            ptr(dy), ptr(carries), ptr(du), ptr(ddelta) + delta_skip, ptr(dBC_part), ptr(dA_part), ptr(dD_part),
            ptr(ddb_part), ptr(du_sum), routes * dim, routes * groups, batch, dim, groups, height, width, plan.seg_lanes, plan.maps_per_warp, chunks, int(bool(softplus)),
            int(dy.dtype == torch.float32 and u.dtype != torch.float32), int(bool(route & 2)), int(wide))
        items = batch * groups * chunks
        launcher.launch(spec, (-(-items // WARPS_PER_BLOCK), 1, 1), rows_plan.ROWS_THREADS,
                        0, [bytes(params)])
    else:
        for t in (dBC_part, dA_part, dD_part, ddb_part):
            if t is not None:
                t.zero_()
    return reduce_partials(du, ddelta, dBC_part, dA_part, dD_part, ddb_part, B.dtype)


def reduce_partials(du: torch.Tensor, ddelta: torch.Tensor, dBC_part: torch.Tensor, dA_part: torch.Tensor,
                    dD_part: Optional[torch.Tensor], ddb_part: Optional[torch.Tensor], bc_dtype: torch.dtype) -> tuple:
    """The op's gradients from the kernel's outputs, summed in a fixed order (bitwise reproducible).

    dBC_part (2, batch, groups, chunks, L) -> dB, dC (batch, groups, 1, L) in ``bc_dtype``;
    dA_part (batch, dim) -> dA (dim, 1); dD_part / ddb_part (batch, dim) or None -> (dim,) or None.
    """
    dB, dC = (part.sum(2, keepdim=True).to(bc_dtype) for part in dBC_part)
    dA = dA_part.sum(0).unsqueeze(1)
    dD = None if dD_part is None else dD_part.sum(0)
    ddb = None if ddb_part is None else ddb_part.sum(0)
    return du, ddelta, dA, dB, dC, dD, ddb
