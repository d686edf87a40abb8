"""2DMambaMIL and its baselines for whole-slide-image classification / survival (docs/mil.md).

Every model shares one API (batch of one slide):

    model = build_model("mambamil2d", in_dim=1024, num_classes=3)   # or MambaMIL2D(...), ...
    out = model(features, coords)                           # features (n, in_dim), coords (n, 2)
    out["logits"]     (1, num_classes)
    out["attention"]  (H, W) softmax attention of each grid cell (models with an attention score)

``coords`` are integer grid positions (x = column, y = row), as ``vmamba2d.mil.data`` produces
them; the grid is ``H = max row + 1`` by ``W = max col + 1`` unless ``grid_size=(H, W)`` is passed
(absolute placement on a fixed canvas, docs/mil.md#fixed-canvas). The models never crop.

Models (``MODELS``, by name):
    ``mambamil2d``  ``MambaMIL2D``: input projection -> slide canvas filled with a pad token ->
                    ``num_blocks`` x [RMSNorm -> Mamba mixer whose scan is ``selective_scan_2d``
                    over the H x W grid, residual] -> LayerNorm -> attention pooling -> head.
    ``mambamil``    ``MambaMIL``: the same mixer on a 1D sequence of the slide's tissue tokens (our
                    scan on a 1 x n map, no pad cells). ``order="raster"`` (default) sorts the
                    tokens row-major by grid position, so the model is invariant to the file's row
                    order and equals MambaMIL2D on fully occupied 1 x W / H x 1 grids;
                    ``order="file"`` keeps the file's row order, as the official baseline does.
    ``abmil``       ``ABMIL``: input projection -> attention pooling -> head (no sequence mixing).
    ``clam_sb``, ``dsmil``, ``transmil``, ``s4mil``, ``mambamil_sr``, ``dtfdmil``: the paper's other
                    baselines.

Modules: :mod:`.base` (the shared API: input checks, pooling, outputs, base classes), :mod:`.mamba`
(the Mamba mixer and block), :mod:`.mamba_mil_2d` (2DMambaMIL), :mod:`.baselines` (every baseline,
with the layers :mod:`.nystrom` and :mod:`.s4d`); this package maps names to classes.

Outputs besides ``logits``: ``embedding`` (1, dim) pooled slide vector, ``probabilities`` (1, C)
softmax; with ``survival=True`` instead ``hazards`` (1, K) = sigmoid(logits), ``survival`` (1, K)
= cumprod(1 - hazards) and ``risk`` (1,) = -sum(survival), K = num_classes time bins (docs/mil.md:
survival, survival head size). Models with a per-instance attention score (``has_attention``)
also return ``attention`` (H, W) and ``attention_scores`` (H, W) pre-softmax scores (0 on cells
without a patch, excluded from the softmax).

Training losses: ``model.loss_weights`` names the loss terms and their default weights; the term
``"slide"`` is the task loss of ``logits``, the others come from
``model.auxiliary_losses(output, label, task_loss)`` (CLAM's instance loss, DSMIL's max-instance
loss). ``vmamba2d.mil.engine`` adds them up; ``mil/train.py --loss-weights`` overrides weights.

``build_model(name, **kwargs)`` / ``model.config`` / ``model_from_checkpoint(path)`` let scripts
save and rebuild a model: a checkpoint is a dict holding ``"model"`` (state dict) and
``"model_config"`` (= ``model.config``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Union

import torch

from .base import MILModel, check_slide_inputs
from .baselines import ABMIL, CLAMSB, DSMIL, DTFDMIL, S4MIL, MambaMIL, MambaMILSR, TransMIL
from .mamba_mil_2d import MambaMIL2D

MODELS: dict[str, type[MILModel]] = {
    cls.model_name: cls for cls in (MambaMIL2D, MambaMIL, ABMIL, CLAMSB, DSMIL, DTFDMIL, TransMIL, S4MIL, MambaMILSR)}


def build_model(name: str, **kwargs: Any) -> MILModel:
    """A MIL model by name (a key of ``MODELS``, e.g. ``"mambamil2d"``, ``"transmil"``) and constructor keywords."""
    if name not in MODELS:
        raise ValueError(f"model name must be one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name](**kwargs)


def model_from_checkpoint(path: Union[str, Path], map_location: Union[str, torch.device] = "cpu") -> MILModel:
    """Rebuild a model from a checkpoint dict with ``"model_config"`` (``model.config``) and ``"model"`` (state dict)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(checkpoint, dict) or "model_config" not in checkpoint or "model" not in checkpoint:
        raise ValueError(f"{path} is not a MIL checkpoint: expected a dict with 'model_config' and 'model' keys")
    config = dict(checkpoint["model_config"])
    model = build_model(config.pop("name"), **config)
    model.load_state_dict(checkpoint["model"])
    return model


__all__ = ["ABMIL", "CLAMSB", "DSMIL", "DTFDMIL", "MODELS", "MILModel", "MambaMIL", "MambaMIL2D", "MambaMILSR",
           "S4MIL", "TransMIL", "build_model", "check_slide_inputs", "model_from_checkpoint"]
