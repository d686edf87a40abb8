"""The step-size projection the four-route op can fold in: full-rank step sizes from low-rank ones.

VMamba's SS2D projects each route's low-rank step sizes (rank R, a few dozen) to one per channel
with a per-route (dim, R) matrix right before the scan. :func:`cross_selective_scan_2d` takes the
low-rank step sizes and the matrix (``delta_proj_weight``) so that the compiled CPU kernel projects
each channel's plane where it reads it; these functions are the same projection and its gradients
as batched matmuls, for the other backends and the op's autograd formula.
"""
from __future__ import annotations

import torch

Tensor = torch.Tensor


def project_delta(delta_low: Tensor, weight: Tensor) -> Tensor:
    """delta_full[b, k, d] = sum_r weight[k, d, r] * delta_low[b, k, r].

    Args:
        delta_low: (batch, K, R, H, W) low-rank step sizes.
        weight: (K, dim, R) per-route projection; cast to delta_low's dtype.
    Returns:
        (batch, K, dim, H, W) in delta_low's dtype.
    """
    batch, routes, rank, height, width = delta_low.shape
    dim = weight.shape[1]
    # bmm with the weight repeated per sample: fvcore counts bmm with its batch (not a broadcast matmul)
    per_sample = weight.to(delta_low.dtype).unsqueeze(0).expand(batch, routes, dim, rank)
    full = torch.bmm(per_sample.reshape(batch * routes, dim, rank), delta_low.reshape(batch * routes, rank, height * width))
    return full.view(batch, routes, dim, height, width)


def project_delta_grads(ddelta: Tensor, delta_low: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """Gradients through :func:`project_delta` given ddelta, the gradient of its output.

    Args:
        ddelta: (batch, K, dim, H, W); delta_low: (batch, K, R, H, W); weight: (K, dim, R).
    Returns:
        (ddelta_low (batch, K, R, H, W) in delta_low's dtype, dweight (K, dim, R) in weight's dtype).
    """
    batch, routes, rank, height, width = delta_low.shape
    dim = weight.shape[1]
    grad = ddelta.reshape(batch, routes, dim, height * width)
    low = delta_low.reshape(batch, routes, rank, height * width).to(grad.dtype)
    ddelta_low = torch.matmul(weight.to(grad.dtype).transpose(1, 2), grad)  # (batch, K, R, L)
    dweight = torch.matmul(grad, low.transpose(2, 3)).sum(0)  # (K, dim, R)
    return ddelta_low.view(delta_low.shape).to(delta_low.dtype), dweight.to(weight.dtype)
