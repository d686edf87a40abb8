"""The pure-PyTorch 2D selective scans: the readable references of both public ops and the
vectorised ``torch`` backend.

    selective_scan_2d_reference        same arguments as vmamba2d.ops.selective_scan_2d (no backend):
                                       the recurrence as loops over rows and columns
    cross_selective_scan_2d_reference  same arguments as vmamba2d.ops.cross_selective_scan_2d (no
                                       backend): the step-size projection as an einsum, then one
                                       looped scan per route on route-order copies, summed
    selective_scan_2d_torch            the ``torch`` backend: the recurrence as log-depth prefix
                                       scans (differentiable, exportable), on validated tensors

Every backend is tested against the references (tests/ops/test_scan_reference.py holds the public ops
against them with the same arguments). Per batch b, channel d, state n and pixel (i, j) of an
``height x width`` map stored row-major in ``L``::

    dt[i, j]   = softplus(delta[i, j] + delta_bias[d])          (identity without softplus)
    Abar[i, j] = exp(dt[i, j] * A[d, n])
    hh[i, j]   = Abar[i, j] * hh[i, j - 1] + dt[i, j] * B[g, n, i, j] * u[i, j]
    h[i, j]    = Abar[i, j] * h[i - 1, j] + hh[i, j]
    y[i, j]    = sum_n C[g, n, i, j] * h[i, j] + D[d] * u[i, j]

with ``g = d // (dim // groups)``.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from .routes import Route, RoutesArg, from_route_order, resolve_routes, to_route_order
from .validation import check_cross_scan_inputs, check_out_dtype, check_scan_inputs

Tensor = torch.Tensor


def _discretize(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, delta_bias: Optional[Tensor], delta_softplus: bool
) -> tuple[Tensor, Tensor]:
    """Return ``(Abar, x)``, both (batch, dim, N, L): the decay and the scan input ``dt * B * u``."""
    batch, dim, length = u.shape
    groups = B.shape[1]
    dt = delta if delta_bias is None else delta + delta_bias[None, :, None]
    if delta_softplus:
        dt = F.softplus(dt)
    abar = torch.exp(dt[:, :, None, :] * A[None, :, :, None])
    b_per_channel = B.repeat_interleave(dim // groups, dim=1)  # (batch, dim, N, L)
    x = (dt * u)[:, :, None, :] * b_per_channel
    return abar, x


def _readout(h: Tensor, u: Tensor, C: Tensor, D: Optional[Tensor]) -> Tensor:
    """``y = sum_n C * h + D * u`` for h (batch, dim, N, L) -> (batch, dim, L)."""
    dim, groups = u.shape[1], C.shape[1]
    c_per_channel = C.repeat_interleave(dim // groups, dim=1)
    y = (h * c_per_channel).sum(dim=2)
    if D is not None:
        y = y + D[None, :, None] * u
    return y


def _linear_scan(decay: Tensor, x: Tensor, dim: int) -> Tensor:
    """Inclusive scan ``h[t] = decay[t] * h[t-1] + x[t]`` along ``dim`` (h[-1] = 0).

    Hillis-Steele doubling: ceil(log2(T)) vectorised steps (at least one), each composing every
    prefix with the one ``offset`` positions earlier, so autograd sees only elementwise ops. The
    first step also runs for T == 1, where it adds ``decay * h[-1] = decay * 0``: ``decay`` (and so
    A) stays in the graph and gets a zero gradient instead of None, as on the other backends.
    """
    length = x.shape[dim]
    offset = 1
    while offset < max(length, 2):
        x_prev = F.pad(x.narrow(dim, 0, length - offset), _pad_spec(x.dim(), dim, offset), value=0.0)
        decay_prev = F.pad(
            decay.narrow(dim, 0, length - offset), _pad_spec(x.dim(), dim, offset), value=1.0
        )
        x = x + decay * x_prev
        decay = decay * decay_prev
        offset *= 2
    return x


def _pad_spec(ndim: int, dim: int, before: int) -> list[int]:
    """F.pad spec that adds ``before`` leading elements along ``dim``."""
    dim = dim % ndim
    spec = [0, 0] * (ndim - dim)
    spec[-2] = before
    return spec


def selective_scan_2d_torch(
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
) -> Tensor:
    """Vectorised 2D selective scan in plain PyTorch (differentiable, exportable).

    Args: u, delta (batch, dim, L); A (dim, N); B, C (batch, groups, N, L); D, delta_bias (dim,)
    or None; L == height * width. All floating point, same dtype (fp32/fp64 recommended).
    Returns: y (batch, dim, L) in the inputs' dtype.
    """
    batch, dim, length = u.shape
    nstate = A.shape[1]
    abar, x = _discretize(u, delta, A, B, delta_bias, delta_softplus)
    grid = (batch, dim, nstate, height, width)
    abar = abar.reshape(grid)
    hh = _linear_scan(abar, x.reshape(grid), dim=-1)
    h = _linear_scan(abar, hh, dim=-2)
    return _readout(h.reshape(batch, dim, nstate, length), u, C, D)


def selective_scan_2d_reference(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor] = None,
    delta_bias: Optional[Tensor] = None,
    delta_softplus: bool = True,
    *,
    height: int,
    width: int,
    out_dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """The single-route scan written as loops over rows and columns (slow; for tests and reading).

    Arguments and result as :func:`vmamba2d.ops.selective_scan_2d` (without ``backend``): u, delta
    (batch, dim, L), A (dim, N), B, C (batch, groups, N, L), D, delta_bias (dim,) or None,
    L = height * width; computed in fp32 (fp64 for fp64 inputs); returns y (batch, dim, L) in
    ``out_dtype`` (default u's dtype).
    """
    check_scan_inputs(u, delta, A, B, C, D, delta_bias, height, width)
    out_dtype = check_out_dtype(out_dtype, u.dtype)
    u, delta, A, B, C, D, delta_bias = _in_compute_dtype(u, delta, A, B, C, D, delta_bias)
    batch, dim, length = u.shape
    nstate = A.shape[1]
    abar, x = _discretize(u, delta, A, B, delta_bias, delta_softplus)
    abar = abar.reshape(batch, dim, nstate, height, width)
    x = x.reshape(batch, dim, nstate, height, width)
    rows = []
    above = [torch.zeros_like(x[..., 0, 0])] * width
    for i in range(height):
        hh = torch.zeros_like(x[..., 0, 0])
        row = []
        for j in range(width):
            hh = abar[..., i, j] * hh + x[..., i, j]
            row.append(abar[..., i, j] * above[j] + hh)
        rows.append(torch.stack(row, dim=-1))
        above = row
    h = torch.stack(rows, dim=-2)
    return _readout(h.reshape(batch, dim, nstate, length), u, C, D).to(out_dtype)


# A single-route scan as scan_per_route calls it: (u, delta, A, B, C, D, delta_bias, delta_softplus,
# height, width, out_dtype) -> y, shapes as selective_scan_2d.
SingleRouteScan = Callable[..., Tensor]


def scan_per_route(
    scan: SingleRouteScan,
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    routes: Tuple[Route, ...],
    out_dtype: torch.dtype,
) -> Tensor:
    """The four-route op as one single-route ``scan`` per route on route-order copies.

    Shapes as :func:`vmamba2d.ops.cross_selective_scan_2d` (full-rank delta). Each route's inputs
    are permuted into the order the route visits the map, scanned on ``route.grid(H, W)``, permuted
    back and summed in route order in fp32 (fp64 for fp64 inputs); returns y (batch, dim, H, W)
    in ``out_dtype``.
    """
    batch, dim, height, width = u.shape
    acc_dtype = torch.promote_types(u.dtype, torch.float32)
    y = u.new_zeros((batch, dim, height, width), dtype=acc_dtype)
    for k, route in enumerate(routes):
        rows, cols = route.grid(height, width)
        channels = slice(k * dim, (k + 1) * dim)
        y_route = scan(
            to_route_order(u, route),
            to_route_order(delta[:, k], route),
            A[channels],
            to_route_order(B[:, k], route).unsqueeze(1),
            to_route_order(C[:, k], route).unsqueeze(1),
            None if D is None else D[channels],
            None if delta_bias is None else delta_bias[channels],
            delta_softplus,
            int(rows),  # ints also when traced (torch.jit.trace makes sizes tensors)
            int(cols),
            acc_dtype,
        )
        y = y + from_route_order(y_route, route, height, width)
    return y.to(out_dtype)


def _in_compute_dtype(u: Tensor, *others: Optional[Tensor]) -> tuple:
    """u and the other tensors (None stays None) in the pure-PyTorch scans' compute type: fp32, or
    fp64 for fp64 u."""
    compute_dtype = torch.promote_types(u.dtype, torch.float32)
    return tuple(None if t is None else t.to(compute_dtype) for t in (u, *others))


def _looped_scan(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_dtype) -> Tensor:
    return selective_scan_2d_reference(u, delta, A, B, C, D, delta_bias, delta_softplus, height=height, width=width,
                                       out_dtype=out_dtype)


def _vectorised_scan(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_dtype) -> Tensor:
    u, delta, A, B, C, D, delta_bias = _in_compute_dtype(u, delta, A, B, C, D, delta_bias)
    return selective_scan_2d_torch(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width).to(out_dtype)


# The pure-PyTorch backends' single-route scans on validated inputs, as scan_per_route calls them
# (computed in fp32 at least, y in out_dtype).
SINGLE_ROUTE_SCANS: dict[str, SingleRouteScan] = {"torch": _vectorised_scan, "reference": _looped_scan}


def cross_selective_scan_2d_reference(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor] = None,
    delta_bias: Optional[Tensor] = None,
    delta_softplus: bool = True,
    *,
    routes: RoutesArg = "cross",
    out_dtype: Optional[torch.dtype] = None,
    delta_proj_weight: Optional[Tensor] = None,
) -> Tensor:
    """The four-route scan as the reference computes it (slow; for tests and reading).

    Arguments and result as :func:`vmamba2d.ops.cross_selective_scan_2d` (without ``backend``):
    u (batch, dim, H, W), delta (batch, K, dim, H, W) or, with delta_proj_weight (K, dim, R), the
    low-rank (batch, K, R, H, W), A (K * dim, N), B, C (batch, K, N, H, W), D, delta_bias (K * dim,)
    or None; returns y (batch, dim, H, W) in ``out_dtype`` (default u's dtype): the step sizes
    projected with an einsum, then :func:`selective_scan_2d_reference` per route, summed.
    """
    route_tuple = resolve_routes(routes)
    check_cross_scan_inputs(u, delta, A, B, C, D, delta_bias, len(route_tuple), delta_proj_weight)
    out_dtype = check_out_dtype(out_dtype, u.dtype)
    if delta_proj_weight is not None:
        delta = torch.einsum("kdr,bkrhw->bkdhw", delta_proj_weight.to(delta.dtype), delta)
    return scan_per_route(_looped_scan, u, delta, A, B, C, D, delta_bias, delta_softplus, route_tuple, out_dtype)
