"""Parameters and FLOPs of a whole mmseg segmentor (fvcore: one multiply-add = one flop)."""
from __future__ import annotations

from typing import Dict, Sequence

import torch
import torch.nn as nn
from mmengine.model import revert_sync_batchnorm

from vmamba2d.flops import flops_by_operator


class _InferenceForward(nn.Module):
    """(B, 3, H, W) -> decode-head logits (B, classes, H/4, W/4): what inference computes
    (backbone, neck, decode head; the auxiliary head is training-only)."""

    def __init__(self, segmentor: nn.Module) -> None:
        super().__init__()
        self.segmentor = segmentor

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.segmentor._forward(inputs)


def segmentor_complexity(segmentor: nn.Module, shape: Sequence[int] = (512, 2048)) -> Dict[str, object]:
    """Count the parameters and FLOPs of ``segmentor`` on one (1, 3, height, width) image.

    Args:
        segmentor: an mmseg segmentor (e.g. ``EncoderDecoder``); SyncBN is reverted to BN and the
            model is put in eval mode.
        shape: (height, width) of the input.

    Returns:
        dict with ``params`` (all parameters), ``params_inference`` (without the auxiliary head),
        ``flops`` (inference forward, fvcore convention) and ``flops_by_operator``.

    Raises:
        ValueError for a bad ``shape``; RuntimeError when the model has scan layers but the compiled
        scan kernel is unavailable (see :func:`vmamba2d.flops.flops_by_operator`).
    """
    if len(shape) != 2 or not all(isinstance(s, int) and s > 0 for s in shape):
        raise ValueError(f"shape must be (height, width) positive ints, got {tuple(shape)}")
    segmentor = revert_sync_batchnorm(segmentor).eval()
    params = sum(p.numel() for p in segmentor.parameters())
    aux = getattr(segmentor, "auxiliary_head", None)
    aux_params = sum(p.numel() for p in aux.parameters()) if isinstance(aux, nn.Module) else 0
    by_operator = flops_by_operator(_InferenceForward(segmentor), (3, *shape))
    return {
        "params": params,
        "params_inference": params - aux_params,
        "flops": sum(by_operator.values()),
        "flops_by_operator": by_operator,
    }
