"""RoI pooling with mmcv's interface (``mmcv.ops.roi_align`` / ``roi_pool``) in PyTorch.

Part of vmamba2d's stand-in for ``mmcv.ops`` (see :mod:`vmamba2d.openmmlab.mmcv_compat`). RoIs
use mmcv's format: a (K, 5) tensor of rows ``[batch_index, x1, y1, x2, y2]`` in input-image
coordinates, mapped onto the feature map by ``spatial_scale``.

* ``roi_align`` runs ``torchvision.ops.roi_align``, whose sampling is mmcv's (both come from
  Detectron's RoIAlign): per output bin a ``sampling_ratio``-squared grid of bilinear samples
  (``ceil(roi size / output size)`` per side when ``sampling_ratio <= 0``), samples more than one
  pixel outside the map read 0, and ``aligned=True`` shifts the RoI by -0.5 pixel (with
  ``aligned=False`` RoI sides are at least one pixel). Only ``pool_mode='avg'`` exists.
* ``roi_pool`` follows mmcv's CUDA kernel (mmcv has no CPU one): float RoI corners
  ``x1 * scale`` and ``(x2 + 1) * scale``, bin ``p`` spans ``[floor(x1 + p * bin), ceil(x1 +
  (p + 1) * bin))`` clipped to the map, an empty bin or RoI gives 0. It loops over RoIs in Python.
"""
from __future__ import annotations

from typing import Union

import torch
import torchvision
from torch import nn
from torch.nn.modules.utils import _pair

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
        raise NotImplementedError(
            "mmcv.ops.roi_align: pool_mode='max' needs mmcv's compiled extension (mmcv._ext), "
            "which is not installed (vmamba2d's mmcv-lite compatibility layer is active); use "
            "pool_mode='avg' or install a full mmcv build.")
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


def _bin_edges(start: torch.Tensor, end: torch.Tensor, bins: int, limit: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, bins) integer [low, high) pixel ranges of each RoI bin, clipped to [0, limit]."""
    size = (end - start) / bins
    steps = torch.arange(bins + 1, dtype=start.dtype, device=start.device)
    low = torch.floor(steps[:-1] * size[:, None] + start[:, None])
    high = torch.ceil(steps[1:] * size[:, None] + start[:, None])
    return low.clamp(0, limit).long(), high.clamp(0, limit).long()


def roi_pool(input: torch.Tensor, rois: torch.Tensor, output_size: OutputSize,
             spatial_scale: float = 1.0) -> torch.Tensor:
    """Max over the feature pixels of each RoI bin (mmcv.ops.roi_pool); differentiable.

    Args:
        input: (N, C, H, W) feature map.
        rois: (K, 5) rows [batch_index, x1, y1, x2, y2] in image coordinates (x2, y2 inclusive).
        output_size: (out_h, out_w), or an int for both.
        spatial_scale: factor from image to feature-map coordinates (1 / stride).

    Returns:
        (K, C, out_h, out_w) pooled features; 0 for empty bins and RoIs.
    """
    _check_rois("roi_pool", input, rois)
    out_h, out_w = _pair(output_size)
    channels, height, width = input.shape[1:]
    boxes = rois.detach().to(input.dtype)
    x1, y1 = boxes[:, 1] * spatial_scale, boxes[:, 2] * spatial_scale
    x2, y2 = (boxes[:, 3] + 1) * spatial_scale, (boxes[:, 4] + 1) * spatial_scale
    valid = ((x2 - x1 > 0) & (y2 - y1 > 0)).tolist()
    col_low, col_high = (edge.tolist() for edge in _bin_edges(x1, x2, out_w, width))
    row_low, row_high = (edge.tolist() for edge in _bin_edges(y1, y2, out_h, height))
    empty = input.new_full((channels,), float("-inf"))

    pooled = []
    for k, batch_index in enumerate(boxes[:, 0].long().tolist()):
        if not valid[k]:
            pooled.append(input.new_zeros(channels, out_h, out_w))
            continue
        feature = input[batch_index]
        top, bottom = min(row_low[k]), max(row_high[k])
        rows = feature[:, top:bottom]
        columns = torch.stack([rows[:, :, lo:hi].amax(dim=2) if hi > lo
                               else empty[:, None].expand(-1, bottom - top)
                               for lo, hi in zip(col_low[k], col_high[k])], dim=2)
        bins = torch.stack([columns[:, lo - top:hi - top].amax(dim=1) if hi > lo
                            else empty[:, None].expand(-1, out_w)
                            for lo, hi in zip(row_low[k], row_high[k])], dim=1)
        pooled.append(bins.masked_fill(bins == float("-inf"), 0.0))
    if not pooled:
        return input.new_zeros(0, channels, out_h, out_w)
    return torch.stack(pooled)


class RoIPool(nn.Module):
    """Module form of :func:`roi_pool` (mmcv.ops.RoIPool); ``forward(input, rois)``."""

    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0):
        super().__init__()
        self.output_size = _pair(output_size)
        self.spatial_scale = float(spatial_scale)

    def forward(self, input: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) features, (K, 5) rois -> (K, C, out_h, out_w)."""
        return roi_pool(input, rois, self.output_size, self.spatial_scale)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}, spatial_scale={self.spatial_scale}"
