"""The MIL model API every model of :mod:`vmamba2d.mil.models` shares: one slide's input checks,
grid cells, attention pooling, the classification / survival outputs and the base classes
(:class:`MILModel`; :class:`AttentionMIL` projection -> pooling -> head; :class:`TokenMIL` on the
tissue tokens only)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn as nn

Tensor = torch.Tensor

BASELINE_INITS = ("torch", "xavier")
ORDERS = ("raster", "file")
ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


def require_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else ValueError naming ``name`` and the choices."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def require_positive(name: str, value: int) -> int:
    """``value`` if it is a positive int (not a bool), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_slide_inputs(
    features: Tensor, coords: Tensor, in_dim: int, grid_size: Optional[tuple[int, int]]
) -> tuple[int, int]:
    """Validate one slide's inputs; return the grid ``(H, W)``.

    Expected: ``features`` (n, in_dim) floating point with n >= 1 and finite values; ``coords``
    (n, 2) integer (x = column, y = row), non-negative, distinct, on the features' device;
    ``grid_size`` None (H = max row + 1, W = max col + 1) or an (H, W) covering every coordinate.
    """
    if not isinstance(features, torch.Tensor) or not features.is_floating_point():
        raise TypeError(f"features must be a floating-point tensor (n, {in_dim}), got {type(features).__name__}"
                        + (f" of dtype {features.dtype}" if isinstance(features, torch.Tensor) else ""))
    if features.dim() != 2 or features.shape[1] != in_dim:
        raise ValueError(f"features must have shape (n, in_dim={in_dim}), got {tuple(features.shape)}")
    if features.shape[0] == 0:
        raise ValueError("features is empty (n = 0): a slide needs at least one patch")
    if not isinstance(coords, torch.Tensor) or coords.is_floating_point() or coords.is_complex() or coords.dtype == torch.bool:
        raise TypeError("coords must be an integer tensor (n, 2) of grid positions (x = column, y = row), got "
                        + (str(coords.dtype) if isinstance(coords, torch.Tensor) else type(coords).__name__))
    if coords.shape != (features.shape[0], 2):
        raise ValueError(f"coords must have shape (n, 2) = ({features.shape[0]}, 2) to match features, got {tuple(coords.shape)}")
    if coords.device != features.device:
        raise ValueError(f"coords is on {coords.device} but features is on {features.device}")
    if torch.compiler.is_exporting():
        return _exported_grid(coords, grid_size)
    if bool((coords < 0).any()):
        raise ValueError("coords must be non-negative grid positions (the data layer shifts them to the tissue bounding box)")
    needed = (int(coords[:, 1].max()) + 1, int(coords[:, 0].max()) + 1)
    if grid_size is None:
        return needed
    height, width = int(grid_size[0]), int(grid_size[1])
    if height < needed[0] or width < needed[1]:
        raise ValueError(f"grid_size={tuple(grid_size)} does not cover the coords: they need at least (H, W) = {needed}")
    return height, width


def _exported_grid(coords: Tensor, grid_size: Optional[tuple[int, int]]) -> tuple[int, int]:
    """The grid ``(H, W)`` while ``torch.export`` (ONNX export) traces a model.

    The value checks of :func:`check_slide_inputs` (non-negative, distinct coords inside
    ``grid_size``) depend on the data, and an exported graph has no assertions: the exported model
    takes its coords as valid, like those the data layer writes. Without ``grid_size`` the grid is
    read from the coords at run time (symbolic sizes).
    """
    if grid_size is not None:
        return int(grid_size[0]), int(grid_size[1])
    height = coords[:, 1].max().item() + 1
    width = coords[:, 0].max().item() + 1
    torch._check(height >= 1)  # lets the tracer reason about sizes built from H and W
    torch._check(width >= 1)
    return height, width


def cell_index(coords: Tensor, width: int) -> Tensor:
    """Row-major cell index ``row * width + col`` of each (x, y) grid position: (n, 2) -> (n,)."""
    return coords[:, 1].long() * width + coords[:, 0].long()


def _cumprod(x: Tensor) -> Tensor:
    """``torch.cumprod(x, dim=1)`` of (1, K); while ``torch.export`` traces, as K - 1 products in the
    same order (torch 2.14's ONNX exporter has no translation for cumprod)."""
    if not torch.compiler.is_exporting():
        return torch.cumprod(x, dim=1)
    columns = [x[:, :1]]
    for k in range(1, x.shape[1]):
        columns.append(columns[-1] * x[:, k : k + 1])
    return torch.cat(columns, dim=1)


def require_distinct(index: Tensor) -> None:
    """ValueError when two patches share a cell: ``index`` (n,) row-major cell indices (not checked while exporting)."""
    if torch.compiler.is_exporting():  # a value check: see _exported_grid
        return
    if index.numel() != torch.unique(index).numel():
        raise ValueError("coords contain duplicate grid positions: every patch needs its own cell")



class AttentionPool(nn.Module):
    """Attention pooling: score = w2 . tanh(W1 t); softmax over the kept tokens; sum of a * t."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(dim, hidden)
        self.score = nn.Linear(hidden, 1)

    def forward(self, tokens: Tensor, keep: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (L, dim), keep (L,) bool or None (all) -> (embedding (1, dim), weights (L,), scores (L,))."""
        scores = self.score(torch.tanh(self.hidden(tokens))).squeeze(-1)
        masked = scores if keep is None else scores.masked_fill(~keep, float("-inf"))
        weights = torch.softmax(masked, dim=0)
        return (weights.unsqueeze(0) @ tokens), weights, scores


def require_dropout(name: str, value: float) -> float:
    """``value`` if it is a dropout probability in [0, 1), else ValueError naming ``name``."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return value


def activation_layer(act: str) -> nn.Module:
    """A new activation module by name (a key of ``ACTIVATIONS``)."""
    return ACTIVATIONS[require_choice("act", act, tuple(ACTIVATIONS))]()


TaskLoss = Callable[[Tensor], Tensor]


class MILModel(nn.Module):
    """What every MIL model shares: sizes, the classification / survival outputs, the loss terms,
    the config and the Xavier init.

    Class attributes: ``has_attention`` (returns an (H, W) ``attention`` map),
    ``permutation_invariant`` (the output does not depend on the order or the grid positions of
    the patches: a bag model), ``default_loss_weights`` (loss term -> weight; ``"slide"`` = the
    task loss of ``logits``).
    """

    model_name = ""
    has_attention = True
    permutation_invariant = False
    default_loss_weights: dict[str, float] = {"slide": 1.0}

    def __init__(self, in_dim: int, num_classes: int, survival: bool) -> None:
        super().__init__()
        self.in_dim = require_positive("in_dim", in_dim)
        self.num_classes = require_positive("num_classes", num_classes)
        self.survival = survival
        self._config: dict[str, Any] = {}

    @property
    def config(self) -> dict[str, Any]:
        """Constructor keywords plus ``"name"``: ``build_model(**model.config)`` rebuilds the model."""
        return {"name": self.model_name, **self._config}

    @property
    def loss_weights(self) -> dict[str, float]:
        """Default weight of each loss term this model trains with (a copy)."""
        return dict(self.default_loss_weights)

    def auxiliary_losses(self, output: dict[str, Tensor], label: int, task_loss: TaskLoss) -> dict[str, Tensor]:
        """Loss terms besides ``"slide"`` for one slide of class / time bin ``label``.

        ``output`` is this model's forward output; ``task_loss`` maps (1, C) logits to the task's
        loss (cross-entropy or the survival NLL) for this slide. Returns term name -> scalar.
        """
        return {}

    def head_outputs(self, logits: Tensor, **extra: Tensor) -> dict[str, Tensor]:
        """``logits`` (1, C) -> dict with ``logits``, ``extra`` and ``probabilities`` (classification)
        or ``hazards`` / ``survival`` / ``risk`` (survival)."""
        out = {"logits": logits, **extra}
        if self.survival:
            hazards = torch.sigmoid(logits)
            surv = _cumprod(1 - hazards)
            out.update(hazards=hazards, survival=surv, risk=-surv.sum(dim=1))
        else:
            out["probabilities"] = torch.softmax(logits, dim=1)
        return out

    def _init_xavier(self) -> None:
        """Xavier-normal weights and zero biases for every Linear; LayerNorm (1, 0)
        (docs/mil.md#initialisation)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)


class AttentionMIL(MILModel):
    """Input projection (Linear -> activation -> dropout), attention pooling and a linear head."""

    def __init__(self, in_dim: int, num_classes: int, dim: int, dropout: float, attn_hidden: int,
                 survival: bool, act: str = "gelu", pool: Optional[nn.Module] = None) -> None:
        super().__init__(in_dim, num_classes, survival)
        require_positive("dim", dim)
        require_positive("attn_hidden", attn_hidden)
        self.proj = nn.Sequential(nn.Linear(in_dim, dim), activation_layer(act), nn.Dropout(require_dropout("dropout", dropout)))
        self.pool = AttentionPool(dim, attn_hidden) if pool is None else pool
        self.classifier = nn.Linear(dim, num_classes)

    def _outputs(self, embedding: Tensor, weights: Tensor, scores: Tensor, grid: tuple[int, int]) -> dict[str, Tensor]:
        return self.head_outputs(self.classifier(embedding), attention=weights.view(grid),
                                 attention_scores=scores.view(grid), embedding=embedding)



def scatter_to_grid(values: Tensor, index: Tensor, grid: tuple[int, int]) -> Tensor:
    """(n,) values at row-major cells ``index`` -> (H, W) map, 0 elsewhere."""
    flat = values.new_zeros(grid[0] * grid[1]).index_copy(0, index, values)
    return flat.view(grid)


def ordered_instances(features: Tensor, coords: Tensor, grid_size: Optional[tuple[int, int]], in_dim: int,
                      order: str) -> tuple[Tensor, Tensor, tuple[int, int]]:
    """Check one slide and put its patches in sequence order.

    features (n, in_dim), coords (n, 2) -> (features (n, in_dim) in ``order``: ``"raster"`` =
    row-major by grid cell, ``"file"`` = as given; their row-major cell index (n,); grid (H, W)).
    """
    grid = check_slide_inputs(features, coords, in_dim, grid_size)
    index = cell_index(coords, grid[1])
    require_distinct(index)
    if order == "raster":
        index, perm = torch.sort(index)
        features = features[perm]
    return features, index, grid


class TokenMIL(AttentionMIL):
    """Models of the tissue tokens only (no pad cells); attention scattered back onto the grid."""

    def _tokens(self, features: Tensor, coords: Tensor, grid_size: Optional[tuple[int, int]],
                order: str) -> tuple[Tensor, Tensor, tuple[int, int]]:
        features, index, grid = ordered_instances(features, coords, grid_size, self.in_dim, order)
        return self.proj(features), index, grid

    def _finish(self, tokens: Tensor, index: Tensor, grid: tuple[int, int]) -> dict[str, Tensor]:
        embedding, weights, scores = self.pool(tokens)
        return self._outputs(embedding, scatter_to_grid(weights, index, grid).flatten(),
                             scatter_to_grid(scores, index, grid).flatten(), grid)
