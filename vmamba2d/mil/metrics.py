"""Slide-level metrics: classification (accuracy, macro F1, macro one-vs-rest AUC) and the
survival concordance index (docs/mil.md, metrics).

The classification metrics follow the official evaluation: the AUC is scikit-learn's
``roc_auc_score`` on one-hot targets, i.e. the macro average of per-class one-vs-rest AUCs (for two
classes this equals the ordinary AUC). A class that has no positive or no negative slide in the
split has no AUC; it is left out of the average and counted in ``auc_classes``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from vmamba2d.extras import MissingExtraError, require_extra

require_extra("the MIL metrics", ("sklearn",), "mil", "scikit-learn")

from sklearn.metrics import accuracy_score, f1_score, roc_auc_score  # noqa: E402


def _as_labels(labels: Sequence[int] | np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(labels)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of class indices, got shape "
                         f"{array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    return array


def classification_metrics(labels: Sequence[int] | np.ndarray,
                           probs: np.ndarray) -> dict[str, float]:
    """Accuracy, macro F1 and macro one-vs-rest AUC of slide predictions.

    Args:
        labels: (n,) true class indices in [0, C).
        probs: (n, C) class probabilities (softmax outputs); the prediction is the argmax.

    Returns:
        ``acc``, ``f1`` (macro over the classes present in labels or predictions, as
        scikit-learn's default), ``auc`` (mean of the per-class one-vs-rest AUCs that exist;
        NaN when none does), ``auc_classes`` (how many classes entered the AUC) and ``n``.
    """
    labels = _as_labels(labels, "labels")
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[0] != labels.shape[0]:
        raise ValueError(f"probs must be (n={labels.shape[0]}, C), got shape {probs.shape}")
    num_classes = probs.shape[1]
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"labels must lie in [0, {num_classes}), got range "
                         f"[{labels.min()}, {labels.max()}]")
    predictions = probs.argmax(axis=1)
    per_class_auc = []
    for k in range(num_classes):
        positives = labels == k
        if positives.all() or not positives.any():
            continue
        per_class_auc.append(roc_auc_score(positives, probs[:, k]))
    return {
        "acc": float(accuracy_score(labels, predictions)),
        "f1": float(f1_score(labels, predictions, average="macro", zero_division=0)),
        "auc": float(np.mean(per_class_auc)) if per_class_auc else math.nan,
        "auc_classes": len(per_class_auc),
        "n": int(labels.shape[0]),
    }


def concordance_index(event: Sequence[bool] | np.ndarray, time: Sequence[float] | np.ndarray,
                      risk: Sequence[float] | np.ndarray, tied_tol: float = 1e-8) -> float:
    """Harrell's concordance index (scikit-survival's ``concordance_index_censored``).

    A pair (i, j) is comparable when patient i had the event and ``time[i] < time[j]`` (or the
    times are equal and j is censored); it is concordant when ``risk[i] > risk[j]``; risks within
    ``tied_tol`` count one half.

    Args:
        event: (n,) True where the event (death) was observed, False where censored.
        time: (n,) survival or censoring time.
        risk: (n,) predicted risk (higher = earlier event), e.g. ``-sum(S)``.

    Returns:
        The C-index in [0, 1]; NaN when no pair is comparable.
    """
    try:
        from sksurv.exceptions import NoComparablePairException
        from sksurv.metrics import concordance_index_censored
    except ImportError as error:  # pragma: no cover - depends on the installed extras
        raise MissingExtraError("the survival C-index", ("sksurv",), "mil", "scikit-survival") from error
    event = np.asarray(event, dtype=bool)
    time = np.asarray(time, dtype=np.float64)
    risk = np.asarray(risk, dtype=np.float64)
    if not (event.ndim == time.ndim == risk.ndim == 1) or not (
            event.shape == time.shape == risk.shape):
        raise ValueError(f"event, time and risk must be 1-D of one length, got shapes "
                         f"{event.shape}, {time.shape}, {risk.shape}")
    if not np.isfinite(risk).all():
        raise ValueError("risk holds NaN or infinite values")
    if not event.any():
        return math.nan  # no patient with an observed event: no comparable pair
    try:
        return float(concordance_index_censored(event, time, risk, tied_tol=tied_tol)[0])
    except NoComparablePairException:
        return math.nan
