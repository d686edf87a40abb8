"""Parameters and FLOPs of a whole mmdet detector (fvcore: one multiply-add = one flop)."""
from __future__ import annotations

from typing import Dict, Sequence

import torch
import torch.nn as nn
from mmdet.structures import DetDataSample
from mmengine.model import revert_sync_batchnorm

from vmamba2d.flops import flops_by_operator


class _InferenceForward(nn.Module):
    """(1, 3, H, W) -> the detector's ``_forward`` outputs on one image of that size: backbone, neck,
    RPN head with its proposals, and the RoI heads on them (mmdet's ``mode='tensor'``, what mmdet's
    get_flops tool and VMamba's FLOP script trace; no post-processing)."""

    def __init__(self, detector: nn.Module, shape: Sequence[int]) -> None:
        super().__init__()
        self.detector = detector
        self.shape = tuple(shape)
        self.proposals = 0

    def forward(self, inputs: torch.Tensor) -> tuple:
        sample = DetDataSample(metainfo=dict(img_shape=self.shape, ori_shape=self.shape, pad_shape=self.shape,
                                             batch_input_shape=self.shape, scale_factor=(1.0, 1.0)))
        outputs = self.detector._forward(inputs, [sample])
        bbox_outputs = outputs[-1][0] if outputs else None  # roi_head.forward: (cls_score, bbox_pred, ...)
        self.proposals = int(bbox_outputs.shape[0]) if isinstance(bbox_outputs, torch.Tensor) else 0
        return outputs


def detector_complexity(detector: nn.Module, shape: Sequence[int] = (1280, 800)) -> Dict[str, object]:
    """Count the parameters and FLOPs of ``detector`` on one (1, 3, height, width) image.

    Args:
        detector: an mmdet detector (e.g. ``MaskRCNN``) with a :class:`VMamba2DBackbone` or any
            backbone; SyncBN is reverted to BN and the model is put in eval mode.
        shape: (height, width) of the input (VMamba reports 1280 x 800).

    Returns:
        dict with ``params``, ``flops`` (the whole ``mode='tensor'`` forward, see
        :class:`_InferenceForward`), ``backbone_flops`` (the backbone alone on the same input),
        ``proposals`` (how many RPN proposals the RoI heads ran on: the RoI-head FLOPs scale with
        it) and ``flops_by_operator``.

    Raises:
        ValueError for a bad ``shape``; RuntimeError when the model has scan layers but the compiled
        scan kernel is unavailable (see :func:`vmamba2d.flops.flops_by_operator`).
    """
    if len(shape) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
        raise ValueError(f"shape must be (height, width) positive ints, got {tuple(shape)}")
    detector = revert_sync_batchnorm(detector).eval()
    forward = _InferenceForward(detector, shape)
    by_operator = flops_by_operator(forward, (3, *shape))
    backbone_flops = sum(flops_by_operator(detector.backbone, (3, *shape)).values())
    return {
        "params": sum(p.numel() for p in detector.parameters()),
        "flops": sum(by_operator.values()),
        "backbone_flops": backbone_flops,
        "proposals": forward.proposals,
        "flops_by_operator": by_operator,
    }
