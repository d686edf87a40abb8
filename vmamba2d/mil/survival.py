"""Discrete-time survival: time bins, the censored negative log-likelihood and the risk score
(docs/mil.md#survival, with the bin edges computed on training patients only: #evaluation-leakage).

Conventions: ``censorship`` c = 1 for a censored patient, 0 for an observed event; the model's
K logits give hazards h_k = sigmoid(logit_k), survival S_k = prod_{i<=k} (1 - h_i), and the risk
score is -sum_k S_k (higher = shorter predicted survival).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

EDGE_EPS = 1e-6  # widens the outer bin edges (official value)
LOSS_EPS = 1e-7  # clamp inside the logs (official value)


def survival_bin_edges(months: Sequence[float] | np.ndarray,
                       censorship: Sequence[int] | np.ndarray, n_bins: int = 4) -> np.ndarray:
    """Edges of ``n_bins`` time bins from the TRAINING patients only.

    Inner edges are the quantiles of the uncensored patients' survival times (as ``pd.qcut``:
    linear interpolation); the outer edges are the min - 1e-6 and max + 1e-6 over all training
    patients, censored included.

    Args:
        months: (n,) survival / follow-up time of each training patient.
        censorship: (n,) 1 = censored, 0 = event observed.
        n_bins: K >= 1.

    Returns:
        (K + 1,) increasing edges. Bins are left-closed: bin k holds e_k <= t < e_{k+1}.
    """
    months = np.asarray(months, dtype=np.float64)
    censorship = np.asarray(censorship)
    if months.ndim != 1 or months.shape != censorship.shape or months.size == 0:
        raise ValueError(f"months and censorship must be non-empty 1-D of one length, got shapes "
                         f"{months.shape} and {censorship.shape}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if not np.isin(censorship, (0, 1)).all():
        raise ValueError(f"censorship must be 0 (event) or 1 (censored), got values "
                         f"{sorted(set(np.unique(censorship).tolist()) - {0, 1})}")
    if not np.isfinite(months).all():
        raise ValueError("survival times hold NaN or infinite values")
    uncensored = months[censorship == 0]
    if uncensored.size == 0:
        raise ValueError("no uncensored training patient: the time bins cannot be computed")
    edges = np.quantile(uncensored, np.linspace(0.0, 1.0, n_bins + 1))
    edges[0] = months.min() - EDGE_EPS
    edges[-1] = months.max() + EDGE_EPS
    if np.any(np.diff(edges) <= 0):
        raise ValueError(f"survival time bins are not strictly increasing ({edges.tolist()}): "
                         f"too few distinct uncensored times for {n_bins} bins")
    return edges


def assign_survival_bins(months: Sequence[float] | np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index of each time under left-closed ``edges`` (K + 1,); times outside the training
    range fall into the first / last bin.

    Returns:
        (n,) int64 in [0, K).
    """
    months = np.asarray(months, dtype=np.float64)
    return np.searchsorted(np.asarray(edges)[1:-1], months, side="right").astype(np.int64)


def survival_nll_loss(logits: torch.Tensor, bins: torch.Tensor, censorship: torch.Tensor,
                      alpha: float = 0.0, eps: float = LOSS_EPS) -> torch.Tensor:
    """Discrete-time negative log-likelihood with censoring, averaged over the batch.

    With S_{-1} = 1: a censored patient (c = 1) contributes -log S_Y; an observed event (c = 0)
    contributes -log S_{Y-1} - log h_Y. ``alpha`` adds weight to the uncensored term:
    loss = (1 - alpha) * nll + alpha * uncensored_term (official default alpha = 0).

    Args:
        logits: (B, K) hazard logits.
        bins: (B,) int64 time-bin index Y in [0, K).
        censorship: (B,) 0/1 (any numeric dtype).
        alpha: weight in [0, 1].
        eps: clamp applied to S and h before the logs.

    Returns:
        Scalar loss (float32 or the logits' dtype promoted to float32).
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be (batch, K), got shape {tuple(logits.shape)}")
    batch, num_bins = logits.shape
    if bins.shape != (batch,) or censorship.shape != (batch,):
        raise ValueError(f"bins and censorship must be ({batch},), got {tuple(bins.shape)} and "
                         f"{tuple(censorship.shape)}")
    if bins.numel() and (int(bins.min()) < 0 or int(bins.max()) >= num_bins):
        raise ValueError(f"bins must lie in [0, {num_bins}), got [{int(bins.min())}, "
                         f"{int(bins.max())}]")
    hazards = torch.sigmoid(logits.float())
    survival = torch.cumprod(1.0 - hazards, dim=1)
    survival_padded = torch.cat([torch.ones_like(survival[:, :1]), survival], dim=1)  # S_{-1}=1
    index = bins.long().unsqueeze(1)
    c = censorship.to(hazards.dtype)
    s_before = survival_padded.gather(1, index).squeeze(1).clamp_min(eps)   # S_{Y-1}
    s_at = survival_padded.gather(1, index + 1).squeeze(1).clamp_min(eps)   # S_Y
    h_at = hazards.gather(1, index).squeeze(1).clamp_min(eps)               # h_Y
    uncensored_term = -(1.0 - c) * (torch.log(s_before) + torch.log(h_at))
    censored_term = -c * torch.log(s_at)
    nll = censored_term + uncensored_term
    return ((1.0 - alpha) * nll + alpha * uncensored_term).mean()


def survival_risk(logits: torch.Tensor) -> torch.Tensor:
    """Risk score -sum_k S_k of hazard logits (B, K) -> (B,)."""
    survival = torch.cumprod(1.0 - torch.sigmoid(logits.float()), dim=1)
    return -survival.sum(dim=1)
