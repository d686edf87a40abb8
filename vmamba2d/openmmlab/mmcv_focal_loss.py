"""Sigmoid focal loss with mmcv's interface (``mmcv.ops.sigmoid_focal_loss``) in PyTorch.

Part of vmamba2d's stand-in for ``mmcv.ops`` (see :mod:`vmamba2d.openmmlab.mmcv_compat`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def sigmoid_focal_loss(input: torch.Tensor, target: torch.Tensor, gamma: float = 2.0,
                       alpha: float = 0.25, weight: torch.Tensor | None = None,
                       reduction: str = "mean") -> torch.Tensor:
    """Sigmoid focal loss with class-index targets (mmcv.ops.sigmoid_focal_loss).

    Element (n, c) is positive when ``target[n] == c``: loss ``-alpha (1-p)^gamma log p``,
    otherwise ``-(1-alpha) p^gamma log(1-p)``, with ``p = sigmoid(input[n, c])``; a ``target``
    equal to the number of classes (background) makes every element negative.

    Args:
        input: (N, C) logits.
        target: (N,) int64 class indices in [0, C].
        gamma, alpha: focusing and balance parameters.
        weight: optional (C,) per-class weight, applied through ``weight[target[n]]``.
        reduction: "none" -> (N, C); "mean" -> sum / N; "sum" -> sum.

    Returns:
        The loss, shaped by ``reduction``.
    """
    if input.dim() != 2:
        raise ValueError(f"sigmoid_focal_loss: input must be (N, C), got shape {tuple(input.shape)}")
    if target.shape != input.shape[:1] or target.dtype != torch.long:
        raise ValueError("sigmoid_focal_loss: target must be an int64 tensor of shape "
                         f"({input.shape[0]},), got {target.dtype} {tuple(target.shape)}")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"sigmoid_focal_loss: reduction must be 'none', 'mean' or 'sum', got "
                         f"{reduction!r}")
    classes = torch.arange(input.shape[1], device=input.device)
    positive = (target.unsqueeze(1) == classes.unsqueeze(0)).to(input.dtype)
    prob = input.sigmoid()
    positive_loss = -alpha * (1 - prob).pow(gamma) * F.logsigmoid(input)
    negative_loss = -(1 - alpha) * prob.pow(gamma) * F.logsigmoid(-input)
    loss = positive * positive_loss + (1 - positive) * negative_loss
    if weight is not None:
        if weight.dim() != 1 or weight.shape[0] != input.shape[1]:
            raise ValueError(f"sigmoid_focal_loss: weight must be ({input.shape[1]},), got shape "
                             f"{tuple(weight.shape)}")
        # mmcv indexes the weight by the target class; background targets (== C) get weight 1
        padded = torch.cat([weight.to(loss.dtype), weight.new_ones(1).to(loss.dtype)])
        loss = loss * padded[target].unsqueeze(1)
    if reduction == "mean":
        return loss.sum() / input.shape[0]
    if reduction == "sum":
        return loss.sum()
    return loss
