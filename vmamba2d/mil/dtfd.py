"""DTFD-MIL (Zhang et al., CVPR 2022): double-tier feature distillation over pseudo-bags.

A slide's patches are split at random into M pseudo-bags that inherit the slide's label. Tier 1 is
a gated attention MIL model run on each pseudo-bag (its prediction trained against the slide's
label: the ``"pseudo_bag"`` loss term); from each pseudo-bag one or two feature vectors are
*distilled* and tier 2, a second gated attention MIL model, aggregates the M (or 2M) distilled
vectors into the slide's prediction (the ``"slide"`` term).

Distillation (``distill``):
    ``"afs"``      aggregated feature selection: the pseudo-bag's attention-pooled embedding
                   (the paper's best; the default of its code);
    ``"maxs"``     the instance with the highest derived probability of the ranked class;
    ``"maxmins"``  that instance and the one with the lowest probability.
Instance probabilities come from the paper's derivation for attention MIL: the pseudo-bag logit
of class c is ``sum_k a_k w_c . h_k + b_c``, so instance k contributes ``a_k w_c . h_k`` and its
probability is the softmax over classes of those contributions. The ranked class is the one the
pseudo-bag predicts (for two classes, max / min of either class's probability pick the same pair,
so ``"maxmins"`` equals ranking by the positive class).

Pseudo-bags: in training mode a fresh random split from the global torch generator on every
forward (the paper reshuffles each time a slide is seen); in eval mode a fixed split (a
permutation from a generator seeded with ``eval_seed``, taken over the patches in row-major grid
order), so evaluation is deterministic and does not depend on the file's row order. The split is
``torch.tensor_split`` of the permuted patches into min(M, n) near-equal parts.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .baselines import GatedAttentionPool
from .models import (BASELINE_INITS, TaskLoss, _MILModel, _require_choice, _require_positive, ordered_instances,
                     scatter_to_grid)

Tensor = torch.Tensor

DISTILLATIONS = ("afs", "maxs", "maxmins")


class DTFDMIL(_MILModel):
    """DTFD-MIL: shared reduction -> tier 1 (gated attention MIL per pseudo-bag) -> distillation ->
    tier 2 (gated attention MIL over the distilled vectors) -> head.

    Defaults = the DTFD-MIL code's (``numGroup`` 4, ``mDim`` 512, ``distill_type`` AFS, drop rate 0):
    Linear(in_dim, 512, no bias) -> ReLU; tier 1 gated attention 512 -> 128 -> 1 (tanh x sigmoid)
    and classifier 512 -> C; tier 2 the same with its own weights; PyTorch's default init
    (790,280 parameters at in_dim 1024, 3 classes).

    Outputs besides the common ones: ``pseudo_bag_logits`` (M, C) tier-1 logits;
    ``attention`` (H, W) = each patch's weight in the slide embedding (tier-2 weight of its
    pseudo-bag times its tier-1 weight for ``"afs"``, which sums to 1; the tier-2 weight of the
    selected patches for ``"maxs"`` / ``"maxmins"``); ``attention_scores`` the tier-1 scores.

    Loss terms: ``"slide"`` (tier 2) and ``"pseudo_bag"`` (mean over pseudo-bags of the task loss
    of their logits), 1 each: the code's two optimisers step on the sum of both tiers' gradients.

    Args: in_dim, num_classes, dim (512), attn_hidden (128), num_groups (M, 4), distill
    (``"afs"`` / ``"maxs"`` / ``"maxmins"``), eval_seed (0), init (``"torch"`` / ``"xavier"``), survival.
    """

    model_name = "dtfdmil"
    default_loss_weights = {"slide": 1.0, "pseudo_bag": 1.0}

    def __init__(self, *, in_dim: int, num_classes: int, dim: int = 512, attn_hidden: int = 128, num_groups: int = 4,
                 distill: str = "afs", eval_seed: int = 0, init: str = "torch", survival: bool = False) -> None:
        super().__init__(in_dim, num_classes, survival)
        _require_positive("dim", dim)
        _require_positive("attn_hidden", attn_hidden)
        self.num_groups = _require_positive("num_groups", num_groups)
        self.distill = _require_choice("distill", distill, DISTILLATIONS)
        if isinstance(eval_seed, bool) or not isinstance(eval_seed, int):
            raise ValueError(f"eval_seed must be an int, got {eval_seed!r}")
        self.eval_seed = eval_seed
        self.reduce = nn.Sequential(nn.Linear(in_dim, dim, bias=False), nn.ReLU())
        self.attention1 = GatedAttentionPool(dim, attn_hidden, 0.0)
        self.classifier1 = nn.Linear(dim, num_classes)
        self.attention2 = GatedAttentionPool(dim, attn_hidden, 0.0)
        self.classifier = nn.Linear(dim, num_classes)
        if _require_choice("init", init, BASELINE_INITS) == "xavier":
            self._init_xavier()
        self._config = dict(in_dim=in_dim, num_classes=num_classes, dim=dim, attn_hidden=attn_hidden,
                            num_groups=num_groups, distill=distill, eval_seed=eval_seed, init=init, survival=survival)

    def pseudo_bags(self, count: int, device: torch.device) -> list[Tensor]:
        """Split ``count`` patches into min(M, count) pseudo-bags: a list of index tensors (n_g,).

        Training mode draws the permutation from the global generator, eval mode from one seeded
        with ``eval_seed``.
        """
        generator = None if self.training else torch.Generator().manual_seed(self.eval_seed)
        order = torch.randperm(count, generator=generator).to(device)
        return list(torch.tensor_split(order, min(self.num_groups, count)))

    def instance_probabilities(self, tokens: Tensor, weights: Tensor) -> Tensor:
        """The paper's instance probabilities in a pseudo-bag: tokens (n_g, dim) and tier-1 attention
        weights (n_g,) -> softmax over classes of ``a_k * W1 h_k`` (n_g, C)."""
        return torch.softmax(weights.unsqueeze(1) * (tokens @ self.classifier1.weight.t()), dim=1)

    def tier2(self, distilled: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """distilled (m, dim) -> (logits (1, C), weights (m,), embedding (1, dim)); invariant to the
        order of the m rows."""
        embedding, weights, _ = self.attention2(distilled)
        return self.classifier(embedding), weights, embedding

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) grid (x, y) -> dict (vmamba2d.mil.models) with
        ``pseudo_bag_logits`` (M, C)."""
        features, index, grid = ordered_instances(features, coords, grid_size, self.in_dim, "raster")
        tokens = self.reduce(features)  # (n, dim)
        groups = self.pseudo_bags(tokens.shape[0], tokens.device)
        group_logits, distilled, owners = [], [], []
        scores = tokens.new_zeros(tokens.shape[0])
        tier1_weights = tokens.new_zeros(tokens.shape[0])
        for group in groups:
            members = tokens[group]
            embedding, weights, group_scores = self.attention1(members)
            logits = self.classifier1(embedding)  # (1, C)
            group_logits.append(logits)
            scores = scores.index_copy(0, group, group_scores)
            tier1_weights = tier1_weights.index_copy(0, group, weights)
            if self.distill == "afs":
                distilled.append(embedding)
                owners.append(group)
                continue
            ranked = self.instance_probabilities(members, weights)[:, int(logits.argmax())]
            picks = [int(ranked.argmax())] + ([int(ranked.argmin())] if self.distill == "maxmins" else [])
            distilled.append(members[picks])
            owners.extend(group[pick : pick + 1] for pick in picks)
        logits, bag_weights, embedding = self.tier2(torch.cat(distilled))
        if self.distill == "afs":
            patch_weights = tokens.new_zeros(tokens.shape[0])
            for group, weight in zip(owners, bag_weights):
                patch_weights = patch_weights.index_copy(0, group, weight * tier1_weights[group])
        else:  # a patch picked twice (a one-patch pseudo-bag under maxmins) gets both weights
            patch_weights = tokens.new_zeros(tokens.shape[0]).index_add(0, torch.cat(owners), bag_weights)
        return self.head_outputs(logits, attention=scatter_to_grid(patch_weights, index, grid),
                                 attention_scores=scatter_to_grid(scores, index, grid), embedding=embedding,
                                 pseudo_bag_logits=torch.cat(group_logits))

    def auxiliary_losses(self, output: dict[str, Tensor], label: int, task_loss: TaskLoss) -> dict[str, Tensor]:
        """``{"pseudo_bag": mean over pseudo-bags of the task loss of their tier-1 logits}`` (each
        pseudo-bag carries the slide's label)."""
        logits = output["pseudo_bag_logits"]
        return {"pseudo_bag": torch.stack([task_loss(logits[g : g + 1]) for g in range(logits.shape[0])]).mean()}
