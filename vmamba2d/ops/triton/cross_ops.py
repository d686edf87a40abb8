"""The four-route scan on the Triton kernels as ``torch.library`` custom ops.

    vmamba2d::cross_selective_scan_2d_triton_fwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus,
                                                 routes, out_fp32, save_carries) -> (y, vcarry, hcarry)
    vmamba2d::cross_selective_scan_2d_triton_bwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus,
                                                 routes, vcarry, hcarry, dy)
                                                 -> (du, ddelta, dA, dB, dC, dD, ddelta_bias)

Shapes as :func:`vmamba2d.ops.cross_selective_scan_2d`; ``routes`` are
:attr:`~vmamba2d.ops.Route.code` values. Every route is scanned in place on the map (no
route-order copies). With ``save_carries`` the forward also returns the states entering each
tile (each chunk for flat routes), fp32 (fp64 for fp64 inputs): the backward rebuilds every
tile's states from them instead of sweeping the forward again; without it they are empty. Both
ops have fake implementations (``torch.compile(fullgraph=True)`` and ``torch.export`` trace
them). u / delta / B / C / dy may be fp16, bf16, fp32 or fp64 (one dtype), A / D / delta_bias
fp32 (fp64 with fp64 inputs); kernels accumulate in fp32 (fp64) and write every gradient in its
input's dtype. The launches are :mod:`~vmamba2d.ops.triton.launch`'s.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from ..compiled.inputs import contiguous_as
from .launch import acc_dtype, check_op_inputs, check_routes, empty_carries, launch_backward, launch_forward

Tensor = torch.Tensor

CROSS_FWD_OP_NAME = "vmamba2d::cross_selective_scan_2d_triton_fwd"
CROSS_BWD_OP_NAME = "vmamba2d::cross_selective_scan_2d_triton_bwd"


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
    check_op_inputs(u, A, B)
    check_routes(routes, delta)
    return launch_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32, save_carries, 1)


@cross_selective_scan_2d_triton_fwd.register_fake
def _fwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32, save_carries):
    batch, dim, height, width = u.shape
    carries = empty_carries(batch, dim, A.shape[1], height, width, len(routes), save_carries,
                            acc_dtype(u, delta, B, C), u)
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
    check_op_inputs(u, A, B)
    check_routes(routes, delta)
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
    :func:`vmamba2d.ops.cross_selective_scan_2d` (inputs validated there), ``routes``
    as route codes. The forward saves tile carries for the backward only when a gradient is
    needed. Returns y (batch, dim, H, W) in ``out_dtype``."""
    scan_dtype = u.dtype
    param_dtype = torch.float64 if scan_dtype == torch.float64 else torch.float32

    tensors = (u, delta, A, B, C, D, delta_bias)
    save_carries = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    out_fp32 = out_dtype == torch.float32 and scan_dtype != torch.float32
    y, _, _ = cross_selective_scan_2d_triton_fwd(
        contiguous_as(u, scan_dtype), contiguous_as(delta, scan_dtype), contiguous_as(A, param_dtype), contiguous_as(B, scan_dtype),
        contiguous_as(C, scan_dtype), contiguous_as(D, param_dtype), contiguous_as(delta_bias, param_dtype), bool(delta_softplus),
        [int(c) for c in routes], out_fp32, save_carries,
    )
    return y.to(out_dtype)

