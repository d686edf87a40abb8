"""Non-maximum suppression with mmcv's interface: ``nms``, ``batched_nms``, ``nms_match``,
``soft_nms`` (``mmcv.ops.nms``); ``nms`` runs ``torchvision.ops.nms``.

Part of vmamba2d's stand-in for ``mmcv.ops`` (see :mod:`vmamba2d.openmmlab.mmcv_compat`). The
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


def soft_nms(boxes: ArrayLike, scores: ArrayLike, iou_threshold: float = 0.3, sigma: float = 0.5,
             min_score: float = 1e-3, method: str = "linear", offset: int = 0
             ) -> tuple[ArrayLike, ArrayLike]:
    """Soft-NMS: decay the scores of overlapping boxes instead of dropping them (mmcv.ops.soft_nms).

    Repeatedly keeps the highest-scored remaining box (ties: input order) and multiplies the score
    of every other remaining box by ``w(IoU)``: 'linear' ``1 - IoU`` and 'naive' ``0`` where
    ``IoU >= iou_threshold`` (else 1), 'gaussian' ``exp(-IoU^2 / sigma)``; boxes whose score falls
    below ``min_score`` are dropped. Runs on the CPU (as mmcv's), one Python step per kept box.

    Args:
        boxes: (N, 4) boxes [x1, y1, x2, y2], a tensor or a numpy array.
        scores: (N,) scores, same kind as ``boxes``.
        iou_threshold: IoU from which 'linear' / 'naive' decay applies.
        sigma: width of the 'gaussian' decay.
        min_score: boxes whose decayed score is below this are dropped.
        method: 'linear', 'gaussian' or 'naive'.
        offset: 0 or 1; box width is ``x2 - x1 + offset``.

    Returns:
        ``(dets, inds)``: (K, 5) kept boxes with their decayed score as last column, and (K,)
        int64 indices into ``boxes``, in the order they were kept; numpy for numpy input.
    """
    is_numpy = isinstance(boxes, np.ndarray)
    boxes_t = torch.from_numpy(boxes) if is_numpy else boxes
    scores_t = torch.from_numpy(scores) if isinstance(scores, np.ndarray) else scores
    _check_boxes("soft_nms", boxes_t, scores_t)
    if method not in ("linear", "gaussian", "naive"):
        raise ValueError(f"soft_nms: method must be 'linear', 'gaussian' or 'naive', got "
                         f"{method!r}")
    if offset not in (0, 1):
        raise ValueError(f"soft_nms: offset must be 0 or 1, got {offset!r}")

    table = boxes_t.detach().cpu().double()
    decayed = scores_t.detach().cpu().double().clone()
    areas = (table[:, 2] - table[:, 0] + offset) * (table[:, 3] - table[:, 1] + offset)
    remaining = torch.arange(len(decayed))
    kept, kept_scores = [], []
    while len(remaining):
        best = remaining[torch.argmax(decayed[remaining])]  # argmax: first of equal maxima
        kept.append(int(best))
        kept_scores.append(float(decayed[best]))
        remaining = remaining[remaining != best]
        top_left = torch.maximum(table[remaining, :2], table[best, :2])
        bottom_right = torch.minimum(table[remaining, 2:], table[best, 2:])
        inter = (bottom_right - top_left + offset).clamp(min=0).prod(dim=1)
        iou = inter / (areas[best] + areas[remaining] - inter)
        if method == "gaussian":
            weight = torch.exp(-(iou * iou) / sigma)
        else:
            overlapping = iou >= iou_threshold
            decay = 1 - iou if method == "linear" else torch.zeros_like(iou)
            weight = torch.where(overlapping, decay, torch.ones_like(iou))
        decayed[remaining] *= weight
        remaining = remaining[decayed[remaining] >= min_score]

    inds = torch.tensor(kept, dtype=torch.long)
    dets = torch.cat([boxes_t.detach().cpu()[inds],
                      torch.tensor(kept_scores, dtype=boxes_t.dtype).reshape(-1, 1)], dim=1)
    if is_numpy:
        return dets.numpy(), inds.numpy()
    return dets.to(boxes_t.device), inds.to(boxes_t.device)


_NMS_TYPES: dict[str, Callable] = {"nms": nms, "soft_nms": soft_nms}


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
            optionally ``type`` ('nms', 'soft_nms' or a callable returning ``(dets, inds)``),
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


def nms_match(dets: ArrayLike, iou_threshold: float) -> list[ArrayLike]:
    """Group boxes by greedy NMS: each kept box with the boxes it suppresses (mmcv.ops.nms_match).

    A box joins the group of the first (highest scored) kept box whose IoU with it is at least
    ``iou_threshold`` (mmcv uses ``>=`` here, and no offset).

    Args:
        dets: (N, 5) boxes [x1, y1, x2, y2, score], a tensor or a numpy array.
        iou_threshold: IoU at or above which a box is matched to a kept box.

    Returns:
        One int64 index array / tensor per kept box (same kind as ``dets``), in descending score
        order of the kept boxes; each starts with the kept box, then its matches by score.
    """
    is_numpy = isinstance(dets, np.ndarray)
    if dets.ndim != 2 or dets.shape[1] != 5:
        raise ValueError(f"nms_match: dets must be (N, 5) [x1, y1, x2, y2, score], got shape "
                         f"{tuple(dets.shape)}")
    table = torch.from_numpy(dets) if is_numpy else dets.detach().cpu()
    boxes, scores = table[:, :4], table[:, 4]
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    order = _descending_order(scores)
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    groups = []
    for rank, i in enumerate(order.tolist()):
        if suppressed[i]:
            continue
        later = order[rank + 1:]
        later = later[~suppressed[later]]
        top_left = torch.maximum(boxes[later, :2], boxes[i, :2])
        bottom_right = torch.minimum(boxes[later, 2:], boxes[i, 2:])
        inter = (bottom_right - top_left).clamp(min=0).prod(dim=1)
        matched = later[inter / (areas[i] + areas[later] - inter) >= iou_threshold]
        suppressed[matched] = True
        groups.append(torch.cat([order.new_tensor([i]), matched]))
    if is_numpy:
        return [group.numpy().astype(int) for group in groups]
    return [group.to(dets.device) for group in groups]
