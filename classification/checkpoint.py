"""Training checkpoints: atomic writes, safe (weights_only) loads, RNG state capture/restore.

A run folder holds ``last.pth`` (rewritten after every epoch) and ``best.pth`` (the epoch with the
best validation top-1). Files are first written to a temporary file in the same folder and then
renamed with ``os.replace``, so a crash never leaves a truncated checkpoint behind.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Optional

import torch

from vmamba2d.training.checkpoint import (atomic_torch_save, capture_rng_state,  # noqa: F401
                                         restore_rng_state)

from .errors import UsageError

CHECKPOINT_FORMAT = "vmamba2d.classification/1"
LAST_NAME = "last.pth"
BEST_NAME = "best.pth"


def load_checkpoint_file(path: Path, *, trust: bool = False) -> Any:
    """Load a ``.pth``/``.pt``/``.safetensors`` file on CPU.

    ``torch.load`` runs with ``weights_only=True`` (tensors, containers, numbers, strings only)
    unless ``trust`` is set, which the caller must have asked for explicitly.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path), device="cpu")
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as error:
        raise UsageError(
            f"checkpoint {path} holds objects other than tensors and plain containers, which a "
            f"weights_only load refuses ({str(error).splitlines()[0]}). If you trust the file, "
            "pass --trust-checkpoint to load it with full unpickling.") from error
    except (RuntimeError, EOFError) as error:
        raise UsageError(f"checkpoint {path} cannot be read: {error}") from error


def is_training_checkpoint(obj: Any) -> bool:
    """True for checkpoints written by classification/train.py."""
    return isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT


def find_auto_resume(output: Path) -> Optional[Path]:
    """``<output>/last.pth`` when it exists, else None (``--resume auto`` then starts fresh)."""
    candidate = Path(output) / LAST_NAME
    return candidate if candidate.is_file() else None


def check_state_dict_matches(model: torch.nn.Module, state_dict: dict[str, torch.Tensor],
                             source: str) -> None:
    """Raise UsageError naming missing / unexpected / mis-shaped keys before loading anything."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mis_shaped = sorted(
        f"{key}: checkpoint {tuple(state_dict[key].shape)} vs model {tuple(expected[key].shape)}"
        for key in set(expected) & set(state_dict)
        if tuple(state_dict[key].shape) != tuple(expected[key].shape))
    if missing or unexpected or mis_shaped:
        def head(items: list[str]) -> str:
            return ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s): {head(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {head(unexpected)}")
        if mis_shaped:
            parts.append(f"{len(mis_shaped)} shape mismatch(es): {head(mis_shaped)}")
        raise UsageError(f"{source} does not fit model {type(model).__name__}: " + "; ".join(parts))
