"""Pure-PyTorch 2D selective scans: the literal loop and a vectorised, differentiable version.

Both take already-validated tensors (see :mod:`vmamba2d.ops.validation`) and compute, per batch b,
channel d, state n and pixel (i, j) of an ``height x width`` map stored row-major in ``L``::

    dt[i, j]   = softplus(delta[i, j] + delta_bias[d])          (identity without softplus)
    Abar[i, j] = exp(dt[i, j] * A[d, n])
    hh[i, j]   = Abar[i, j] * hh[i, j - 1] + dt[i, j] * B[g, n, i, j] * u[i, j]
    h[i, j]    = Abar[i, j] * h[i - 1, j] + hh[i, j]
    y[i, j]    = sum_n C[g, n, i, j] * h[i, j] + D[d] * u[i, j]

with ``g = d // (dim // groups)``.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

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
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    height: int,
    width: int,
) -> Tensor:
    """The recurrence written as loops over rows and columns (slow; for tests and reading).

    Same arguments and result as :func:`selective_scan_2d_torch`.
    """
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
    return _readout(h.reshape(batch, dim, nstate, length), u, C, D)
