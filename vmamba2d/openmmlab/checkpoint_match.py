"""How much of a model a checkpoint covers, so that seg / det never score or train from random
weights because a checkpoint silently matched none of the model's keys.

mmengine's ``load_checkpoint`` loads non-strictly: a checkpoint of another model (a classification
``last.pth``, a detector for a segmentor) only produces a warning listing the missing keys, and the
run goes on with random weights. :func:`check_checkpoint_covers` counts the model's weights that
the checkpoint holds with the same shape and refuses a checkpoint below a stated share.
"""
from __future__ import annotations

import os.path as osp
from typing import Any, Mapping, Tuple

import torch
import torch.nn as nn

from .checkpoint_safety import load_from_local_file
from .errors import InputError, MissingFileError

MIN_TEST_SHARE = 0.9
"""test.py: at least 90% of the model's weights must come from the checkpoint."""
MIN_LOAD_FROM_SHARE = 0.5
"""train.py ``load_from``: at least half of them (fine-tuning may change heads, e.g. the classes)."""


def _strip_wrapper(key: str) -> str:
    while key.startswith("module."):  # DDP / TTA wrappers, as mmengine's revise_keys does
        key = key[len("module."):]
    return key


def covered_weights(model: nn.Module, state_dict: Mapping[str, Any]) -> Tuple[int, int]:
    """(model weights the state dict holds with the same shape, model weights in all)."""
    given = {_strip_wrapper(key): value for key, value in state_dict.items()}
    wanted = {_strip_wrapper(key): value for key, value in model.state_dict().items()}
    matched = sum(1 for key, value in wanted.items()
                  if torch.is_tensor(given.get(key)) and given[key].shape == value.shape)
    return matched, len(wanted)


def check_checkpoint_covers(model: nn.Module, path: str, min_share: float, what: str) -> None:
    """Refuse ``path`` (loaded weights-only) when it holds fewer than ``min_share`` of the model's
    weights.

    Args:
        model: the model the checkpoint is for (wrappers such as DDP / TTA are looked through).
        path: a local checkpoint: an mmengine checkpoint (``state_dict``) or a plain state dict.
        min_share: the share of the model's weights (0..1) it must hold with matching shapes.
        what: how the user named it, for the message (``"checkpoint"``, ``"load_from"``).

    Raises:
        InputError in one line with the counts (or the loader's one-line errors for a missing,
        refused or unreadable file).
    """
    if "://" in str(path):
        raise InputError(f"{what} {path}: only local files are loaded (download it first)")
    if not osp.isfile(osp.expanduser(str(path))):
        raise MissingFileError(f"{what} not found: {path}")
    checkpoint = load_from_local_file(str(path), map_location="cpu")
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, Mapping) else None
    if not isinstance(state, Mapping):
        raise InputError(f"{what} {path} holds no state dict (a {type(checkpoint).__name__})")
    matched, total = covered_weights(model, state)
    if matched < min_share * total:
        raise InputError(
            f"{what} {path} holds {matched} of the model's {total} weights ({matched / max(total, 1):.0%}; "
            f"at least {min_share:.0%} needed): it is not a checkpoint of this model (an ImageNet "
            "classification checkpoint belongs in model.backbone.init_cfg.checkpoint)")
