"""SS2D: VMamba v2's selective-scan mixer (forward type "v05_noz", channels-first).

The mixer scans the feature map along four routes (K = 4) and sums the results. The paper's
routes (``routes="cross"``, :data:`vmamba2d.ops.CROSS_ROUTES`):

    k0  the map in row-major order            (a 2D scan on the H x W grid, origin top-left)
    k1  the transposed map (column-major)     (a 2D scan on the W x H grid)
    k2  k0 reversed (the map rotated 180 deg) (H x W grid, origin bottom-right)
    k3  k1 reversed                           (W x H grid)

``scan="2d"`` runs every route as a 2D selective scan (2DVMamba); ``scan="1d"`` runs the same
four sequences through a 1D scan (the VMamba baseline). ``routes="corners"`` starts one route at
each corner of the map instead (not in the paper), so one mixer sees all four quadrants.

``cross_scan="fused"`` (default) computes the per-route projections on the map in its own order
(they are position-wise, so they commute with the route permutations) and scans all routes with
one :func:`vmamba2d.ops.cross_selective_scan_2d` call, which backends with a native kernel run
in place; the op also applies the step-size projection ``dt_projs_weight`` to the low-rank step
sizes (``delta_proj_weight``), so the full-rank step sizes are never stored on CPU.
``cross_scan="per_route"`` builds the four route-order copies of the map and scans each with :func:`vmamba2d.ops.selective_scan_2d` (VMamba's formulation; kept for comparison).
Parameter names and shapes follow the public VMamba v2 code so its checkpoints load unchanged.
"""
from __future__ import annotations

import math
from typing import List, Optional, Union

import torch
import torch.nn as nn

from ..ops import (
    BACKENDS,
    ROUTE_SETS,
    Route,
    cross_selective_scan_2d,
    cross_selective_scan_2d_compiled,
    from_route_order,
    resolve_backend,
    route_set,
    selective_scan_2d,
    to_route_order,
)
from .cpu_inference import PackedWeightConv2d
from .norm import LayerNorm2d

Tensor = torch.Tensor

NUM_ROUTES = 4
SCAN_MODES = ("2d", "1d")
CROSS_SCAN_MODES = ("fused", "per_route")
LAYER_NORM_EPS = 1e-5  # VMamba's LayerNorm2d keeps nn.LayerNorm's default


def resolve_dt_rank(dim: int, dt_rank: Union[int, str]) -> int:
    """``dt_rank="auto"`` means ceil(dim / 16) (Mamba / VMamba); an int is used as given."""
    if dt_rank == "auto":
        return math.ceil(dim / 16)
    if isinstance(dt_rank, bool) or not isinstance(dt_rank, int) or dt_rank < 1:
        raise ValueError(f"dt_rank must be 'auto' or a positive int, got {dt_rank!r}")
    return dt_rank


def _batched(weight: Tensor, batch: int) -> Tensor:
    """A weight (rows, cols) as (batch, rows, cols) without a copy, for torch.bmm (which fvcore
    counts with the batch, unlike a broadcasting matmul)."""
    return weight.unsqueeze(0).expand(batch, weight.shape[0], weight.shape[1])


def _per_route(weight: Tensor, batch: int) -> Tensor:
    """Route weights (K, out, in) repeated for every sample: (batch * K, out, in) for torch.bmm."""
    routes, rows, cols = weight.shape
    return weight.unsqueeze(0).expand(batch, routes, rows, cols).reshape(batch * routes, rows, cols)


def _scan_parameters(A_logs: Tensor, Ds: Tensor, dt_projs_bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(A, D, delta_bias) in route order, (K * Di, N) / (K * Di,) / (K * Di,). The scan's small
    parameters stay in (at least) fp32 under AMP, as in VMamba."""
    param_dtype = torch.promote_types(A_logs.dtype, torch.float32)
    A = -torch.exp(A_logs.to(param_dtype))
    return A, Ds.to(param_dtype), dt_projs_bias.to(param_dtype).reshape(-1)


def cross_scan_fused(
    x: Tensor,
    x_proj_weight: Tensor,
    dt_projs_weight: Tensor,
    dt_projs_bias: Tensor,
    A_logs: Tensor,
    Ds: Tensor,
    route_codes: List[int],
    backend: str,
) -> Tensor:
    """Scan x along the routes with one four-route op; projections computed in map order.

    Args:
        x: (B, Di, H, W) activations.
        x_proj_weight: (K, R + 2N, Di) per-route projection to (dt, B, C).
        dt_projs_weight: (K, Di, R); dt_projs_bias: (K, Di) per-route step-size projection.
        A_logs: (K * Di, N); Ds: (K * Di,).
        route_codes: the K routes as :attr:`vmamba2d.ops.Route.code` values.
        backend: backend for :func:`vmamba2d.ops.cross_selective_scan_2d`.
    Returns:
        (B, Di, H, W), the sum of the route outputs.

    A plain function so that FX symbolic tracing records it as one call (``torch.fx.wrap`` below).
    """
    batch, d_inner, height, width = x.shape
    k, proj_rows, _ = x_proj_weight.shape
    n = A_logs.shape[1]
    r = dt_projs_weight.shape[2]
    length = height * width

    # All routes' (dt, B, C) projections in one batched matmul over the map in its own order (a
    # view of a channels-last x). The weight takes x's dtype before it is expanded over the batch:
    # autocast would cast the expanded weight, writing a copy per sample.
    weight = x_proj_weight.reshape(k * proj_rows, d_inner).to(x.dtype)
    x_dbl = torch.bmm(_batched(weight, batch), x.reshape(batch, d_inner, length))
    x_dbl = x_dbl.view(batch, k, proj_rows, length)
    dts, Bs, Cs = torch.split(x_dbl, [r, n, n], dim=2)
    A, D, delta_bias = _scan_parameters(A_logs, Ds, dt_projs_bias)
    grid = (height, width)
    # the low-rank step sizes: the op applies dt_projs_weight itself (the CPU kernel where it reads them)
    dts, Bs, Cs = dts.unflatten(-1, grid), Bs.unflatten(-1, grid), Cs.unflatten(-1, grid)
    if torch.jit.is_scripting():  # no backend dispatch in TorchScript: the compiled CPU kernel
        return cross_selective_scan_2d_compiled(
            x, dts, A, Bs, Cs, D, delta_bias, True, route_codes, x.dtype, dt_projs_weight
        )
    return cross_selective_scan_2d(
        x, dts, A, Bs, Cs, D, delta_bias, True, routes=route_codes, backend=backend, delta_proj_weight=dt_projs_weight
    )


def cross_scan_merge(
    x: Tensor,
    x_proj_weight: Tensor,
    dt_projs_weight: Tensor,
    dt_projs_bias: Tensor,
    A_logs: Tensor,
    Ds: Tensor,
    route_codes: List[int],
    backend: str,
) -> Tensor:
    """Scan x along the routes on route-order copies and sum the route outputs back onto the map.

    Same arguments and result as :func:`cross_scan_fused`. Builds the K route-order copies of x,
    projects each, scans the routes of one grid shape with one :func:`selective_scan_2d` call,
    and maps every route's output back. A plain function for FX (``torch.fx.wrap`` below).
    """
    batch, d_inner, height, width = x.shape
    length = height * width
    k = x_proj_weight.shape[0]
    n = A_logs.shape[1]
    r = dt_projs_weight.shape[2]
    routes = [Route.from_code(code) for code in route_codes]
    # Routes grouped by the grid they scan (H x W first, then W x H), so that each grid shape
    # needs one op call; `order` lists route indices in that grouped order.
    grids = [route.grid(height, width) for route in routes]
    order = sorted(range(k), key=lambda i: (grids[i] != grids[0], i))

    xs = torch.stack([to_route_order(x, routes[i]) for i in order], dim=1).reshape(batch, k * d_inner, length)
    x_dbl = torch.bmm(_per_route(x_proj_weight[order], batch), xs.view(batch * k, d_inner, length))
    x_dbl = x_dbl.view(batch, k, r + 2 * n, length)
    dts, Bs, Cs = torch.split(x_dbl, [r, n, n], dim=2)
    dts = torch.bmm(_per_route(dt_projs_weight[order], batch), dts.reshape(batch * k, r, length))
    dts = dts.view(batch, k * d_inner, length)
    A, D, delta_bias = (t.view(k, -1, *t.shape[1:])[order].reshape(k * d_inner, *t.shape[1:])
                        for t in _scan_parameters(A_logs, Ds, dt_projs_bias))
    Bs, Cs = Bs.contiguous(), Cs.contiguous()

    ys: List[Tensor] = []
    first = 0
    while first < k:
        grid_h, grid_w = grids[order[first]]
        last = first + sum(1 for i in order[first:] if grids[i] == (grid_h, grid_w))
        lo, hi = first * d_inner, last * d_inner
        args = (xs[:, lo:hi], dts[:, lo:hi], A[lo:hi], Bs[:, first:last], Cs[:, first:last], D[lo:hi], delta_bias[lo:hi])
        ys.append(selective_scan_2d(*args, True, height=int(grid_h), width=int(grid_w), backend=backend))
        first = last
    y = (ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)).view(batch, k, d_inner, length)
    merged = [from_route_order(y[:, position], routes[i], height, width) for position, i in enumerate(order)]
    out = merged[0]
    for part in merged[1:]:
        out = out + part
    return out


torch.fx.wrap("cross_scan_fused")
torch.fx.wrap("cross_scan_merge")


class SS2D(nn.Module):
    """Four-route selective-scan mixer on NCHW maps.

    Args:
        dim: input / output channels C.
        d_state: SSM state size N.
        ssm_ratio: inner width Di = int(ssm_ratio * C).
        dt_rank: rank R of the step-size projection, or "auto" (ceil(C / 16)).
        d_conv: depthwise conv kernel size.
        conv_bias: bias on the depthwise conv.
        scan: "2d" (2D selective scan per route) or "1d" (1D scan per route, VMamba).
        scan_backend: backend passed to the scan ops ("auto", "cpu", "cuda", "triton", "torch",
            "reference").
        routes: "cross" (the paper's four routes) or "corners" (one route from each corner).
        cross_scan: "fused" (one four-route op on the map) or "per_route" (route-order copies).
        dt_min, dt_max, dt_init_floor: range of the initial step sizes (log-uniform).
        proj_drop: dropout after the output projection.
    """

    def __init__(
        self,
        dim: int,
        d_state: int = 1,
        ssm_ratio: float = 1.0,
        dt_rank: Union[int, str] = "auto",
        d_conv: int = 3,
        conv_bias: bool = False,
        scan: str = "2d",
        scan_backend: str = "auto",
        routes: str = "cross",
        cross_scan: str = "fused",
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        proj_drop: float = 0.0,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        if scan not in SCAN_MODES:
            raise ValueError(f"scan must be one of {SCAN_MODES}, got {scan!r}")
        if scan_backend not in BACKENDS:
            raise ValueError(f"scan_backend must be one of {BACKENDS}, got {scan_backend!r}")
        if routes not in ROUTE_SETS:
            raise ValueError(f"routes must be one of {tuple(ROUTE_SETS)}, got {routes!r}")
        if cross_scan not in CROSS_SCAN_MODES:
            raise ValueError(f"cross_scan must be one of {CROSS_SCAN_MODES}, got {cross_scan!r}")
        if d_state < 1:
            raise ValueError(f"d_state must be >= 1, got {d_state}")
        d_inner = int(ssm_ratio * dim)
        if d_inner < 1:
            raise ValueError(f"ssm_ratio * dim must be >= 1, got {ssm_ratio} * {dim}")
        self.scan = scan
        self.scan_backend = scan_backend
        self.routes = routes
        self.cross_scan = cross_scan
        self.route_codes: List[int] = [route.code for route in route_set(routes, scan)]
        self.d_state = d_state
        self.d_inner = d_inner
        self.dt_rank = resolve_dt_rank(dim, dt_rank)
        self.dt_init_range = (dt_min, dt_max, dt_init_floor)

        self.in_proj = PackedWeightConv2d(dim, d_inner, kernel_size=1, bias=False, **dd)
        self.conv2d = nn.Conv2d(
            d_inner, d_inner, kernel_size=d_conv, padding=(d_conv - 1) // 2, groups=d_inner, bias=conv_bias, **dd
        )
        self.act = nn.SiLU()
        k, r, n = NUM_ROUTES, self.dt_rank, d_state
        self.x_proj_weight = nn.Parameter(torch.empty(k, r + 2 * n, d_inner, **dd))
        self.dt_projs_weight = nn.Parameter(torch.empty(k, d_inner, r, **dd))
        self.dt_projs_bias = nn.Parameter(torch.empty(k, d_inner, **dd))
        self.A_logs = nn.Parameter(torch.empty(k * d_inner, n, **dd))
        self.Ds = nn.Parameter(torch.empty(k * d_inner, **dd))
        self.out_norm = LayerNorm2d(d_inner, eps=LAYER_NORM_EPS, **dd)
        self.out_proj = PackedWeightConv2d(d_inner, dim, kernel_size=1, bias=False, **dd)
        self.dropout = nn.Dropout(proj_drop) if proj_drop > 0 else nn.Identity()
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Mamba's initialisation of the SSM parameters (the convs and norms reset themselves):
        dt log-uniform in [dt_min, dt_max], A = -(1..N), D = 1. Computed in fp32, then stored."""
        dt_min, dt_max, dt_init_floor = self.dt_init_range
        nn.init.uniform_(self.x_proj_weight, -self.d_inner**-0.5, self.d_inner**-0.5)
        nn.init.uniform_(self.dt_projs_weight, -self.dt_rank**-0.5, self.dt_rank**-0.5)
        bias = self.dt_projs_bias
        uniform = torch.rand(bias.shape, device=bias.device, dtype=torch.float32)
        dt = torch.exp(uniform * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=dt_init_floor)
        bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse of softplus
        states = torch.arange(1, self.d_state + 1, dtype=torch.float32, device=self.A_logs.device)
        self.A_logs.copy_(torch.log(states).expand_as(self.A_logs))
        self.Ds.fill_(1.0)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, H, W) -> (B, C, H, W)."""
        x = self.act(self.conv2d(self.in_proj(x)))
        y = self.scan_routes(x)
        return self.dropout(self.out_proj(self.out_norm(y)))

    def scan_routes(self, x: Tensor) -> Tensor:
        """Scan x (B, Di, H, W) along the routes and merge: -> (B, Di, H, W)."""
        args = (x, self.x_proj_weight, self.dt_projs_weight, self.dt_projs_bias, self.A_logs, self.Ds,
                self.route_codes, self.scan_backend)
        if torch.jit.is_scripting():
            return cross_scan_fused(*args)
        if self.cross_scan == "per_route":
            return cross_scan_merge(*args)
        return cross_scan_fused(*args)

    @torch.jit.unused
    def widest_map_channels(self, x: Tensor) -> int:
        """Channels of the widest map SS2D stores per sample for an input x (B, C, H, W) without
        autograd: the K * Di full-rank step sizes (and the per-route path's route copies), or, where
        the CPU kernel projects the step sizes itself (the fused op on the ``cpu`` backend), the
        larger of Di and the K * (R + 2N) low-rank step sizes, B and C."""
        folds = self.cross_scan == "fused" and resolve_backend(self.scan_backend, x.device, x.dtype) == "cpu"
        if folds:
            return max(self.d_inner, len(self.route_codes) * (self.dt_rank + 2 * self.d_state))
        return len(self.route_codes) * self.d_inner

    def extra_repr(self) -> str:
        return (
            f"scan={self.scan!r}, routes={self.routes!r}, cross_scan={self.cross_scan!r}, "
            f"scan_backend={self.scan_backend!r}, d_state={self.d_state}, dt_rank={self.dt_rank}"
        )
