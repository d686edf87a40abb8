"""SS2D: VMamba v2's selective-scan mixer (forward type "v05_noz", channels-first).

The mixer scans the feature map along four routes (K = 4) and sums the results:

    k0  the map in row-major order            (a 2D scan on the H x W grid, origin top-left)
    k1  the transposed map (column-major)     (a 2D scan on the W x H grid)
    k2  k0 reversed (the map rotated 180 deg) (H x W grid, origin bottom-right)
    k3  k1 reversed                           (W x H grid)

``scan="2d"`` runs every route through the 2D selective scan (2DVMamba); ``scan="1d"`` runs the
same four sequences through a 1D scan (the VMamba baseline), which is the 2D op on a 1 x L map.
Parameter names and shapes follow the public VMamba v2 code so its checkpoints load unchanged.
"""
from __future__ import annotations

import math
from typing import List, Optional, Union

import torch
import torch.nn as nn
from timm.layers import LayerNorm2d

from ..ops import BACKENDS, selective_scan_2d
from ..ops.fused import selective_scan_2d_fused

Tensor = torch.Tensor

NUM_ROUTES = 4
SCAN_MODES = ("2d", "1d")
# Routes are scanned in the order (k0, k2, k1, k3) so that the two routes of one grid shape are
# adjacent channel blocks: a non-square map needs one op call per grid, a square map one call.
GRID_SORTED_ROUTES = (0, 2, 1, 3)  # as written out in _grid_sorted
LAYER_NORM_EPS = 1e-5  # VMamba's LayerNorm2d keeps nn.LayerNorm's default


def resolve_dt_rank(dim: int, dt_rank: Union[int, str]) -> int:
    """``dt_rank="auto"`` means ceil(dim / 16) (Mamba / VMamba); an int is used as given."""
    if dt_rank == "auto":
        return math.ceil(dim / 16)
    if isinstance(dt_rank, bool) or not isinstance(dt_rank, int) or dt_rank < 1:
        raise ValueError(f"dt_rank must be 'auto' or a positive int, got {dt_rank!r}")
    return dt_rank


def _per_route(weight: Tensor, batch: int) -> Tensor:
    """Route weights (K, out, in) repeated for every sample: (batch * K, out, in) for torch.bmm."""
    routes, rows, cols = weight.shape
    return weight.unsqueeze(0).expand(batch, routes, rows, cols).reshape(batch * routes, rows, cols)


def _grid_sorted(per_route: Tensor) -> Tensor:
    """(K, ...) per-route values in GRID_SORTED_ROUTES order (k0, k2, k1, k3)."""
    return torch.stack((per_route[0], per_route[2], per_route[1], per_route[3]))


def cross_scan_merge(
    x: Tensor,
    x_proj_weight: Tensor,
    dt_projs_weight: Tensor,
    dt_projs_bias: Tensor,
    A_logs: Tensor,
    Ds: Tensor,
    scan: str,
    backend: str,
) -> Tensor:
    """Scan x along the four routes and sum the route outputs back onto the map.

    Args:
        x: (B, Di, H, W) activations.
        x_proj_weight: (K, R + 2N, Di) per-route projection to (dt, B, C).
        dt_projs_weight: (K, Di, R); dt_projs_bias: (K, Di) per-route step-size projection.
        A_logs: (K * Di, N); Ds: (K * Di,).
        scan: "2d" (2D scan on each route's own grid) or "1d" (1D scan of each route's sequence).
        backend: backend for :func:`selective_scan_2d`.
    Returns:
        (B, Di, H, W).

    A plain function so that FX symbolic tracing records it as one call (``torch.fx.wrap`` below):
    it reads the runtime shape of x, which a symbolic trace cannot.
    """
    batch, d_inner, height, width = x.shape
    length = height * width
    k = x_proj_weight.shape[0]  # NUM_ROUTES
    n = A_logs.shape[1]
    r = dt_projs_weight.shape[2]

    rows = x.flatten(2)  # (B, Di, L), row-major
    cols = x.transpose(2, 3).flatten(2)  # (B, Di, L), column-major = row-major of the W x H map
    xs = torch.stack([rows, rows.flip(-1), cols, cols.flip(-1)], dim=1).reshape(batch, k * d_inner, length)

    # Per-route projections as batched matmuls over (batch, route): much faster on CPU than
    # grouped 1x1 convs, and counted exactly by fvcore's bmm handle.
    x_dbl = torch.bmm(_per_route(_grid_sorted(x_proj_weight), batch), xs.view(batch * k, d_inner, length))
    x_dbl = x_dbl.view(batch, k, r + 2 * n, length)
    dts, Bs, Cs = torch.split(x_dbl, [r, n, n], dim=2)
    dts = torch.bmm(_per_route(_grid_sorted(dt_projs_weight), batch), dts.reshape(batch * k, r, length))
    dts = dts.view(batch, k * d_inner, length)

    # The scan's small parameters stay in (at least) fp32 under AMP, as in VMamba.
    param_dtype = torch.promote_types(A_logs.dtype, torch.float32)
    A = _grid_sorted(-torch.exp(A_logs.to(param_dtype)).view(k, d_inner, n)).reshape(k * d_inner, n)
    D = _grid_sorted(Ds.to(param_dtype).view(k, d_inner)).reshape(-1)
    delta_bias = _grid_sorted(dt_projs_bias.to(param_dtype)).reshape(-1)
    Bs, Cs = Bs.contiguous(), Cs.contiguous()

    if scan == "1d":
        grids = [(0, k, 1, length)]
    elif height == width:
        grids = [(0, k, height, width)]
    else:  # routes k0, k2 scan the H x W grid; k1, k3 the transposed W x H grid
        grids = [(0, 2, height, width), (2, k, width, height)]
    ys: List[Tensor] = []
    for first, last, grid_h, grid_w in grids:
        lo, hi = first * d_inner, last * d_inner
        args = (xs[:, lo:hi], dts[:, lo:hi], A[lo:hi], Bs[:, first:last], Cs[:, first:last], D[lo:hi], delta_bias[lo:hi])
        if torch.jit.is_scripting():  # no backend dispatch in TorchScript: the device's compiled kernel
            ys.append(selective_scan_2d_fused(*args, True, grid_h, grid_w, xs.dtype))
        else:
            ys.append(selective_scan_2d(*args, True, height=int(grid_h), width=int(grid_w), backend=backend))
    y = (ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)).view(batch, k, d_inner, length)
    y_rows = y[:, 0] + y[:, 1].flip(-1)
    y_cols = y[:, 2] + y[:, 3].flip(-1)
    return y_rows.view(batch, d_inner, height, width) + y_cols.view(batch, d_inner, width, height).transpose(2, 3)


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
        scan_backend: backend passed to :func:`vmamba2d.ops.selective_scan_2d`.
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
        if d_state < 1:
            raise ValueError(f"d_state must be >= 1, got {d_state}")
        d_inner = int(ssm_ratio * dim)
        if d_inner < 1:
            raise ValueError(f"ssm_ratio * dim must be >= 1, got {ssm_ratio} * {dim}")
        self.scan = scan
        self.scan_backend = scan_backend
        self.d_state = d_state
        self.d_inner = d_inner
        self.dt_rank = resolve_dt_rank(dim, dt_rank)
        self.dt_init_range = (dt_min, dt_max, dt_init_floor)

        self.in_proj = nn.Conv2d(dim, d_inner, kernel_size=1, bias=False, **dd)
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
        self.out_proj = nn.Conv2d(d_inner, dim, kernel_size=1, bias=False, **dd)
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
        """Cross-scan x (B, Di, H, W) along the four routes and merge: -> (B, Di, H, W)."""
        return cross_scan_merge(
            x, self.x_proj_weight, self.dt_projs_weight, self.dt_projs_bias, self.A_logs, self.Ds,
            self.scan, self.scan_backend,
        )

    def extra_repr(self) -> str:
        return f"scan={self.scan!r}, scan_backend={self.scan_backend!r}, d_state={self.d_state}, dt_rank={self.dt_rank}"
