"""Load ImageNet weights (ours or official VMamba v2) into a timm backbone used for segmentation."""
from __future__ import annotations

import pickle
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Dict, List, Tuple

import torch
import torch.nn as nn

# Keys holding the weights inside a training checkpoint, EMA first (timm's convention).
_CHECKPOINT_KEYS = ("model_ema", "state_dict_ema", "model", "state_dict", "module")
# Classifier parts a segmentation backbone drops: official VMamba "classifier.{norm,head}", our
# final "norm." and "head." (top-level only: block norms are "stages.i.blocks.j.norm...").
_CLASSIFIER_PREFIXES = ("classifier.", "norm.", "head.")


def read_checkpoint(path: str | Path, trusted: bool = False) -> Dict[str, torch.Tensor]:
    """Read the weights of a checkpoint file (.pth/.pt/.bin via torch.load, or .safetensors).

    Args:
        path: checkpoint file.
        trusted: load with ``weights_only=False`` (only for files you trust: arbitrary pickled
            objects are executed). Default: ``weights_only=True``.

    Returns:
        the state dict (name -> tensor), taken from ``model_ema`` / ``model`` / ``state_dict`` when
        the file is a training checkpoint, with any DDP ``module.`` prefix removed.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"pretrained checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        checkpoint = load_file(str(path))
    else:
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=not trusted)
        except pickle.UnpicklingError as error:
            raise ValueError(
                f"{path} holds Python objects that torch.load(weights_only=True) refuses ({error}). "
                "If you trust the file, pass trusted=True (backbone init_cfg=dict(type='Pretrained', "
                "checkpoint=..., trusted=True)), or re-save just its state dict.") from error
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f"{path}: expected a state dict or a checkpoint dict, got {type(checkpoint).__name__}")
    for key in _CHECKPOINT_KEYS:
        if isinstance(checkpoint.get(key), Mapping):
            checkpoint = checkpoint[key]
            break
    state_dict = {}
    for key, value in checkpoint.items():
        if isinstance(value, torch.Tensor):
            state_dict[key[len("module."):] if key.startswith("module.") else key] = value
    if not state_dict:
        raise ValueError(f"{path}: no tensors found (looked under {', '.join(_CHECKPOINT_KEYS)} and at top level)")
    return state_dict


def load_backbone_weights(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> Tuple[List[str], List[str]]:
    """Load classification weights into a (head-less) timm ``model``.

    Classifier keys are dropped; the model module's ``checkpoint_filter_fn`` (timm convention; for
    VMamba it maps official VMamba v2 names and validates the result) is applied when it exists;
    the rest is loaded non-strictly.

    Returns:
        (missing keys, unexpected keys) of the final ``load_state_dict``.
    """
    state_dict = {k: v for k, v in state_dict.items() if not k.startswith(_CLASSIFIER_PREFIXES)}
    filter_fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if filter_fn is not None:
        state_dict = filter_fn(state_dict, model)
    result = model.load_state_dict(state_dict, strict=False)
    return list(result.missing_keys), list(result.unexpected_keys)
