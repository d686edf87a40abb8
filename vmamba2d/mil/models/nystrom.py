"""Nyström self-attention (Xiong et al., AAAI 2021), the attention layer of TransMIL.

Softmax attention softmax(Q K^T) V over n tokens is approximated with m landmarks (the means of
m consecutive groups of queries and keys): softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T) V,
with the pseudo-inverse from a few Newton-Schulz-type iterations, plus a depthwise convolution of
the values along the sequence as a residual. The sequence is zero-padded at the front to a
multiple of m (the padded rows take part in the landmarks and the softmaxes, as in the layer
TransMIL uses); the output keeps the last n rows.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

Tensor = torch.Tensor


def iterative_pinv(matrix: Tensor, iterations: int) -> Tensor:
    """Approximate Moore-Penrose inverse of (..., m, m) ``matrix`` (rows summing to one).

    Starts from ``matrix^T / (max row sum * max column sum)`` (the maxima over the whole tensor)
    and applies ``Z <- Z (13 I - A Z (15 I - A Z (7 I - A Z))) / 4`` ``iterations`` times.
    """
    absolute = matrix.abs()
    z = matrix.transpose(-1, -2) / (absolute.sum(-1).max() * absolute.sum(-2).max())
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    for _ in range(iterations):
        az = matrix @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


class NystromAttention(nn.Module):
    """Multi-head Nyström attention over one sequence: (n, dim) -> (n, dim).

    Args:
        dim: token size. heads, head_dim: attention heads and their size (inner = heads * head_dim).
        landmarks: number of landmarks m. pinv_iterations: iterations of ``iterative_pinv``.
        residual_kernel: length of the depthwise value convolution added to the output (0: none).
        dropout: dropout after the output projection.
    """

    def __init__(self, dim: int, heads: int = 8, head_dim: int = 64, landmarks: int = 256,
                 pinv_iterations: int = 6, residual_kernel: int = 33, dropout: float = 0.0) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("heads", heads), ("head_dim", head_dim), ("landmarks", landmarks)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if residual_kernel < 0 or (residual_kernel and residual_kernel % 2 == 0):
            raise ValueError(f"residual_kernel must be 0 or odd, got {residual_kernel}")
        self.heads, self.head_dim, self.landmarks = heads, head_dim, landmarks
        self.pinv_iterations = pinv_iterations
        inner = heads * head_dim
        self.to_qkv = nn.Linear(dim, 3 * inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(dropout))
        self.res_conv = (nn.Conv2d(heads, heads, (residual_kernel, 1), padding=(residual_kernel // 2, 0),
                                   groups=heads, bias=False) if residual_kernel else None)

    def forward(self, x: Tensor) -> Tensor:
        """x (n, dim) -> (n, dim)."""
        length = x.shape[0]
        groups = -(-length // self.landmarks)  # tokens per landmark
        x = F.pad(x, (0, 0, groups * self.landmarks - length, 0))
        padded = x.shape[0]
        q, k, v = (t.reshape(padded, self.heads, self.head_dim).transpose(0, 1)
                   for t in self.to_qkv(x).chunk(3, dim=-1))  # (heads, N, head_dim)
        q = q * self.head_dim ** -0.5
        q_landmarks = q.reshape(self.heads, self.landmarks, groups, self.head_dim).mean(2)
        k_landmarks = k.reshape(self.heads, self.landmarks, groups, self.head_dim).mean(2)
        kernel_1 = torch.softmax(q @ k_landmarks.transpose(-1, -2), dim=-1)  # (heads, N, m)
        kernel_2 = torch.softmax(q_landmarks @ k_landmarks.transpose(-1, -2), dim=-1)  # (heads, m, m)
        kernel_3 = torch.softmax(q_landmarks @ k.transpose(-1, -2), dim=-1)  # (heads, m, N)
        out = (kernel_1 @ iterative_pinv(kernel_2, self.pinv_iterations)) @ (kernel_3 @ v)
        if self.res_conv is not None:
            out = out + self.res_conv(v.unsqueeze(0))[0]
        out = out.transpose(0, 1).reshape(padded, self.heads * self.head_dim)
        return self.to_out(out)[-length:]
