"""The Triton 2D selective scan as ``torch.library`` custom ops.

    vmamba2d::selective_scan_2d_triton_fwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus,
                                           height, width, out_fp32, save_carries=False)
                                           -> (y, vcarry, hcarry)
    vmamba2d::selective_scan_2d_triton_bwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus,
                                           height, width, dy, vcarry, hcarry)
                                           -> (du, ddelta, dA, dB, dC, dD, ddelta_bias)

The single-route op runs the kernels of the four-route op (:mod:`~vmamba2d.ops.triton.kernels`,
launched by :mod:`~vmamba2d.ops.triton.launch`) as one configuration of them: one route (code 0:
rows first, from the top left) and each of the G groups of B / C its own map (u (batch, dim, L) is
read as (batch * G, dim / G, H, W); map b * G + g takes the parameter rows of group g). With
``save_carries`` the forward also returns the states entering each tile, and the backward
rebuilds every tile's states from them (no second forward sweep). A forward that saves no carries runs the
row-streaming kernel (:mod:`~vmamba2d.ops.triton.rows`) where the rule of
:mod:`~vmamba2d.ops.triton.rows_plan` allows it (d_state 1, rows up to 256 wide). Both ops have fake
implementations (``torch.compile(fullgraph=True)`` traces them); the forward op's autograd
formula calls the backward op.

Dtypes: u / delta / B / C / dy may be fp16, bf16, fp32 or fp64, A / D / delta_bias fp32 or fp64;
the kernels accumulate in fp32 (fp64 when any scan input is fp64) and write every gradient in its
input's dtype. The kernel module is imported (and the kernels built) on the first launch. On CPU
tensors the kernels run only through Triton's interpreter (see :mod:`~vmamba2d.ops.triton.launch`).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..autograd import backward_fake, register_single_route_autograd
from ..compiled.inputs import contiguous_as
from .launch import acc_dtype, check_op_inputs, empty_carries, launch_backward, launch_forward
from .rows_plan import forward_design, launch_rows_forward

Tensor = torch.Tensor

FWD_OP_NAME = "vmamba2d::selective_scan_2d_triton_fwd"
BWD_OP_NAME = "vmamba2d::selective_scan_2d_triton_bwd"
# The single-route op's scan: route code 0 (rows first, from the top left).
SINGLE_ROUTE = [0]


def _as_maps(u: Tensor, delta: Tensor, B: Tensor, C: Tensor, height: int, width: int) -> tuple[Tensor, ...]:
    """The single-route op's tensors as the kernels' maps, one per (batch, group of B / C):
    u (batch * G, dim / G, H, W), delta (batch * G, 1, dim / G, H, W), B / C (batch * G, 1, N, H, W)."""
    batch, dim, _ = u.shape
    groups, nstate = B.shape[1], B.shape[2]
    maps = batch * groups
    chans = dim // groups
    return (u.view(maps, chans, height, width), delta.view(maps, 1, chans, height, width),
            B.view(maps, 1, nstate, height, width), C.view(maps, 1, nstate, height, width))


@torch.library.custom_op(FWD_OP_NAME, mutates_args=())
def selective_scan_2d_triton_fwd(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    height: int,
    width: int,
    out_fp32: bool,
    save_carries: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Triton forward: (y, vcarry, hcarry). y (batch, dim, L), fp32 if ``out_fp32`` else u's dtype;
    the carries are 1-D buffers for the backward op (empty unless ``save_carries``).

    Inputs contiguous: u, delta (batch, dim, L); A (dim, N); B, C (batch, groups, N, L); D,
    delta_bias (dim,) or None.
    """
    check_op_inputs(u, A, B)
    maps = _as_maps(u, delta, B, C, height, width)
    if forward_design(B.shape[2], height, width, u.dtype, save_carries) == "rows":
        y = launch_rows_forward(*maps[:2], A, *maps[2:], D, delta_bias, delta_softplus, out_fp32, B.shape[1])
        return y.view(u.shape), *empty_carries(0, 0, 0, 0, 0, 1, False, acc_dtype(u, delta, B, C), u)
    y, vcarry, hcarry = launch_forward(*maps[:2], A, *maps[2:], D, delta_bias, delta_softplus,
                                                   SINGLE_ROUTE, out_fp32, save_carries, B.shape[1])
    return y.view(u.shape), vcarry, hcarry


@selective_scan_2d_triton_fwd.register_fake
def _fwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_fp32, save_carries=False):
    batch, dim, _ = u.shape
    groups = B.shape[1]
    carries = empty_carries(batch * groups, dim // groups, A.shape[1], height, width, 1, save_carries,
                                        acc_dtype(u, delta, B, C), u)
    return (u.new_empty(u.shape, dtype=torch.float32 if out_fp32 else u.dtype), *carries)


@torch.library.custom_op(BWD_OP_NAME, mutates_args=())
def selective_scan_2d_triton_bwd(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    height: int,
    width: int,
    dy: Tensor,
    vcarry: Tensor,
    hcarry: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Triton backward: (du, ddelta, dA, dB, dC, dD, ddelta_bias), each shaped and typed like its input.

    dy (batch, dim, L) contiguous; ``vcarry`` / ``hcarry``: what the forward op returned with
    ``save_carries`` on these inputs. dD / ddelta_bias are empty (shape (0,)) when D / delta_bias is None.
    """
    check_op_inputs(u, A, B)
    u_maps, delta_maps, B_maps, C_maps = _as_maps(u, delta, B, C, height, width)
    du, ddelta, dA, dB, dC, dD, dbias = launch_backward(
        u_maps, delta_maps, A, B_maps, C_maps, D, delta_bias, delta_softplus, SINGLE_ROUTE, vcarry, hcarry,
        dy.view(u_maps.shape), B.shape[1])
    return du.view(u.shape), ddelta.view(delta.shape), dA, dB.view(B.shape), dC.view(C.shape), dD, dbias


@selective_scan_2d_triton_bwd.register_fake
def _bwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy, vcarry, hcarry):
    return backward_fake(u, delta, A, B, C, D, delta_bias)


register_single_route_autograd(selective_scan_2d_triton_fwd, selective_scan_2d_triton_bwd)


def selective_scan_2d_triton(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    height: int,
    width: int,
    out_dtype: torch.dtype,
) -> Tensor:
    """2D selective scan with the Triton kernels (differentiable).

    Args (validated by :func:`vmamba2d.ops.validation.check_scan_inputs`): u, delta (batch, dim, L);
    A (dim, N); B, C (batch, groups, N, L); D, delta_bias (dim,) or None; L == height * width.
    Any strides; u / delta / B / C of one floating dtype (fp16, bf16, fp32, fp64).
    Returns: y (batch, dim, L) in ``out_dtype``.
    """
    scan_dtype = u.dtype
    for t in (delta, B, C):
        scan_dtype = torch.promote_types(scan_dtype, t.dtype)
    param_dtype = torch.float64 if scan_dtype == torch.float64 else torch.float32

    tensors = (u, delta, A, B, C, D, delta_bias)
    save_carries = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    out_fp32 = out_dtype == torch.float32 and scan_dtype != torch.float32
    y, _, _ = selective_scan_2d_triton_fwd(
        contiguous_as(u, scan_dtype), contiguous_as(delta, scan_dtype), contiguous_as(A, param_dtype),
        contiguous_as(B, scan_dtype), contiguous_as(C, scan_dtype), contiguous_as(D, param_dtype),
        contiguous_as(delta_bias, param_dtype), bool(delta_softplus), int(height), int(width), out_fp32, save_carries,
    )
    return y.to(out_dtype)
