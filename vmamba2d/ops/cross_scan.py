"""The four-route selective scan: one op that scans a map along several routes and sums them.

VMamba's SS2D (and 2DVMamba's) scans its map along four routes and adds the route outputs back
onto the map. Written with the single-route op, that means four permuted copies of the map (and
of every per-route input) going in and four coming out. :func:`cross_selective_scan_2d` takes
the map once, in its own layout, and the per-route inputs in map order; native backends read and
write the map in place, with the route as index arithmetic (:mod:`vmamba2d.ops.routes`).

Backends (same names and ``auto`` rule as :func:`vmamba2d.ops.selective_scan_2d`):

    ``cpu``        native: the compiled CPU kernel scans every route in place.
    ``triton``     native: the Triton route kernels scan every route in place.
    ``cuda``       native: the compiled CUDA kernel scans every route in place (one launch per
                   route); a CUDA extension built before its route kernel runs the single-route
                   kernel per route on route-order copies (``backend_info()["cross_scan"]`` says
                   which).
    ``torch``, ``reference``   per route, on the backend of that name (readable; for tests).

With ``delta_proj_weight``, delta is low-rank and the op projects it (VMamba's per-route
``dt_proj``): the ``cpu`` kernel projects each channel's step sizes where it reads them; the other
backends project the whole delta with one batched matmul first (:mod:`vmamba2d.ops.delta_proj`).

``cross_scan_per_route`` is the per-route formulation every native backend is tested against.
"""
from __future__ import annotations

import warnings
from typing import Optional, Tuple

import torch

from . import _extensions
from .delta_proj import project_delta
from .routes import Route, RoutesArg, from_route_order, resolve_routes, to_route_order
from .selective_scan_2d import MAX_NSTATE, resolve_backend, selective_scan_2d
from .validation import check_cross_scan_inputs

Tensor = torch.Tensor

_warned_stale: set[str] = set()


def _route_slice(tensor: Optional[Tensor], k: int, dim: int) -> Optional[Tensor]:
    return None if tensor is None else tensor[k * dim : (k + 1) * dim]


def cross_scan_per_route(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    routes: Tuple[Route, ...],
    backend: str,
    out_dtype: torch.dtype,
) -> Tensor:
    """The four-route op as one single-route scan per route on route-order copies.

    Shapes as :func:`cross_selective_scan_2d`. Each route's inputs are permuted into the order the
    route visits the map, scanned on ``route.grid(H, W)`` by :func:`selective_scan_2d` with
    ``backend``, permuted back and summed in route order in fp32 (fp64 for fp64 inputs).
    """
    batch, dim, height, width = u.shape
    acc_dtype = torch.promote_types(u.dtype, torch.float32)
    y = u.new_zeros((batch, dim, height, width), dtype=acc_dtype)
    for k, route in enumerate(routes):
        rows, cols = route.grid(height, width)
        y_route = selective_scan_2d(
            to_route_order(u, route),
            to_route_order(delta[:, k], route),
            A[k * dim : (k + 1) * dim],
            to_route_order(B[:, k], route).unsqueeze(1),
            to_route_order(C[:, k], route).unsqueeze(1),
            _route_slice(D, k, dim),
            _route_slice(delta_bias, k, dim),
            delta_softplus,
            height=int(rows),  # ints also when traced (torch.jit.trace makes sizes tensors)
            width=int(cols),
            backend=backend,
            out_dtype=acc_dtype,
        )
        y = y + from_route_order(y_route, route, height, width)
    return y.to(out_dtype)


def _kernel_has_routes(backend: str) -> bool:
    """Whether the ``cpu`` / ``cuda`` extension has a route kernel. A CPU build from before the
    op has none: warns once (the op then scans route by route on the single-route kernel)."""
    module = _extensions.cpu_extension() if backend == "cpu" else _extensions.cuda_extension()
    if module is not None and hasattr(module, "cross_forward"):
        return True
    if backend == "cpu" and module is not None and "cpu" not in _warned_stale:
        _warned_stale.add("cpu")
        warnings.warn(
            "vmamba2d: the compiled CPU kernel has no four-route scan (built from older sources; "
            "reinstall the package to rebuild it); scanning the routes one by one",
            RuntimeWarning,
            stacklevel=3,
        )
    return False


def cross_scan_mode(backend: str) -> str:
    """How the four-route op runs on a concrete backend: ``"native"`` (routes scanned in place)
    or ``"per-route"`` (one single-route scan per route on route-order copies)."""
    if backend in ("cpu", "cuda"):
        return "native" if _kernel_has_routes(backend) else "per-route"
    return "native" if backend == "triton" else "per-route"


def _op_impl(backend: str):
    """The custom-op implementation of the four-route scan for ``backend``, or None for the
    Python per-route formulation (``torch`` / ``reference``)."""
    if backend == "triton":
        from ._triton_cross_scan import cross_selective_scan_2d_triton

        return cross_selective_scan_2d_triton
    if backend in ("cpu", "cuda"):
        from .cross_fused import cross_selective_scan_2d_fused

        return cross_selective_scan_2d_fused
    return None


def cross_selective_scan_2d(
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
    backend: str = "auto",
    out_dtype: Optional[torch.dtype] = None,
    delta_proj_weight: Optional[Tensor] = None,
) -> Tensor:
    """Selective scans of one map along K routes, summed back onto the map.

    Args:
        u: (batch, dim, H, W) input map (H, W >= 1; batch and dim may be 0), shared by every route.
        delta: (batch, K, dim, H, W) per-route step sizes before bias / softplus, in map order.
        A: (K * dim, N) decay rates (negative); route k's channel d is row ``k * dim + d``.
        B, C: (batch, K, N, H, W) per-route input / output projections in map order (one group
            per route: shared by the route's channels).
        D, delta_bias: optional (K * dim,) per-route skip weights / step-size biases.
        delta_softplus: apply softplus to delta (+ bias).
        routes: a route-set name (``"cross"``: the paper's four 2D routes, ``"corners"``: one 2D
            route from each corner) or a sequence of K :class:`~vmamba2d.ops.routes.Route`
            (flat routes for 1D scans, e.g. ``route_set("cross", scan="1d")`` for VMamba).
        backend: one of ``vmamba2d.ops.BACKENDS``.
        out_dtype: dtype of y; defaults to u's. Accumulation is in fp32 (fp64 for fp64 inputs).
        delta_proj_weight: optional (K, dim, R) per-route step-size projection. When given, delta
            is the low-rank (batch, K, R, H, W) and route k's step sizes are
            ``sum_r delta_proj_weight[k, d, r] * delta[b, k, r]`` (then bias and softplus as
            above); the ``cpu`` kernel computes them where it reads them (the full-rank delta is
            never stored). Differentiable in both.
    Returns:
        y: (batch, dim, H, W), the sum over routes k = 0..K-1 (in that order) of route k's scan
        output mapped back to map order.
    """
    route_tuple = resolve_routes(routes)
    check_cross_scan_inputs(u, delta, A, B, C, D, delta_bias, len(route_tuple), delta_proj_weight)
    name = resolve_backend(backend, u.device, u.dtype)
    nstate = A.shape[1]
    if name in MAX_NSTATE and nstate > MAX_NSTATE[name]:
        raise ValueError(f"A has N={nstate} states; backend {name!r} supports at most N={MAX_NSTATE[name]}")
    out_dtype = u.dtype if out_dtype is None else out_dtype
    cross_scan_mode(name)  # warns once if the CPU build predates the route kernel
    impl = _op_impl(name)
    codes = [r.code for r in route_tuple]
    if impl is not None and name in ("cpu", "cuda"):  # the compiled op projects delta itself
        return impl(u, delta, A, B, C, D, delta_bias, delta_softplus, codes, out_dtype, delta_proj_weight)
    if delta_proj_weight is not None:
        delta = project_delta(delta, delta_proj_weight)
    if impl is not None:
        return impl(u, delta, A, B, C, D, delta_bias, delta_softplus, codes, out_dtype)
    return cross_scan_per_route(u, delta, A, B, C, D, delta_bias, delta_softplus, route_tuple, name, out_dtype)
