"""The four-route op's backward at N = 1 as RS route passes: per route one saving forward (its band
carries) and one RS backward (csrc/cuda/scan2d_rows_backward.cuh, every 2D route), the routes'
gradients put back into the four-route layout and du summed over the routes in fp32.

The passes are arguments, so the same composition runs the NVRTC kernels on a GPU
(:func:`nvrtc_passes`) and their host emulation in the tests. Not wired into the op yet: the op's
backward runs v3 until a GPU run has measured this against it (dev/gpu/check_rows_backward.py
--cross; docs/kernels.md, "RS backward").
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from vmamba2d.ops.compiled import rows_backward_launch as rbl
from vmamba2d.ops.compiled.rows_plan import alignment

Tensor = torch.Tensor
# save_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, route) -> carries
SavePass = Callable[..., Tensor]
# backward_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, dy, carries, route)
#   -> (du, ddelta, dA, dB, dC, dD, ddelta_bias) of one route, as rows_backward_launch.launch_rows_backward
BackwardPass = Callable[..., tuple]


def cross_rows_backward(save_pass: SavePass, backward_pass: BackwardPass, u: Tensor, delta: Tensor, A: Tensor,
                        B: Tensor, C: Tensor, D: Optional[Tensor], delta_bias: Optional[Tensor], softplus: bool,
                        routes: Sequence[int], dy: Tensor) -> tuple:
    """(du, ddelta, dA, dB, dC, dD, ddelta_bias) of the K-route scan at N = 1 from K route passes.

    u, dy (batch, dim, H, W), any layout (du comes back in u's: contiguous, or channels-last);
    delta (batch, K, dim, H, W); A (K * dim, 1) fp32; B, C (batch, K, 1, H, W); D, delta_bias
    (K * dim,) fp32 or None; routes: K 2D route codes (0-7). The gradients have their inputs' shapes
    and types (du in u's type; dD / ddelta_bias None without D / delta_bias). Route k's pass reads its
    delta, B, C planes as contiguous copies and adds its own D term to du; du is the routes' sum in
    fp32, rounded once to u's type.

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
    du = torch.zeros(batch, dim, length, dtype=torch.float32, device=u.device)
    ddelta, dA, dB, dC, dD, dbias = [], [], [], [], [], []
    for k, route in enumerate(routes):
        channels = slice(k * dim, (k + 1) * dim)
        part = (flat_u, delta[:, k].contiguous().view(batch, dim, length), A[channels].contiguous(),
                B[:, k:k + 1].contiguous().view(batch, 1, 1, length), C[:, k:k + 1].contiguous().view(batch, 1, 1, length),
                None if D is None else D[channels].contiguous(),
                None if delta_bias is None else delta_bias[channels].contiguous())
        carries = save_pass(*part, softplus, height, width, route)
        g_u, g_delta, g_A, g_B, g_C, g_D, g_bias = backward_pass(*part, softplus, height, width, flat_dy, carries,
                                                                 route)
        du += g_u.float()
        ddelta.append(g_delta.view(batch, dim, height, width))
        dA.append(g_A)
        dB.append(g_B.view(batch, 1, height, width))
        dC.append(g_C.view(batch, 1, height, width))
        dD.append(g_D)
        dbias.append(g_bias)
    du = du.to(u.dtype).view(batch, dim, height, width)
    if not u.is_contiguous():
        du = du.contiguous(memory_format=torch.channels_last)
    return (du, torch.stack(ddelta, 1), torch.cat(dA), torch.stack(dB, 1), torch.stack(dC, 1),
            None if D is None else torch.cat(dD), None if delta_bias is None else torch.cat(dbias))


def nvrtc_passes(launcher) -> tuple[SavePass, BackwardPass]:
    """The route passes on a GPU: the NVRTC saving forward (its y discarded) and RS backward of
    rows_backward_launch, each with the plan backward_plan picks for the pass's tensors."""

    def plan_of(u, delta, B, C, dy, width):
        aligned = alignment(u, delta, B, C, *([dy] if dy is not None else []))
        plan = rbl.backward_plan(u.element_size(), (dy if dy is not None else u).element_size(), width, aligned)
        if plan is None:
            raise ValueError(f"width {width}: the RS backward takes rows of at most "
                             f"{rbl.MAX_VEC * 32} columns")
        return plan

    def save_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, route):
        plan = plan_of(u, delta, B, C, None, width)
        return rbl.launch_forward_save(launcher, u, delta, A, B, C, D, delta_bias, softplus, height, width, False,
                                       plan, route)[1]

    def backward_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, dy, carries, route):
        plan = plan_of(u, delta, B, C, dy, width)
        return rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, delta_bias, softplus, height, width, dy,
                                        carries, plan, route)

    return save_pass, backward_pass
