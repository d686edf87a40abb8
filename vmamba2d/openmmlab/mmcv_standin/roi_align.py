"""RoIAlign with mmcv's interface (``mmcv.ops.roi_align`` / ``RoIAlign``) on torchvision's kernel.

Part of vmamba2d's stand-in for ``mmcv.ops`` (see :mod:`vmamba2d.openmmlab.mmcv_standin.install`). RoIs
use mmcv's format: a (K, 5) tensor of rows ``[batch_index, x1, y1, x2, y2]`` in input-image
coordinates, mapped onto the feature map by ``spatial_scale``.

``roi_align`` runs ``torchvision.ops.roi_align``, whose sampling is mmcv's (both come from
Detectron's RoIAlign): per output bin a ``sampling_ratio``-squared grid of bilinear samples
(``ceil(roi size / output size)`` per side when ``sampling_ratio <= 0``), samples more than one
pixel outside the map read 0, and ``aligned=True`` shifts the RoI by -0.5 pixel (with
``aligned=False`` RoI sides are at least one pixel). Only ``pool_mode='avg'`` exists.
"""
from __future__ import annotations

from typing import Union

import torch
import torchvision
from torch import nn
from torch.nn.modules.utils import _pair

from .unavailable import INSTALL_HINT

OutputSize = Union[int, tuple[int, int]]


def _check_rois(op: str, input: torch.Tensor, rois: torch.Tensor) -> None:
    if input.dim() != 4:
        raise ValueError(f"{op}: input must be (N, C, H, W), got shape {tuple(input.shape)}")
    if rois.dim() != 2 or rois.shape[1] != 5:
        raise ValueError(f"{op}: rois must be (K, 5) [batch_index, x1, y1, x2, y2], got shape "
                         f"{tuple(rois.shape)}")


def roi_align(input: torch.Tensor, rois: torch.Tensor, output_size: OutputSize,
              spatial_scale: float = 1.0, sampling_ratio: int = 0, pool_mode: str = "avg",
              aligned: bool = True) -> torch.Tensor:
    """Average of bilinear samples over each RoI bin (mmcv.ops.roi_align); differentiable.

    Args:
        input: (N, C, H, W) feature map.
        rois: (K, 5) rows [batch_index, x1, y1, x2, y2] in image coordinates.
        output_size: (out_h, out_w), or an int for both.
        spatial_scale: factor from image to feature-map coordinates (1 / stride).
        sampling_ratio: samples per bin side; <= 0 takes ``ceil(roi side / output side)``.
        pool_mode: only 'avg' ('max' needs mmcv's compiled op).
        aligned: shift the RoI by -0.5 feature pixel (Detectron2's pixel model); False is the
            legacy behaviour (RoI sides at least one pixel).

    Returns:
        (K, C, out_h, out_w) pooled features.
    """
    _check_rois("roi_align", input, rois)
    if pool_mode == "max":
        raise NotImplementedError(f"mmcv.ops.roi_align with pool_mode='max' is not available without full mmcv "
                                  f"({INSTALL_HINT}): the stand-in's roi_align averages (pool_mode='avg').")
    if pool_mode != "avg":
        raise ValueError(f"roi_align: pool_mode must be 'avg' or 'max', got {pool_mode!r}")
    return torchvision.ops.roi_align(input, rois.to(input.dtype), _pair(output_size),
                                     float(spatial_scale), int(sampling_ratio), bool(aligned))


class RoIAlign(nn.Module):
    """Module form of :func:`roi_align` (mmcv.ops.RoIAlign); ``forward(input, rois)``.

    ``use_torchvision`` is accepted for mmcv compatibility; both settings run torchvision's op.
    """

    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0,
                 sampling_ratio: int = 0, pool_mode: str = "avg", aligned: bool = True,
                 use_torchvision: bool = False):
        super().__init__()
        if pool_mode not in ("avg", "max"):
            raise ValueError(f"RoIAlign: pool_mode must be 'avg' or 'max', got {pool_mode!r}")
        self.output_size = _pair(output_size)
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = int(sampling_ratio)
        self.pool_mode = pool_mode
        self.aligned = aligned
        self.use_torchvision = use_torchvision

    def forward(self, input: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) features, (K, 5) rois -> (K, C, out_h, out_w)."""
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio,
                         self.pool_mode, self.aligned)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, pool_mode={self.pool_mode}, "
                f"aligned={self.aligned}")
