"""Read checkpoints and load the matching part of them into a backbone (the lenient convention of
mmseg and mmdet: missing / unexpected keys are reported, shape mismatches are errors)."""
from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Dict, List, Tuple

import torch
import torch.nn as nn

from vmamba2d.models.weights import convert_official_vmamba, is_official_layout

from .checkpoint_safety import load_error_reason
from .errors import RefusedCheckpointError, InputError, MissingFileError

# Keys holding the weights inside a training checkpoint, EMA first (timm's convention).
_CHECKPOINT_KEYS = ("model_ema", "state_dict_ema", "model", "state_dict", "module")
# Classifier parts a backbone drops: official VMamba "classifier.{norm,head}", our
# final "norm." and "head." (top-level only: block norms are "stages.i.blocks.j.norm...").
_CLASSIFIER_PREFIXES = ("classifier.", "norm.", "head.")
_MAX_LISTED = 20


def read_checkpoint(path: str | Path, trusted: bool = False) -> Dict[str, torch.Tensor]:
    """Read the weights of a checkpoint file (.pth/.pt/.bin via torch.load, or .safetensors).

    Args:
        path: checkpoint file.
        trusted: load with ``weights_only=False`` (only for files you trust: arbitrary pickled
            objects are executed). Default: ``weights_only=True``.

    Returns:
        the state dict (name -> tensor), taken from ``model_ema`` / ``model`` / ``state_dict`` when
        the file is a training checkpoint, with any DDP ``module.`` prefix removed.

    Raises:
        MissingFileError (a FileNotFoundError) when there is no such file; RefusedCheckpointError
        when ``weights_only`` loading refuses its pickled objects; InputError (a ValueError) when it
        cannot be read or holds no tensors. Each message is one line naming the file.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise MissingFileError(f"pretrained checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        checkpoint = load_file(str(path))
    else:
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=not trusted)
        except pickle.UnpicklingError as error:
            raise RefusedCheckpointError(
                f"{path} holds Python objects that torch.load(weights_only=True) refuses "
                f"({load_error_reason(error)}). If you trust the file, pass trusted=True (backbone "
                "init_cfg=dict(type='Pretrained', checkpoint=..., trusted=True)), or re-save just its "
                "state dict.") from None
        except (RuntimeError, EOFError, OSError, ValueError) as error:
            raise InputError(f"pretrained checkpoint {path} cannot be read: {load_error_reason(error)}") from None
    if not isinstance(checkpoint, Mapping):
        raise InputError(f"{path}: expected a state dict or a checkpoint dict, got {type(checkpoint).__name__}")
    for key in _CHECKPOINT_KEYS:
        if isinstance(checkpoint.get(key), Mapping):
            checkpoint = checkpoint[key]
            break
    state_dict = {}
    for key, value in checkpoint.items():
        if isinstance(value, torch.Tensor):
            state_dict[key[len("module."):] if key.startswith("module.") else key] = value
    if not state_dict:
        raise InputError(f"{path}: no tensors found (looked under {', '.join(_CHECKPOINT_KEYS)} and at top "
                            "level)")
    return state_dict


def strip_prefix(state_dict: Mapping[str, torch.Tensor], prefix: str, source: str) -> Dict[str, torch.Tensor]:
    """The entries of ``state_dict`` whose key starts with ``prefix``, with the prefix removed.

    Args:
        state_dict: name -> tensor.
        prefix: e.g. ``"backbone."`` to take the backbone out of a whole segmentor / detector checkpoint.
        source: the checkpoint's name, for the error message.

    Raises:
        InputError (a ValueError) naming the key groups the checkpoint does have when no key starts
        with ``prefix``.
    """
    selected = {key[len(prefix):]: value for key, value in state_dict.items() if key.startswith(prefix)}
    if not selected:
        raise InputError(f"{source}: no key starts with prefix={prefix!r}; its keys start with "
                            f"{key_groups(state_dict)}. Set init_cfg prefix to one of these groups (with "
                            "the trailing dot), or drop prefix for an ImageNet classification checkpoint.")
    return selected


def key_groups(keys: Iterable[str], limit: int = 8) -> str:
    """A summary of key names by their first component, e.g. ``'backbone.* (312), decode_head.* (40)'``."""
    counts = Counter(key.split(".", 1)[0] + ("." if "." in key else "") for key in keys)
    groups = [f"{group}{'*' if group.endswith('.') else ''} ({count})" for group, count in counts.most_common(limit)]
    more = len(counts) - limit
    return ", ".join(groups) + (f", ... ({more} more groups)" if more > 0 else "")


def classification_weights(state_dict: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """An ImageNet checkpoint's weights in the timm model's names, classifier dropped.

    Public VMamba v2 names (``patch_embed.*``, ``layers.*``) are renamed to ours; the classifier
    (official ``classifier.*``, our final ``norm.*`` and ``head.*``) is removed.
    """
    if is_official_layout(state_dict):
        state_dict = convert_official_vmamba(state_dict)
    return {k: v for k, v in state_dict.items() if not k.startswith(_CLASSIFIER_PREFIXES)}


def _fit_pointwise(value: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """A Linear weight (out, in) for a 1x1 conv weight (out, in, 1, 1) is reshaped; else unchanged."""
    if value.dim() == 2 and expected.dim() == 4 and tuple(expected.shape[2:]) == (1, 1) \
            and tuple(value.shape) == tuple(expected.shape[:2]):
        return value.reshape(expected.shape)
    return value


def load_matching_weights(module: nn.Module, state_dict: Mapping[str, torch.Tensor],
                          source: str) -> Tuple[List[str], List[str]]:
    """Load the entries of ``state_dict`` that ``module`` has; report the rest (mmseg's / mmdet's convention).

    Keys only ``module`` has (missing) and keys only the checkpoint has (unexpected, e.g. stages a
    backbone with fewer ``out_indices`` does not build) are returned for logging, not raised.

    Raises:
        InputError (a ValueError) listing shape mismatches (a checkpoint of another variant), or,
        when no key matches at all, naming the checkpoint's key groups next to the module's (a prefix
        mismatch).

    Returns:
        (missing keys, unexpected keys), sorted.
    """
    target = module.state_dict()
    fitted = {k: _fit_pointwise(v, target[k]) if k in target else v for k, v in state_dict.items()}
    matched = sorted(set(target) & set(fitted))
    if not matched:
        raise InputError(
            f"{source}: no key matches the model. The checkpoint's keys start with {key_groups(fitted)}; "
            f"the model's with {key_groups(target)}. A whole segmentor / detector checkpoint needs "
            "init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.').")
    mismatched = [f"{k}: checkpoint {tuple(fitted[k].shape)} vs model {tuple(target[k].shape)}"
                  for k in matched if fitted[k].shape != target[k].shape]
    if mismatched:
        raise InputError(f"{source}: shape mismatches ({len(mismatched)}), a checkpoint of another model "
                            f"variant? {', '.join(mismatched[:_MAX_LISTED])}")
    module.load_state_dict({k: fitted[k] for k in matched}, strict=False)
    return sorted(set(target) - set(fitted)), sorted(set(fitted) - set(target))
