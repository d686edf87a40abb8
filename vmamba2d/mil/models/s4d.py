"""S4D: the diagonal structured state-space layer (Gu et al., NeurIPS 2022), as S4MIL uses it.

Per channel h, ``N / 2`` complex diagonal states with A = -exp(log_A_real) + i A_imag, step
dt = exp(log_dt), zero-order-hold discretisation and a real output ``2 Re(C x)``:
    x_t = exp(dt A) x_{t-1} + (exp(dt A) - 1) / A * u_t,    y_t = 2 Re(C x_t) + D u_t.
The layer computes this as a causal convolution with the kernel K_l = 2 Re(C (exp(dt A) - 1) / A
exp(dt A l)) by FFT, then GELU and a pointwise GLU projection (Linear(H, 2H) -> GLU).
Initialisation as S4D-Lin: log_dt ~ U[log 1e-3, log 1e-1], C ~ CN(0, 1), A = -1/2 + i pi n, D ~ N(0, 1).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

Tensor = torch.Tensor

KERNEL_CHUNK = 2048  # kernel positions computed at once: bounds the (H, N/2, chunk) complex buffer


class S4D(nn.Module):
    """S4D layer over one sequence: (L, dim) -> (L, dim).

    Args: dim (channels H), d_state (N, even: N / 2 complex states per channel), dt_min, dt_max
    (range of the initial step sizes).
    """

    def __init__(self, dim: int, d_state: int = 64, dt_min: float = 1e-3, dt_max: float = 1e-1) -> None:
        super().__init__()
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if d_state < 2 or d_state % 2:
            raise ValueError(f"d_state must be an even number >= 2 (N / 2 complex states), got {d_state}")
        half = d_state // 2
        self.D = nn.Parameter(torch.randn(dim))
        self.log_dt = nn.Parameter(torch.rand(dim) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.C = nn.Parameter(torch.view_as_real(torch.randn(dim, half, dtype=torch.cfloat)))
        self.log_A_real = nn.Parameter(torch.log(0.5 * torch.ones(dim, half)))
        self.A_imag = nn.Parameter(math.pi * torch.arange(half, dtype=torch.float32).repeat(dim, 1))
        self.output_linear = nn.Linear(dim, 2 * dim)

    def kernel(self, length: int) -> Tensor:
        """The convolution kernel K (H, length)."""
        dt = torch.exp(self.log_dt)
        A = torch.complex(-torch.exp(self.log_A_real), self.A_imag)  # (H, N/2)
        dtA = A * dt.unsqueeze(-1)
        weights = torch.view_as_complex(self.C) * (torch.exp(dtA) - 1) / A
        chunks = []
        for start in range(0, length, KERNEL_CHUNK):
            positions = torch.arange(start, min(length, start + KERNEL_CHUNK), device=dt.device, dtype=dt.dtype)
            powers = torch.exp(dtA.unsqueeze(-1) * positions)  # (H, N/2, chunk)
            chunks.append(2 * torch.einsum("hn,hnl->hl", weights, powers).real)
        return torch.cat(chunks, dim=-1)

    def forward(self, u: Tensor) -> Tensor:
        """u (L, dim) -> (L, dim)."""
        length = u.shape[0]
        signal = u.t().to(torch.promote_types(u.dtype, torch.float32))  # (H, L)
        kernel = self.kernel(length).to(signal.dtype)
        y = torch.fft.irfft(torch.fft.rfft(signal, n=2 * length) * torch.fft.rfft(kernel, n=2 * length),
                            n=2 * length)[..., :length]
        y = F.gelu(y + signal * self.D.to(signal.dtype).unsqueeze(-1)).to(u.dtype)
        return F.glu(self.output_linear(y.t()), dim=-1)
