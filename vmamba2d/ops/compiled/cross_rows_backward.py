"""The four-route op's backward at N = 1 as RS route passes: per route one saving forward (its band
carries) and one RS backward (csrc/cuda/scan2d_rows_backward.cuh, every 2D route), the routes'
gradients put back into the four-route layout and du summed over the routes in fp32.

The passes are arguments, so the same composition runs the NVRTC kernels on a GPU
(:func:`nvrtc_passes`) and their host emulation in the tests. The NVRTC path's four-route backward
takes it where :func:`backward_design` says so: the rule's row 0 (vmamba2d.ops.plan) and the
``VMAMBA2D_SCAN_BACKWARD=auto`` opt-in -- unset, the op keeps the v3 backward until a GPU run has
measured this against it (dev/gpu/check_rows_backward.py --cross; docs/kernels.md, "RS backward").
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from vmamba2d.ops import plan as scan_plan
from vmamba2d.ops.compiled import rows_backward_launch as rbl
from vmamba2d.ops.compiled.cross_rows_launch import scan_call
from vmamba2d.ops.compiled.rows_plan import alignment
from vmamba2d.ops.routes import CROSS_ROUTES

Tensor = torch.Tensor
# save_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, route, routes, route_index) -> carries
SavePass = Callable[..., Tensor]
# backward_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, dy, carries, route, ddelta_out,
#               du_sum, du_fp32, routes, route_index)
#   -> (du, ddelta, dA, dB, dC, dD, ddelta_bias) of one route, as rows_backward_launch.launch_rows_backward:
#   delta, B, C and ddelta_out in the K routes' layout (the pass reading / writing route_index's planes),
#   du = the route's du + du_sum (fp32 or None), fp32 with du_fp32
BackwardPass = Callable[..., tuple]
# cross_save(u, delta, A, B, C, D, delta_bias, softplus, height, width) -> the band carries of VMamba's
#   four cross routes from one launch, (4, batch * dim, carry rows, W) in CROSS_ROUTES order
#   (rows_backward_launch.launch_cross_save), or None where it does not apply (the save passes run)
CrossSave = Callable[..., Optional[Tensor]]
CROSS_CODES = [route.code for route in CROSS_ROUTES]
BUILT = scan_plan.BUILT["cuda four-route backward"]
_FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def backward_design(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                    delta_bias: Optional[Tensor], routes: Sequence[int], dy: Tensor) -> tuple[str, str]:
    """("rs", why) where the four-route backward runs as RS route passes, else ("v3", why): the
    VMAMBA2D_SCAN_BACKWARD pin (v3 unless ``auto``), then the rule (vmamba2d.ops.plan, direction
    "backward") on the call's shape, then the tensors the passes take (shapes as
    :func:`cross_rows_backward`, fp32 A / D / delta_bias, dy in u's type or fp32).

    Raises:
        ValueError: VMAMBA2D_SCAN_BACKWARD set to something else than v3 / auto.
    """
    if scan_plan.backward_pin() == "v3":
        return "v3", (f"{scan_plan.BACKWARD_ENV} unset or v3: the v3 backward until a GPU run has measured the RS "
                      "route passes against it")
    design = scan_plan.choose_design(scan_call(u, delta, B, C, routes, "backward"), "cuda", BUILT)
    if design.name != "rs":
        return "v3", design.reason
    K = len(routes)
    fp32 = all(t is None or t.dtype == torch.float32 for t in (A, D, delta_bias))
    shapes = (delta.shape == (u.shape[0], K, *u.shape[1:]) and A.shape == (K * u.shape[1], 1)
              and B.shape == C.shape == (u.shape[0], K, 1, *u.shape[2:]) and dy.shape == u.shape)
    if not (fp32 and shapes and dy.dtype in (u.dtype, torch.float32) and u.dtype in _FLOAT_TYPES):
        return "v3", (f"{design.reason}, but the tensors are not what the RS passes take (the four-route shapes, "
                      "fp32 A / D / delta_bias, dy in u's type or fp32)")
    return "rs", design.reason


def launch_backward(launcher, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                    delta_bias: Optional[Tensor], softplus: bool, routes: Sequence[int], dy: Tensor
                    ) -> Optional[tuple]:
    """The four-route backward as RS route passes on u's GPU where :func:`backward_design` picks them
    (the gradients, as :func:`cross_rows_backward`), else None (the caller runs v3). The decision is
    printed once per shape where VMAMBA2D_DEBUG_PLAN is set."""
    design, why = backward_design(u, delta, A, B, C, D, delta_bias, routes, dy)
    scan_plan.debug_note(("cuda four-route backward", u.dtype, tuple(u.shape[2:]), design),
                         f"cuda four-route backward {tuple(u.shape[2:])} {u.dtype} -> {design} ({why})")
    if design != "rs":
        return None
    with torch.cuda.device(u.device):
        return cross_rows_backward(*nvrtc_passes(launcher), u, delta, A, B, C, D, delta_bias, softplus, routes, dy,
                                   cross_save=nvrtc_cross_save(launcher))


def cross_rows_backward(save_pass: SavePass, backward_pass: BackwardPass, u: Tensor, delta: Tensor, A: Tensor,
                        B: Tensor, C: Tensor, D: Optional[Tensor], delta_bias: Optional[Tensor], softplus: bool,
                        routes: Sequence[int], dy: Tensor, cross_save: Optional[CrossSave] = None) -> tuple:
    """(du, ddelta, dA, dB, dC, dD, ddelta_bias) of the K-route scan at N = 1 from K route passes.

    u, dy (batch, dim, H, W), any layout (du comes back in u's: contiguous, or channels-last);
    delta (batch, K, dim, H, W); A (K * dim, 1) fp32; B, C (batch, K, 1, H, W); D, delta_bias
    (K * dim,) fp32 or None; routes: K 2D route codes (0-7). The gradients have their inputs' shapes
    and types (du in u's type; dD / ddelta_bias None without D / delta_bias; ddelta contiguous, each
    pass writing its route's planes). Route k's pass reads its delta, B, C planes in place (delta, B,
    C are copied once only where they are not contiguous) and adds its own D term to du. du is the
    routes' sum in fp32 inside the kernels: each pass adds its route's du to the running fp32 sum of
    the routes before it, and the last pass rounds it once to u's type as it stores it. For VMamba's
    cross routes in their order (0, 4, 3, 7), ``cross_save`` -- where given and where it applies --
    gives every route's band carries from one launch instead of the K save passes.

    Raises:
        ValueError: shapes that do not match, N != 1, or a route code outside 0-7.
    """
    if u.dim() != 4:
        raise ValueError(f"u: expected (batch, dim, H, W), got shape {tuple(u.shape)}")
    batch, dim, height, width = u.shape
    routes = [rbl.check_route(int(r)) for r in routes]
    K = len(routes)
    if K == 0 or delta.shape != (batch, K, dim, height, width):
        raise ValueError(f"delta: expected {(batch, K, dim, height, width)} for {K} routes, got {tuple(delta.shape)}")
    for name, t in (("B", B), ("C", C)):
        if t.shape != (batch, K, 1, height, width):
            raise ValueError(f"{name}: expected {(batch, K, 1, height, width)} (N = 1), got {tuple(t.shape)}")
    if A.shape != (K * dim, 1):
        raise ValueError(f"A: expected {(K * dim, 1)} (N = 1), got {tuple(A.shape)}")
    for name, t in (("D", D), ("delta_bias", delta_bias)):
        if t is not None and t.shape != (K * dim,):
            raise ValueError(f"{name}: expected {(K * dim,)} or None, got {tuple(t.shape)}")
    if dy.shape != u.shape:
        raise ValueError(f"dy: expected {tuple(u.shape)}, got {tuple(dy.shape)}")
    length = height * width
    flat_u = u.contiguous().view(batch, dim, length)
    flat_dy = dy.contiguous().view(batch, dim, length)
    flat_delta = delta.contiguous().view(batch, K * dim, length)
    flat_B = B.contiguous().view(batch, K, 1, length)
    flat_C = C.contiguous().view(batch, K, 1, length)
    du = None
    ddelta = torch.empty((batch, K * dim, length), dtype=delta.dtype, device=delta.device)
    dA, dB, dC, dD, dbias = [], [], [], [], []
    all_carries = None
    if cross_save is not None and routes == CROSS_CODES:
        all_carries = cross_save(flat_u, flat_delta, A, flat_B, flat_C, D, delta_bias, softplus, height, width)
    for k, route in enumerate(routes):
        channels = slice(k * dim, (k + 1) * dim)
        part = (flat_u, flat_delta, A[channels].contiguous(), flat_B, flat_C,
                None if D is None else D[channels].contiguous(),
                None if delta_bias is None else delta_bias[channels].contiguous())
        if all_carries is not None:
            carries = all_carries[k]
        else:
            carries = save_pass(*part, softplus, height, width, route, K, k)
        du, _, g_A, g_B, g_C, g_D, g_bias = backward_pass(*part, softplus, height, width, flat_dy, carries, route,
                                                          ddelta, du, k + 1 < K, K, k)
        dA.append(g_A)
        dB.append(g_B.view(batch, 1, height, width))
        dC.append(g_C.view(batch, 1, height, width))
        dD.append(g_D)
        dbias.append(g_bias)
    du = du.view(batch, dim, height, width)
    if not u.is_contiguous():
        du = du.contiguous(memory_format=torch.channels_last)
    return (du, ddelta.view(batch, K, dim, height, width), torch.cat(dA), torch.stack(dB, 1),
            torch.stack(dC, 1), None if D is None else torch.cat(dD), None if delta_bias is None else torch.cat(dbias))


def nvrtc_cross_save(launcher) -> CrossSave:
    """The cross routes' carries on a GPU from one NVRTC launch (rows_backward_launch.launch_cross_save)
    at the lane layout backward_plan picks, or None where its V does not divide W."""

    def cross_save(u, delta, A, B, C, D, delta_bias, softplus, height, width):
        plan = rbl.backward_plan(u.element_size(), u.element_size(), width, alignment(u, delta, B, C))
        if plan is None or width % plan.vec:
            return None
        return rbl.launch_cross_save(launcher, u, delta, A, B, C, D, delta_bias, softplus, height, width, plan)

    return cross_save


def nvrtc_passes(launcher) -> tuple[SavePass, BackwardPass]:
    """The route passes on a GPU: the NVRTC saving forward (carries only, no y) and RS backward of
    rows_backward_launch, each with the plan backward_plan picks for the pass's tensors."""

    def plan_of(u, delta, B, C, dy, width):
        aligned = alignment(u, delta, B, C, *([dy] if dy is not None else []))
        plan = rbl.backward_plan(u.element_size(), (dy if dy is not None else u).element_size(), width, aligned)
        if plan is None:
            raise ValueError(f"width {width}: the RS backward takes rows of at most "
                             f"{rbl.MAX_VEC * 32} columns")
        return plan

    def save_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, route, routes, route_index):
        plan = plan_of(u, delta, B, C, None, width)
        return rbl.launch_forward_save(launcher, u, delta, A, B, C, D, delta_bias, softplus, height, width, False,
                                       plan, route, False, routes, route_index)[1]

    def backward_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, dy, carries, route, ddelta_out,
                      du_sum, du_fp32, routes, route_index):
        plan = plan_of(u, delta, B, C, dy, width)
        return rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, delta_bias, softplus, height, width, dy,
                                        carries, plan, route, ddelta_out, du_sum, du_fp32, routes, route_index)

    return save_pass, backward_pass
