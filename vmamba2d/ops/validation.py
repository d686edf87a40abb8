"""Argument checks for the scan ops: every error names the argument and what was expected."""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor


def _require_tensor(name: str, value: object) -> Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def _require_shape(name: str, tensor: Tensor, expected: tuple[int, ...], meaning: str) -> None:
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name} must have shape {meaning} = {expected}, got {tuple(tensor.shape)}")


def _require_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_scan_inputs(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    height: int,
    width: int,
) -> tuple[int, int, int, int, int]:
    """Validate the scan's arguments; return ``(batch, dim, length, groups, nstate)``.

    Expected: u, delta (batch, dim, L) with L == height * width; A (dim, N); B, C
    (batch, groups, N, L) with dim % groups == 0; D, delta_bias (dim,) or None; all floating point
    and on one device; u, delta, B, C of one dtype.
    """
    u = _require_tensor("u", u)
    if u.dim() != 3:
        raise ValueError(f"u must be 3-D (batch, dim, L), got shape {tuple(u.shape)}")
    batch, dim, length = u.shape
    height = _require_positive_int("height", height)
    width = _require_positive_int("width", width)
    if length != height * width:
        raise ValueError(
            f"u has L={length} positions but height*width = {height}*{width} = {height * width}; "
            "L must equal height * width"
        )
    _require_shape("delta", _require_tensor("delta", delta), (batch, dim, length), "(batch, dim, L)")
    A = _require_tensor("A", A)
    if A.dim() != 2 or A.shape[0] != dim:
        raise ValueError(f"A must have shape (dim, N) with dim={dim}, got {tuple(A.shape)}")
    nstate = A.shape[1]
    if nstate < 1:
        raise ValueError("A must have at least one state (N >= 1)")
    B = _require_tensor("B", B)
    if B.dim() != 4:
        raise ValueError(f"B must be 4-D (batch, groups, N, L), got shape {tuple(B.shape)}")
    groups = B.shape[1]
    if groups < 1 or dim % groups != 0:
        raise ValueError(f"dim={dim} must be divisible by the number of groups in B ({groups})")
    _require_shape("B", B, (batch, groups, nstate, length), "(batch, groups, N, L)")
    _require_shape("C", _require_tensor("C", C), (batch, groups, nstate, length), "(batch, groups, N, L)")
    for name, vec in (("D", D), ("delta_bias", delta_bias)):
        if vec is not None:
            _require_shape(name, _require_tensor(name, vec), (dim,), "(dim,)")
    check_same_dtype([("u", u), ("delta", delta), ("B", B), ("C", C)])
    named = [("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C), ("D", D), ("delta_bias", delta_bias)]
    for name, tensor in named[1:]:
        if tensor is not None and tensor.device != u.device:
            raise ValueError(f"{name} is on {tensor.device} but u is on {u.device}; all inputs must share a device")
    return batch, dim, length, groups, nstate


def check_same_dtype(named: list[tuple[str, Optional[Tensor]]]) -> None:
    """The scan's data tensors (u, delta, B, C) share one dtype: the kernels compute in it."""
    first_name, first = named[0]
    for name, tensor in named[1:]:
        if tensor is not None and tensor.dtype != first.dtype:
            raise TypeError(
                f"{name} has dtype {tensor.dtype} but {first_name} has {first.dtype}; "
                f"{', '.join(n for n, _ in named)} must share one dtype (A, D and delta_bias may differ)"
            )


def check_cross_scan_inputs(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    num_routes: int,
    delta_proj_weight: Optional[Tensor] = None,
) -> tuple[int, int, int, int, int]:
    """Validate the four-route op's arguments; return ``(batch, dim, height, width, nstate)``.

    Expected: u (batch, dim, H, W); delta (batch, K, dim, H, W), or (batch, K, R, H, W) with
    delta_proj_weight (K, dim, R); A (K * dim, N); B, C (batch, K, N, H, W); D, delta_bias
    (K * dim,) or None; u, delta, B, C of one floating dtype (A, D, delta_bias, delta_proj_weight
    floating, any); all on u's device. K is ``num_routes``.
    """
    u = _require_tensor("u", u)
    if u.dim() != 4:
        raise ValueError(f"u must be 4-D (batch, dim, H, W), got shape {tuple(u.shape)}")
    batch, dim, height, width = u.shape
    if height < 1 or width < 1:
        raise ValueError(f"u's map must not be empty (H >= 1 and W >= 1), got shape {tuple(u.shape)}")
    k = num_routes
    delta = _require_tensor("delta", delta)
    if delta_proj_weight is None:
        _require_shape("delta", delta, (batch, k, dim, height, width), "(batch, K, dim, H, W)")
    else:
        weight = _require_tensor("delta_proj_weight", delta_proj_weight)
        if weight.dim() != 3 or weight.shape[0] != k or weight.shape[1] != dim or weight.shape[2] < 1:
            raise ValueError(
                f"delta_proj_weight must have shape (K, dim, R) with K={k}, dim={dim} and R >= 1, "
                f"got {tuple(weight.shape)}"
            )
        rank = weight.shape[2]
        _require_shape("delta", delta, (batch, k, rank, height, width), "(batch, K, R, H, W) with delta_proj_weight")
    A = _require_tensor("A", A)
    if A.dim() != 2 or A.shape[0] != k * dim or A.shape[1] < 1:
        raise ValueError(f"A must have shape (K * dim, N) with K * dim = {k * dim} and N >= 1, got {tuple(A.shape)}")
    nstate = A.shape[1]
    for name, mat in (("B", B), ("C", C)):
        _require_shape(name, _require_tensor(name, mat), (batch, k, nstate, height, width), "(batch, K, N, H, W)")
    for name, vec in (("D", D), ("delta_bias", delta_bias)):
        if vec is not None:
            _require_shape(name, _require_tensor(name, vec), (k * dim,), "(K * dim,)")
    check_same_dtype([("u", u), ("delta", delta), ("B", B), ("C", C)])
    named = (("delta", delta), ("A", A), ("B", B), ("C", C), ("D", D), ("delta_bias", delta_bias),
             ("delta_proj_weight", delta_proj_weight))
    for name, tensor in named:
        if tensor is not None and tensor.device != u.device:
            raise ValueError(f"{name} is on {tensor.device} but u is on {u.device}; all inputs must share a device")
    return batch, dim, height, width, nstate


def check_out_dtype(out_dtype: object, default: torch.dtype) -> torch.dtype:
    """``out_dtype`` as the ops take it: None means ``default`` (u's dtype), else a floating
    ``torch.dtype`` (TypeError otherwise: the scan's output is never rounded to an integer)."""
    if out_dtype is None:
        return default
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(
            f"out_dtype must be None or a floating torch.dtype (e.g. torch.float32), got {out_dtype!r}"
        )
    return out_dtype
