"""Training checkpoints: atomic writes, safe (weights_only) loads, RNG state capture/restore.

A run folder holds ``last.pth`` (rewritten after every epoch) and ``best.pth`` (the epoch with the
best validation top-1). Files are first written to a temporary file in the same folder and then
renamed with ``os.replace``, so a crash never leaves a truncated checkpoint behind.
"""
from __future__ import annotations

import os
import pickle
import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from .errors import UsageError

CHECKPOINT_FORMAT = "vmamba2d.classification/1"
LAST_NAME = "last.pth"
BEST_NAME = "best.pth"


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` via a temp file in the same folder + fsync + ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states, as weights_only-loadable values."""
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": np_kind, "keys": torch.from_numpy(np_keys.astype(np.int64)),
                  "pos": int(np_pos), "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    np_state = state["numpy"]
    np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype(np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


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
