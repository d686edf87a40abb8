"""Point sampling with mmcv's interface (``mmcv.ops.point_sample`` and its coordinate helper).

Part of vmamba2d's stand-in for ``mmcv.ops`` (see :mod:`vmamba2d.openmmlab.mmcv_compat`); used by
mmsegmentation's point heads and mmdetection's PointRend / Mask2Former.
"""
from __future__ import annotations

from typing import Union

import torch
import torch.nn.functional as F


def point_sample(input: torch.Tensor, points: torch.Tensor, align_corners: bool = False,
                 **kwargs) -> torch.Tensor:
    """Bilinearly sample ``input`` at normalised point coordinates (mmcv.ops.point_sample).

    Args:
        input: (N, C, H, W) feature map.
        points: (N, P, 2) or (N, Hg, Wg, 2) coordinates (x, y) in [0, 1].
        align_corners: as in ``torch.nn.functional.grid_sample``.
        **kwargs: passed on to ``grid_sample`` (e.g. ``mode``, ``padding_mode``).

    Returns:
        (N, C, P) for 3-D ``points``, else (N, C, Hg, Wg).
    """
    if input.dim() != 4:
        raise ValueError(f"point_sample: input must be (N, C, H, W), got shape {tuple(input.shape)}")
    if points.dim() not in (3, 4) or points.shape[-1] != 2:
        raise ValueError("point_sample: points must be (N, P, 2) or (N, Hg, Wg, 2), got shape "
                         f"{tuple(points.shape)}")
    grid = points.unsqueeze(2) if points.dim() == 3 else points
    output = F.grid_sample(input, 2.0 * grid - 1.0, align_corners=align_corners, **kwargs)
    return output.squeeze(3) if points.dim() == 3 else output


def rel_roi_point_to_rel_img_point(rois: torch.Tensor, rel_roi_points: torch.Tensor,
                                   img: Union[tuple[int, int], torch.Tensor],
                                   spatial_scale: float = 1.0) -> torch.Tensor:
    """Map points given relative to their RoI to coordinates relative to the image / feature map.

    A point (u, v) of RoI [x1, y1, x2, y2] lies at ``(x1 + u (x2 - x1), y1 + v (y2 - y1))`` in the
    image; dividing by the map size (w, h) and multiplying by ``spatial_scale`` gives the [0, 1]
    coordinates that :func:`point_sample` takes (mmcv.ops.rel_roi_point_to_rel_img_point).

    Args:
        rois: (N, 4) [x1, y1, x2, y2] or (N, 5) [batch_index, x1, y1, x2, y2].
        rel_roi_points: (N, P, 2) points (u, v) relative to each RoI, in [0, 1].
        img: (height, width), or an (B, C, H, W) feature map whose size is used.
        spatial_scale: factor from RoI coordinates to ``img`` coordinates.

    Returns:
        (N, P, 2) points (x, y) relative to ``img``; no gradient flows to ``rois``.
    """
    if rois.dim() != 2 or rois.shape[1] not in (4, 5):
        raise ValueError("rel_roi_point_to_rel_img_point: rois must be (N, 4) or (N, 5), got "
                         f"shape {tuple(rois.shape)}")
    if rel_roi_points.dim() != 3 or rel_roi_points.shape[0] != rois.shape[0] \
            or rel_roi_points.shape[2] != 2:
        raise ValueError(f"rel_roi_point_to_rel_img_point: rel_roi_points must be "
                         f"({rois.shape[0]}, P, 2), got shape {tuple(rel_roi_points.shape)}")
    if isinstance(img, torch.Tensor):
        if img.dim() != 4:
            raise ValueError("rel_roi_point_to_rel_img_point: img must be (height, width) or an "
                             f"(N, C, H, W) tensor, got shape {tuple(img.shape)}")
        height, width = img.shape[2:]
    elif isinstance(img, tuple) and len(img) == 2:
        height, width = img
    else:
        raise ValueError("rel_roi_point_to_rel_img_point: img must be (height, width) or an "
                         f"(N, C, H, W) tensor, got {img!r}")
    with torch.no_grad():
        boxes = rois[:, -4:]
        top_left, size = boxes[:, None, :2], (boxes[:, None, 2:] - boxes[:, None, :2])
        absolute = top_left + rel_roi_points * size
        map_size = torch.tensor([width, height], dtype=torch.float32, device=rois.device)
        return absolute / map_size * spatial_scale
