"""Non-maximum suppression with mmcv's interface: ``nms`` and ``batched_nms`` (``mmcv.ops.nms``);
``nms`` runs ``torchvision.ops.nms``.

Part of vmamba2d's stand-in for ``mmcv.ops`` (see :mod:`vmamba2d.openmmlab.mmcv_standin.install`). The
semantics follow mmcv 2.1.0: greedy NMS in descending score order, a box is suppressed when its
IoU with a kept box is strictly greater than ``iou_threshold``, box sides are ``x2 - x1 + offset``.
Where mmcv leaves the order of equal scores to an unstable sort, these functions keep equal-score
boxes in input order, so results are deterministic.
"""
from __future__ import annotations

from typing import Callable, Union

import numpy as np
import torch
import torchvision

from .unavailable import unavailable_op

ArrayLike = Union[torch.Tensor, np.ndarray]


def _check_boxes(op: str, boxes: torch.Tensor, scores: torch.Tensor) -> None:
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(f"{op}: boxes must be (N, 4) [x1, y1, x2, y2], got shape "
                         f"{tuple(boxes.shape)}")
    if scores.shape != boxes.shape[:1]:
        raise ValueError(f"{op}: scores must be ({boxes.shape[0]},) to match boxes, got shape "
                         f"{tuple(scores.shape)}")


def _descending_order(scores: torch.Tensor) -> torch.Tensor:
    """Indices sorting ``scores`` from high to low, equal scores in input order."""
    return torch.sort(scores, descending=True, stable=True).indices


def _greedy_nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float,
                offset: int) -> torch.Tensor:
    """Indices (into ``boxes``) kept by greedy NMS, in descending score order (ties: input order).

    torchvision's ``nms`` is given the rank of each box instead of its score, so that its sort
    cannot reorder ties; ``offset`` is folded into the boxes (x2 + offset, y2 + offset give the
    same areas and intersections as mmcv's ``x2 - x1 + offset``).
    """
    order = _descending_order(scores)
    boxes = boxes.detach()
    work_dtype = boxes.dtype if boxes.dtype in (torch.float32, torch.float64) else torch.float32
    ranked = boxes[order].to(work_dtype)
    if offset:
        ranked = ranked + ranked.new_tensor([0.0, 0.0, offset, offset])
    ranks = torch.arange(len(order), 0, -1, dtype=work_dtype, device=boxes.device)
    return order[torchvision.ops.nms(ranked, ranks, float(iou_threshold))]


def nms(boxes: ArrayLike, scores: ArrayLike, iou_threshold: float, offset: int = 0,
        score_threshold: float = 0, max_num: int = -1) -> tuple[ArrayLike, ArrayLike]:
    """Greedy non-maximum suppression (mmcv.ops.nms).

    Args:
        boxes: (N, 4) boxes [x1, y1, x2, y2], a tensor or a numpy array.
        scores: (N,) scores, same kind as ``boxes``.
        iou_threshold: a box is dropped when its IoU with a kept box is greater than this.
        offset: 0 or 1; box width is ``x2 - x1 + offset`` (1 for legacy pixel-inclusive boxes).
        score_threshold: when > 0, boxes with ``score <= score_threshold`` are dropped first.
        max_num: keep at most this many boxes (the highest scored); <= 0 keeps all.

    Returns:
        ``(dets, inds)``: (K, 5) kept boxes with their score as last column, and (K,) int64
        indices into ``boxes``, in descending score order; numpy arrays for numpy input.
    """
    is_numpy = isinstance(boxes, np.ndarray)
    if is_numpy:
        boxes = torch.from_numpy(boxes)
    if isinstance(scores, np.ndarray):
        scores = torch.from_numpy(scores)
    if not isinstance(boxes, torch.Tensor) or not isinstance(scores, torch.Tensor):
        raise TypeError("nms: boxes and scores must be torch tensors or numpy arrays, got "
                        f"{type(boxes).__name__} and {type(scores).__name__}")
    _check_boxes("nms", boxes, scores)
    if offset not in (0, 1):
        raise ValueError(f"nms: offset must be 0 or 1, got {offset!r}")

    candidates = torch.arange(boxes.shape[0], device=boxes.device)
    if score_threshold > 0:
        candidates = torch.nonzero(scores > score_threshold).squeeze(1)
    inds = candidates[_greedy_nms(boxes[candidates], scores[candidates], iou_threshold, offset)]
    if max_num > 0:
        inds = inds[:max_num]
    dets = torch.cat([boxes[inds], scores[inds].reshape(-1, 1).to(boxes.dtype)], dim=1)
    if is_numpy:
        return dets.cpu().numpy(), inds.cpu().numpy()
    return dets, inds


_NMS_TYPES: dict[str, Callable] = {"nms": nms, "soft_nms": unavailable_op("soft_nms")}


def _resolve_nms_type(nms_type) -> Callable:
    if callable(nms_type):
        return nms_type
    if nms_type not in _NMS_TYPES:
        raise ValueError(f"batched_nms: nms_cfg['type'] must be one of {sorted(_NMS_TYPES)} or a "
                         f"callable, got {nms_type!r}")
    return _NMS_TYPES[nms_type]


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor,
                nms_cfg: dict | None, class_agnostic: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """NMS applied independently within each group of ``idxs`` (mmcv.ops.batched_nms).

    Args:
        boxes: (N, 4) boxes [x1, y1, x2, y2].
        scores: (N,) scores.
        idxs: (N,) group (class / level) of each box; boxes of different groups never suppress
            each other unless ``class_agnostic``.
        nms_cfg: None to skip NMS (only sort by score), else a dict with ``iou_threshold`` and
            optionally ``type`` ('nms' or a callable returning ``(dets, inds)``; 'soft_nms'
            raises the "not available without full mmcv" error),
            ``class_agnostic``, ``split_thr`` (default 10000: from that many boxes on, NMS runs
            group by group, and ``max_num`` is applied after merging the groups), ``max_num``,
            ``offset``, ``score_threshold``.
        class_agnostic: default for ``nms_cfg['class_agnostic']``: one group for all boxes.

    Returns:
        ``(dets, keep)``: (K, 5) kept boxes with their score as last column, and (K,) int64
        indices into ``boxes``, in descending score order (equal scores: input order).

    Unlike mmcv 2.1.0, which runs NMS per group whenever N >= ``split_thr`` even if
    ``class_agnostic`` is set, class-agnostic NMS here always treats all boxes as one group. Group
    separation offsets boxes by ``idx * (span + 1)`` with ``span`` the extent of all coordinates,
    so (unlike mmcv's ``max + 1``) it also holds for negative coordinates.
    """
    _check_boxes("batched_nms", boxes, scores)
    if idxs.shape != scores.shape:
        raise ValueError(f"batched_nms: idxs must be ({boxes.shape[0]},) to match boxes, got shape "
                         f"{tuple(idxs.shape)}")
    if nms_cfg is None:
        order = _descending_order(scores)
        return torch.cat([boxes[order], scores[order, None].to(boxes.dtype)], dim=1), order

    options = dict(nms_cfg)
    class_agnostic = options.pop("class_agnostic", class_agnostic)
    nms_op = _resolve_nms_type(options.pop("type", "nms"))
    split_thr = options.pop("split_thr", 10000)
    if boxes.shape[0] == 0:
        return boxes.new_zeros((0, 5)), torch.zeros(0, dtype=torch.long, device=boxes.device)

    if class_agnostic:
        boxes_for_nms = boxes
    else:
        low, high = boxes.min(), boxes.max()
        boxes_for_nms = boxes - low + (idxs.to(boxes.dtype) * (high - low + 1))[:, None]

    if class_agnostic or boxes.shape[0] < split_thr:
        dets, keep = nms_op(boxes_for_nms, scores, **options)
        return torch.cat([boxes[keep], dets[:, -1:]], dim=1), keep

    max_num = options.pop("max_num", -1)
    kept = torch.zeros_like(scores, dtype=torch.bool)
    scores_after_nms = torch.zeros_like(scores)
    for group in torch.unique(idxs):
        members = torch.nonzero(idxs == group).squeeze(1)
        dets, keep = nms_op(boxes_for_nms[members], scores[members], **options)
        kept[members[keep]] = True
        scores_after_nms[members[keep]] = dets[:, -1].to(scores.dtype)
    keep = torch.nonzero(kept).squeeze(1)
    keep = keep[_descending_order(scores_after_nms[keep])]
    if max_num > 0:
        keep = keep[:max_num]
    return torch.cat([boxes[keep], scores_after_nms[keep, None].to(boxes.dtype)], dim=1), keep
