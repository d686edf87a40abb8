"""The compiled 2D selective-scan kernels as ``torch.library`` custom ops.

Two ops, both implemented by the extension for the inputs' device (``vmamba2d._C_cpu`` or its JIT
build for CPU tensors, ``vmamba2d._C_cuda`` for CUDA tensors):

    vmamba2d::selective_scan_2d_fwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus, height,
                                    width, out_fp32, save_carries) -> (y, carry_h, carry_v)
    vmamba2d::selective_scan_2d_bwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus, height,
                                    width, dy, carry_h, carry_v)
        -> (du, ddelta, dA, dB, dC, dD, ddelta_bias)

Each has a fake (meta) implementation, so ``torch.compile(fullgraph=True)`` traces through them,
and the forward op's autograd formula calls the backward op. The CUDA kernel saves its tile
carries (the states entering every 32x32 tile, fp32, flat) in the forward when gradients are
required, so its backward recomputes each tile from them instead of re-running the forward; the
CPU kernel recomputes from the inputs and returns empty carries. The backward op returns empty
tensors for ``dD`` / ``ddelta_bias`` when ``D`` / ``delta_bias`` are None.

Dtypes: the CPU kernel computes in fp32 (fp64 for fp64 inputs), so fp16 / bf16 inputs (e.g. under
autocast) are cast to fp32 before the op; the CUDA kernel takes fp32 / fp16 / bf16 scan inputs
directly with fp32 ``A``, ``D`` and ``delta_bias`` and accumulates in fp32. The casts happen outside
the op, so autograd returns every gradient in its input's dtype.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..autograd import backward_fake, register_single_route_autograd
from .extensions import kernel_module
from .inputs import contiguous_as, kernel_dtypes

Tensor = torch.Tensor

FWD_OP_NAME = "vmamba2d::selective_scan_2d_fwd"
BWD_OP_NAME = "vmamba2d::selective_scan_2d_bwd"
_TILE = 32  # the CUDA kernel's tile side


def cuda_carry_numel(batch: int, dim: int, nstate: int, height: int, width: int) -> int:
    """Floats in each of the CUDA kernel's saved carry tensors for these shapes (0: one tile per map).

    Mirrors the kernel's tiling plan (csrc/cuda/scan2d_driver.h: plan_geometry): an axis longer
    than a tile is cut into tiles, a shorter one packs several maps of consecutive batch entries.
    """

    def axis(extent: int) -> tuple[int, int]:  # (maps packed along the axis, tiles along it)
        return (_TILE // extent, 1) if extent <= _TILE else (1, -(-extent // _TILE))

    pack_cols, tiles_w = axis(width)
    pack_rows, tiles_h = axis(height)
    batch_or_1 = max(batch, 1)
    pack_cols = min(pack_cols, batch_or_1)
    pack_rows = min(pack_rows, -(-batch_or_1 // pack_cols))
    batch_blocks = -(-batch // (pack_rows * pack_cols))
    tiles = tiles_h * tiles_w
    return 0 if tiles == 1 else batch_blocks * dim * tiles * nstate * _TILE


@torch.library.custom_op(FWD_OP_NAME, mutates_args=())
def selective_scan_2d_fwd(
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
    """Kernel forward: (y, carry_h, carry_v).

    Inputs contiguous; u, delta (batch, dim, L) and B, C (batch, groups, N, L) of one dtype;
    A (dim, N), D and delta_bias (dim,) or None. y (batch, dim, L) is fp32 if ``out_fp32`` else
    u's dtype. carry_h / carry_v are fp32 of :func:`cuda_carry_numel` elements when
    ``save_carries`` and the CUDA kernel runs, else empty.
    """
    args = (u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_fp32)
    if u.device.type == "cuda":
        y, carry_h, carry_v = kernel_module(u.device).forward(*args, save_carries)
        return y, carry_h, carry_v
    empty = A.new_empty(0, dtype=torch.float32)
    return kernel_module(u.device).forward(*args), empty, empty.clone()


@selective_scan_2d_fwd.register_fake
def _selective_scan_2d_fwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width,
                                out_fp32, save_carries=False):
    y = u.new_empty(u.shape, dtype=torch.float32 if out_fp32 else u.dtype)
    numel = 0
    if save_carries and u.device.type == "cuda":
        numel = cuda_carry_numel(u.shape[0], u.shape[1], A.shape[1], height, width)
    return y, u.new_empty(numel, dtype=torch.float32), u.new_empty(numel, dtype=torch.float32)


@torch.library.custom_op(BWD_OP_NAME, mutates_args=())
def selective_scan_2d_bwd(
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
    carry_h: Optional[Tensor] = None,
    carry_v: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Kernel backward: (du, ddelta, dA, dB, dC, dD, ddelta_bias), each shaped and typed like its input.

    dy is (batch, dim, L), contiguous; carry_h / carry_v are the forward's saved carries (CUDA),
    or None / empty tensors (the CUDA kernel then records them itself). dD / ddelta_bias are empty (shape (0,)) when D / delta_bias is None.
    """
    args = (u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy)
    module = kernel_module(u.device)
    if u.device.type == "cuda":
        none = A.new_empty(0, dtype=torch.float32)
        carries = tuple(none if t is None else t for t in (carry_h, carry_v))
        grads = module.backward(*args, *carries)
    else:
        grads = module.backward(*args)
    du, ddelta, dA, dB, dC, dD, dbias = grads
    like = (u, delta, A, B, C)
    du, ddelta, dA, dB, dC = (g.to(t.dtype) for g, t in zip((du, ddelta, dA, dB, dC), like))
    dD = dD.to(D.dtype) if D is not None else A.new_empty(0)
    dbias = dbias.to(delta_bias.dtype) if delta_bias is not None else A.new_empty(0)
    return du, ddelta, dA, dB, dC, dD, dbias


@selective_scan_2d_bwd.register_fake
def _selective_scan_2d_bwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy,
                                carry_h=None, carry_v=None):
    return backward_fake(u, delta, A, B, C, D, delta_bias)


register_single_route_autograd(selective_scan_2d_fwd, selective_scan_2d_bwd)


def _requires_grad(t: Optional[Tensor]) -> bool:
    return t is not None and t.requires_grad


def selective_scan_2d_compiled(
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
    """2D selective scan on the compiled kernel of the inputs' device (differentiable).

    Args (already validated by :func:`vmamba2d.ops.validation.check_scan_inputs`, or left to the
    kernel's own checks): u, delta (batch, dim, L); A (dim, N); B, C (batch, groups, N, L); D,
    delta_bias (dim,) or None; L == height * width. Any strides and floating dtypes.
    Returns: y (batch, dim, L) in ``out_dtype``.

    TorchScript compiles this function (it holds no backend dispatch).
    """
    scan_dtype, param_dtype = kernel_dtypes(u, delta, B, C)
    out_fp32 = out_dtype == torch.float32 and scan_dtype != torch.float32
    save_carries = torch.is_grad_enabled() and (
        u.requires_grad or delta.requires_grad or A.requires_grad or B.requires_grad or C.requires_grad
        or _requires_grad(D) or _requires_grad(delta_bias)
    )
    y = torch.ops.vmamba2d.selective_scan_2d_fwd(
        u.to(scan_dtype).contiguous(), delta.to(scan_dtype).contiguous(), A.to(param_dtype).contiguous(),
        B.to(scan_dtype).contiguous(), C.to(scan_dtype).contiguous(), contiguous_as(D, param_dtype),
        contiguous_as(delta_bias, param_dtype), delta_softplus, height, width, out_fp32, save_carries,
    )[0]
    return y.to(out_dtype)
