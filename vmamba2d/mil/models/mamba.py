"""The Mamba layers of the SSM models: the mixer whose scan is ``selective_scan_2d`` over a
height x width grid, its pre-norm block, and :class:`SSMMIL` (projection, Mamba blocks, final norm,
attention pooling, head) that MambaMIL2D and MambaMIL build on."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...ops import selective_scan_2d
from .base import AttentionMIL, require_choice, require_positive

Tensor = torch.Tensor

CONV_KINDS = ("1d", "2d")
INITS = ("official", "mamba")


class RMSNorm(nn.Module):
    """Root-mean-square norm with a weight and no bias: (..., dim) -> (..., dim)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * scale * self.weight


class MambaMixer(nn.Module):
    """Mamba's mixer with the 2D selective scan over a height x width grid (docs/mil.md#model).

    ``conv="1d"``: causal depthwise Conv1d (kernel ``d_conv``) along the row-major sequence, as the
    official model; ``conv="2d"``: depthwise 3 x 3 Conv2d on the grid (sees the cells below and to
    the right, so the block is no longer causal on the grid).
    """

    def __init__(self, dim: int, d_state: int = 16, expand: int = 2, d_conv: int = 4, conv: str = "1d",
                 scan_backend: str = "auto") -> None:
        super().__init__()
        self.conv_kind = require_choice("conv", conv, CONV_KINDS)
        self.scan_backend = scan_backend
        inner = expand * dim
        self.d_state = d_state
        self.dt_rank = math.ceil(dim / 16)
        self.in_proj = nn.Linear(dim, 2 * inner, bias=False)
        if conv == "1d":
            self.conv = nn.Conv1d(inner, inner, d_conv, groups=inner, padding=d_conv - 1)
        else:
            self.conv = nn.Conv2d(inner, inner, 3, groups=inner, padding=1)
        self.x_proj = nn.Linear(inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, inner)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, dim, bias=False)

    def _conv(self, conv: nn.Module, u: Tensor, height: int, width: int) -> Tensor:
        """(E, L) -> (E, L) depthwise convolution ``conv`` on the raster sequence or on the grid."""
        length = u.shape[1]
        if self.conv_kind == "2d":
            return conv(u.view(1, -1, height, width))[0].reshape(-1, length)
        # Causal depthwise Conv1d as a sum of shifted products: same result as conv(u)[..., :L],
        # many times faster on CPU than the depthwise convolution kernel for one long sequence.
        taps = conv.weight.shape[-1]
        padded = F.pad(u, (taps - 1, 0))
        out = conv.bias.unsqueeze(1).to(u.dtype)
        for k in range(taps):
            out = out + conv.weight[:, 0, k : k + 1] * padded[:, k : k + length]
        return out

    def _branch(self, u: Tensor, z: Tensor, height: int, width: int, conv: nn.Module, x_proj: nn.Linear,
                dt_proj: nn.Linear, A_log: Tensor, D: Tensor) -> Tensor:
        """One selective-scan branch: u, z (E, L) after in_proj -> gated y * SiLU(z) (E, L)."""
        u = F.silu(self._conv(conv, u, height, width))
        dt, B, C = x_proj(u.t()).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.linear(dt, dt_proj.weight).t()  # (E, L), bias applied inside the scan
        scan_dtype = torch.promote_types(u.dtype, torch.float32)
        y = selective_scan_2d(
            u.unsqueeze(0), delta.unsqueeze(0),
            -torch.exp(A_log.to(scan_dtype)),
            B.t()[None, None], C.t()[None, None],
            D.to(scan_dtype), dt_proj.bias.to(scan_dtype), True,
            height=height, width=width, backend=self.scan_backend,
        )[0]
        return y * F.silu(z)

    def forward(self, x: Tensor, height: int, width: int) -> Tensor:
        """x (L, dim) tokens in row-major order of a height x width grid -> (L, dim)."""
        u, z = self.in_proj(x).t().chunk(2, dim=0)  # (E, L) each
        y = self._branch(u, z, height, width, self.conv, self.x_proj, self.dt_proj, self.A_log, self.D)
        return self.out_proj(y.t())


class MambaBlock(nn.Module):
    """Pre-norm residual block: x + mixer(RMSNorm(x)); (L, dim) -> (L, dim)."""

    def __init__(self, dim: int, **mixer_options: Any) -> None:
        super().__init__()
        self.norm = RMSNorm(dim)
        self.mixer = MambaMixer(dim, **mixer_options)

    def forward(self, x: Tensor, height: int, width: int) -> Tensor:
        return x + self.mixer(self.norm(x), height, width)



def init_mamba_dt(dt_proj: nn.Linear, dt_rank: int, dt_min: float = 1e-3, dt_max: float = 1e-1,
                   floor: float = 1e-4) -> None:
    """Mamba's dt_proj init: weight U(+-rank^-0.5); bias = softplus^-1 of log-uniform dt in [dt_min, dt_max]."""
    bound = dt_rank ** -0.5
    nn.init.uniform_(dt_proj.weight, -bound, bound)
    inner = dt_proj.bias.numel()
    dt = torch.exp(torch.rand(inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
    with torch.no_grad():
        dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))


class SSMMIL(AttentionMIL):
    """Projection, U Mamba blocks, final LayerNorm, attention pooling and head."""

    def __init__(self, in_dim: int, num_classes: int, *, dim: int, d_state: int, expand: int, d_conv: int,
                 num_blocks: int, dropout: float, conv: str, attn_hidden: int, init: str, survival: bool,
                 scan_backend: str) -> None:
        super().__init__(in_dim, num_classes, dim, dropout, attn_hidden, survival)
        require_positive("num_blocks", num_blocks)
        require_positive("d_state", d_state)
        require_positive("expand", expand)
        require_choice("init", init, INITS)
        self.blocks = nn.ModuleList(
            MambaBlock(dim, d_state=d_state, expand=expand, d_conv=d_conv, conv=conv, scan_backend=scan_backend)
            for _ in range(num_blocks)
        )
        self.norm = nn.LayerNorm(dim)
        self._config = dict(in_dim=in_dim, num_classes=num_classes, dim=dim, d_state=d_state, expand=expand,
                            d_conv=d_conv, num_blocks=num_blocks, dropout=dropout, conv=conv,
                            attn_hidden=attn_hidden, init=init, survival=survival, scan_backend=scan_backend)

    def _apply_init(self, init: str) -> None:
        if init == "official":
            self._init_xavier()
        else:
            for block in self.blocks:
                init_mamba_dt(block.mixer.dt_proj, block.mixer.dt_rank)

    def _mix(self, tokens: Tensor, height: int, width: int) -> Tensor:
        """(L, dim) tokens in row-major order of a height x width grid -> normalised (L, dim)."""
        for block in self.blocks:
            tokens = block(tokens, height, width)
        return self.norm(tokens)
