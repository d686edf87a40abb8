"""MIL metrics and survival pieces against hand-computed values (docs/mil.md: metrics, survival)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vmamba2d.mil.metrics import classification_metrics, concordance_index
from vmamba2d.mil.survival import (assign_survival_bins, survival_bin_edges, survival_nll_loss,
                                   survival_risk)

LOG2 = math.log(2.0)


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


# --- classification ------------------------------------------------------------------------

def test_classification_metrics_on_a_hand_checked_case():
    labels = np.array([0, 1, 2, 2])
    probs = np.array([[0.50, 0.05, 0.45],
                      [0.20, 0.50, 0.30],
                      [0.10, 0.20, 0.70],
                      [0.50, 0.10, 0.40]])
    got = classification_metrics(labels, probs)
    # predictions 0, 1, 2, 0: 3 of 4 right
    assert got["acc"] == pytest.approx(0.75)
    # per-class F1: class 0 P=1/2 R=1 -> 2/3; class 1 -> 1; class 2 P=1 R=1/2 -> 2/3
    assert got["f1"] == pytest.approx(7 / 9)
    # one-vs-rest AUCs: class 0: 0.5 beats 0.2, 0.1, ties 0.5 -> 5/6; class 1: 1;
    # class 2: {0.7, 0.4} vs {0.45, 0.3}: 3 of 4 pairs -> 3/4; macro = 31/36
    assert got["auc"] == pytest.approx(31 / 36)
    assert got["auc_classes"] == 3 and got["n"] == 4


def test_binary_auc_is_the_ordinary_auc():
    labels = np.array([0, 0, 1, 1, 1])
    p1 = np.array([0.1, 0.6, 0.4, 0.8, 0.9])
    got = classification_metrics(labels, np.stack([1 - p1, p1], axis=1))
    # positives {0.4, 0.8, 0.9} vs negatives {0.1, 0.6}: 5 of 6 pairs ordered
    assert got["auc"] == pytest.approx(5 / 6)
    # predictions 0, 1, 0, 1, 1: class 0 P 1/2 R 1/2 -> 1/2; class 1 P 2/3 R 2/3 -> 2/3
    assert got["f1"] == pytest.approx((1 / 2 + 2 / 3) / 2)


def test_class_absent_from_labels_is_left_out_of_the_auc():
    labels = np.array([0, 0, 1, 1])
    probs = np.array([[0.7, 0.2, 0.1], [0.3, 0.6, 0.1], [0.4, 0.5, 0.1], [0.1, 0.8, 0.1]])
    got = classification_metrics(labels, probs)
    assert got["auc_classes"] == 2  # class 2 has no positive slide
    # class 0: {0.7, 0.3} vs {0.4, 0.1} -> 3/4; class 1: {0.5, 0.8} vs {0.2, 0.6} -> 3/4
    assert got["auc"] == pytest.approx((0.75 + 0.75) / 2)


def test_classification_metrics_reject_bad_input():
    with pytest.raises(ValueError, match="probs must be"):
        classification_metrics([0, 1], np.zeros((3, 2)))
    with pytest.raises(ValueError, match="labels must lie"):
        classification_metrics([0, 2], np.full((2, 2), 0.5))
    with pytest.raises(ValueError, match="integers"):
        classification_metrics(np.array([0.0, 1.0]), np.full((2, 2), 0.5))


# --- C-index ---------------------------------------------------------------------------------

def test_c_index_three_patients():
    # comparable pairs (event first): (1,2) concordant, (1,3) concordant, (2,3) discordant
    assert concordance_index([True, True, False], [1.0, 2.0, 3.0], [0.9, 0.5, 0.7]) == \
        pytest.approx(2 / 3)


def test_c_index_tied_risks_count_one_half():
    # (2,3) now has equal risks: 1 + 1 + 1/2 over 3 pairs
    assert concordance_index([True, True, False], [1.0, 2.0, 3.0], [0.9, 0.7, 0.7]) == \
        pytest.approx(2.5 / 3)


def test_c_index_tied_times():
    # two events at t=2 are not comparable with each other; both precede the censored t=5
    assert concordance_index([True, True, False], [2.0, 2.0, 5.0], [0.3, 0.8, 0.1]) == 1.0
    # an event and a censoring at the same time are comparable (the event came first):
    # (1,2) concordant, (1,3) discordant
    assert concordance_index([True, False, True], [2.0, 2.0, 3.0], [0.9, 0.5, 0.95]) == 0.5


def test_c_index_without_events_is_nan_and_bad_input_is_named():
    assert math.isnan(concordance_index([False, False], [1.0, 2.0], [0.1, 0.2]))
    with pytest.raises(ValueError, match="one length"):
        concordance_index([True], [1.0, 2.0], [0.1, 0.2])
    with pytest.raises(ValueError, match="NaN"):
        concordance_index([True, False], [1.0, 2.0], [float("nan"), 0.2])


# --- survival loss ---------------------------------------------------------------------------

def test_nll_loss_three_patients_uniform_hazards():
    logits = torch.zeros(3, 3)  # every hazard 0.5: S = 0.5, 0.25, 0.125
    bins = torch.tensor([1, 2, 0])
    censorship = torch.tensor([0, 1, 0])
    # event in bin 1: -log S_0 - log h_1 = 2 log 2; censored in bin 2: -log S_2 = 3 log 2;
    # event in bin 0: -log S_{-1} - log h_0 = log 2
    assert survival_nll_loss(logits, bins, censorship).item() == pytest.approx(2 * LOG2)
    # alpha = 0.5 adds half the uncensored terms (2 log 2, 0, log 2)
    assert survival_nll_loss(logits, bins, censorship, alpha=0.5).item() == \
        pytest.approx((0.5 * 6 * LOG2 + 0.5 * 3 * LOG2) / 3)


def test_nll_loss_non_uniform_hazards():
    logits = torch.tensor([[logit(0.2), logit(0.5), logit(0.75)]] * 2, dtype=torch.float64)
    # S = 0.8, 0.4, 0.1
    event = survival_nll_loss(logits[:1], torch.tensor([2]), torch.tensor([0]))
    censored = survival_nll_loss(logits[1:], torch.tensor([1]), torch.tensor([1]))
    assert event.item() == pytest.approx(-math.log(0.4) - math.log(0.75))
    assert censored.item() == pytest.approx(-math.log(0.4))


def test_nll_loss_clamps_at_1e_minus_7():
    logits = torch.tensor([[-100.0, 0.0]])  # h_0 = 3.7e-44 -> clamped
    loss = survival_nll_loss(logits, torch.tensor([0]), torch.tensor([0]))
    assert loss.item() == pytest.approx(-math.log(1e-7), rel=1e-6)
    logits.requires_grad_(True)
    survival_nll_loss(logits * 1.0, torch.tensor([1]), torch.tensor([1])).backward()
    assert torch.isfinite(logits.grad).all()


def test_nll_loss_rejects_bad_targets():
    with pytest.raises(ValueError, match=r"bins must lie in \[0, 2\)"):
        survival_nll_loss(torch.zeros(1, 2), torch.tensor([2]), torch.tensor([0]))
    with pytest.raises(ValueError, match="bins and censorship"):
        survival_nll_loss(torch.zeros(2, 2), torch.tensor([0]), torch.tensor([0, 1]))


def test_risk_is_minus_the_summed_survival():
    logits = torch.tensor([[logit(0.2), logit(0.5), logit(0.75)]])
    assert survival_risk(logits).item() == pytest.approx(-(0.8 + 0.4 + 0.1))


# --- time bins ---------------------------------------------------------------------------------

def test_bins_are_training_quartiles_with_outer_edges_from_all_training_patients():
    months = [1.0, 2.0, 3.0, 4.0, 5.0, 0.5, 10.0]
    censorship = [0, 0, 0, 0, 0, 1, 1]  # quartiles of the events 1..5 are 1, 2, 3, 4, 5
    edges = survival_bin_edges(months, censorship, n_bins=4)
    np.testing.assert_allclose(edges, [0.5 - 1e-6, 2.0, 3.0, 4.0, 10.0 + 1e-6])
    # left-closed bins; times outside the training range go to the first / last bin
    got = assign_survival_bins([0.1, 1.99, 2.0, 3.5, 4.0, 100.0], edges)
    assert got.tolist() == [0, 0, 1, 2, 3, 3]


def test_bins_need_events_and_distinct_edges():
    with pytest.raises(ValueError, match="no uncensored"):
        survival_bin_edges([1.0, 2.0], [1, 1])
    with pytest.raises(ValueError, match="not strictly increasing"):
        survival_bin_edges([3.0, 3.0, 3.0], [0, 0, 0])
    with pytest.raises(ValueError, match="censorship must be 0"):
        survival_bin_edges([1.0, 2.0], [0, 2])
