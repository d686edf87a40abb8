"""The compiled four-route scan kernel as ``torch.library`` custom ops.

    vmamba2d::cross_selective_scan_2d_fwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus,
                                          routes, out_fp32, delta_proj_weight?) -> y
    vmamba2d::cross_selective_scan_2d_bwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus,
                                          routes, dy, delta_proj_weight?)
        -> (du, ddelta, dA, dB, dC, dD, ddelta_bias, ddelta_proj_weight)

Implemented by the CPU and CUDA extensions (``cross_forward`` / ``cross_backward``), which scan
every route in place on the map (shapes in :func:`vmamba2d.ops.cross_selective_scan_2d`;
``routes`` are :attr:`Route.code` values; the CUDA forward runs VMamba's cross routes at N = 1 as one
launch of the v4 four-route kernel where the design rule picks it (NVRTC path:
``cross_rows_launch``; routes summed on chip, y written once in the type asked), else one v3 launch
per route; either reads a channels-last ``u`` through one contiguous copy, writing y / du back
channels-last). With
``delta_proj_weight`` (K, dim, R), delta is the low-rank (batch, K, R, H, W): the CPU kernel
projects each channel's step sizes where it reads them (no full-rank delta is stored), and so does
the NVRTC path's four-route kernel where its rule says folding pays (the module's ``cross_folds``;
docs/kernels.md, "Folded step sizes"); elsewhere on CUDA (the nvcc extension, v3, the rule saying no)
delta is projected first (:func:`~vmamba2d.ops.delta_proj.project_delta`). The backward
op returns the gradients of the low-rank delta and of the weight: the CPU kernel's channel-lane
backward forms them from each route's full-rank ddelta while it is in cache, the CUDA kernel's
full-rank ddelta goes through :func:`~vmamba2d.ops.delta_proj.project_delta_grads`. Both ops have
fake implementations, so ``torch.compile(fullgraph=True)`` and ``torch.export`` trace through
them; the forward's autograd formula calls the backward op, which recomputes from the inputs. The
kernel computes in fp32 (fp64 for fp64 inputs): other dtypes are cast outside the op, so autograd
returns every gradient in its input's dtype. The backward returns empty tensors for ``dD`` /
``ddelta_bias`` / ``ddelta_proj_weight`` when ``D`` / ``delta_bias`` / ``delta_proj_weight`` are
None. ``u`` may be contiguous or channels-last (the models' maps are): y, du and the dy the
backward takes are in u's layout (:func:`map_format`), so no layout copy is made around the op.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from ..delta_proj import project_delta, project_delta_grads
from .extensions import kernel_module
from .inputs import contiguous_as, kernel_dtypes

Tensor = torch.Tensor

CROSS_FWD_OP_NAME = "vmamba2d::cross_selective_scan_2d_fwd"
CROSS_BWD_OP_NAME = "vmamba2d::cross_selective_scan_2d_bwd"


def map_format(u: Tensor) -> torch.memory_format:
    """The layout of the op's maps (y, du, dy) for u (batch, dim, H, W): contiguous when u is,
    else channels-last."""
    return torch.contiguous_format if u.is_contiguous() else torch.channels_last


def _as_map(u: Tensor) -> Tensor:
    """u (batch, dim, H, W) as the kernel takes it: as it is when contiguous or channels-last,
    else a contiguous copy."""
    if u.is_contiguous() or u.is_contiguous(memory_format=torch.channels_last):
        return u
    return u.contiguous()


@torch.library.custom_op(CROSS_FWD_OP_NAME, mutates_args=())
def cross_selective_scan_2d_fwd(
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
    delta_proj_weight: Optional[Tensor] = None,
) -> Tensor:
    """Kernel forward: y (batch, dim, H, W), fp32 if ``out_fp32`` else u's dtype.

    Inputs contiguous (u also channels-last; y then too), u / delta / B / C of the compute dtype:
    u (batch, dim, H, W), delta (batch, K, dim, H, W), A (K * dim, N), B / C (batch, K, N, H, W),
    D / delta_bias (K * dim,); with delta_proj_weight (K, dim, R), delta is (batch, K, R, H, W).
    """
    module = kernel_module(u.device)
    if delta_proj_weight is None:
        return module.cross_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32)
    if not _forward_projects(module, u, delta, A, B, C, D, delta_bias, routes, out_fp32, delta_proj_weight):
        delta = project_delta(delta, delta_proj_weight)
        return module.cross_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32)
    return module.cross_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32, delta_proj_weight)


def _kernel_projects(u: Tensor) -> bool:
    """Whether every kernel of u's device takes ``delta_proj_weight`` (the CPU one's forward and
    backward); on CUDA only the NVRTC four-route forward may (:func:`_forward_projects`)."""
    return u.device.type == "cpu"


def _forward_projects(module, u, delta, A, B, C, D, delta_bias, routes, out_fp32, delta_proj_weight) -> bool:
    """Whether the forward kernel of ``module`` takes the low-rank delta and ``delta_proj_weight`` for
    this call: the CPU kernel always, the NVRTC path where its four-route kernel folds them
    (``cross_folds``; the nvcc extension has no such function and gets the projected delta)."""
    if _kernel_projects(u):
        return True
    folds = getattr(module, "cross_folds", None)
    return folds is not None and folds(u, delta, A, B, C, D, delta_bias, routes, out_fp32, delta_proj_weight)


@cross_selective_scan_2d_fwd.register_fake
def _cross_fwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32, delta_proj_weight=None):
    return torch.empty(u.shape, dtype=torch.float32 if out_fp32 else u.dtype, device=u.device,
                       memory_format=map_format(u))


@torch.library.custom_op(CROSS_BWD_OP_NAME, mutates_args=())
def cross_selective_scan_2d_bwd(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    routes: List[int],
    dy: Tensor,
    delta_proj_weight: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Kernel backward: (du, ddelta, dA, dB, dC, dD, ddelta_bias, ddelta_proj_weight), each shaped
    and typed like its input (du in u's layout); dy (batch, dim, H, W) in u's layout. dD /
    ddelta_bias / ddelta_proj_weight are empty when D / delta_bias / delta_proj_weight is None. With
    delta_proj_weight (K, dim, R), ddelta is the gradient of the low-rank delta (batch, K, R, H, W)."""
    module = kernel_module(u.device)
    low, weight = delta, delta_proj_weight
    if weight is not None and not _kernel_projects(u):
        delta, delta_proj_weight = project_delta(low, weight), None
    if delta_proj_weight is None:
        grads = module.cross_backward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy)
    else:  # the kernel returns the low-rank delta's and the weight's gradients
        grads = module.cross_backward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy, delta_proj_weight)
    du, ddelta, dA, dB, dC, dD, dbias = grads[:7]
    dweight = grads[7] if delta_proj_weight is not None else None
    if weight is not None and delta_proj_weight is None:
        ddelta, dweight = project_delta_grads(ddelta, low, weight)
    like = (u, low, A, B, C)
    du, ddelta, dA, dB, dC = (g.to(t.dtype) for g, t in zip((du, ddelta, dA, dB, dC), like))
    dD = dD.to(D.dtype) if D is not None else A.new_empty(0)
    dbias = dbias.to(delta_bias.dtype) if delta_bias is not None else A.new_empty(0)
    dweight = dweight.to(weight.dtype) if weight is not None else A.new_empty(0)
    return du, ddelta, dA, dB, dC, dD, dbias, dweight


@cross_selective_scan_2d_bwd.register_fake
def _cross_bwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy, delta_proj_weight=None):
    optional = tuple(torch.empty_like(t) if t is not None else A.new_empty(0)
                     for t in (D, delta_bias, delta_proj_weight))
    du = torch.empty(u.shape, dtype=u.dtype, device=u.device, memory_format=map_format(u))
    return (du,) + tuple(torch.empty_like(t) for t in (delta, A, B, C)) + optional


def _setup_context(ctx, inputs, output) -> None:
    u, delta, A, B, C, D, delta_bias, delta_softplus, routes, _, delta_proj_weight = inputs
    ctx.save_for_backward(u, delta, A, B, C, D, delta_bias, delta_proj_weight)
    ctx.scan_args = (delta_softplus, routes)


def _backward(ctx, dy: Tensor):
    u, delta, A, B, C, D, delta_bias, delta_proj_weight = ctx.saved_tensors
    du, ddelta, dA, dB, dC, dD, dbias, dweight = cross_selective_scan_2d_bwd(
        u, delta, A, B, C, D, delta_bias, *ctx.scan_args, dy.contiguous(memory_format=map_format(u)),
        delta_proj_weight,
    )
    return (
        du, ddelta, dA, dB, dC,
        dD if D is not None else None,
        dbias if delta_bias is not None else None,
        None, None, None,
        dweight if delta_proj_weight is not None else None,
    )


cross_selective_scan_2d_fwd.register_autograd(_backward, setup_context=_setup_context)


def cross_selective_scan_2d_compiled(
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
    delta_proj_weight: Optional[Tensor] = None,
) -> Tensor:
    """Four-route scan on the compiled kernel (differentiable); shapes as
    :func:`vmamba2d.ops.cross_selective_scan_2d`, ``routes`` as route codes (with
    ``delta_proj_weight`` (K, dim, R), delta is the low-rank (batch, K, R, H, W)).

    Returns y (batch, dim, H, W) in ``out_dtype``, channels-last when u is (:func:`map_format`).
    TorchScript compiles this function (it holds no backend dispatch): scripted models call it.
    """
    scan_dtype, param_dtype = kernel_dtypes(u, delta, B, C)
    out_fp32 = out_dtype == torch.float32 and scan_dtype != torch.float32
    y = torch.ops.vmamba2d.cross_selective_scan_2d_fwd(
        _as_map(u.to(scan_dtype)), delta.to(scan_dtype).contiguous(), A.to(param_dtype).contiguous(),
        B.to(scan_dtype).contiguous(), C.to(scan_dtype).contiguous(), contiguous_as(D, param_dtype),
        contiguous_as(delta_bias, param_dtype), delta_softplus, routes, out_fp32,
        contiguous_as(delta_proj_weight, scan_dtype),
    )
    return y.to(out_dtype)
