"""Let ``torch.load(weights_only=True)`` (torch >= 2.6 default) read mmengine checkpoints.

An mmengine checkpoint stores, besides tensors, the message hub: ``HistoryBuffer`` objects holding
numpy arrays, numpy scalars (``eta``, ``best_score``) and, inside each buffer, the statistic
methods (``HistoryBuffer.min`` ...), which pickle protocol 2 writes as
``getattr(HistoryBuffer, 'min')``. This module allow-lists exactly those globals:

* ``mmengine.logging.HistoryBuffer``;
* numpy array / scalar reconstruction and the numeric dtype classes (bool, int, uint, float,
  complex; not object, string or void), under both numpy 2 (``numpy._core``) and numpy 1
  (``numpy.core``) names;
* a restricted ``builtins.getattr`` that only resolves ``HistoryBuffer`` statistic methods and
  refuses everything else (plain ``getattr`` is not allow-listed).

``weights_only`` stays on; nothing else is allowed.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, List, Tuple, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

_NUMERIC_KINDS = "biufc"


def _history_buffer_getattr(owner: Any, name: str) -> Callable:
    """``getattr`` limited to HistoryBuffer's registered statistic methods (what checkpoints hold)."""
    allowed = set(HistoryBuffer._statistics_methods) | {"min", "max", "current", "mean"}
    if owner is HistoryBuffer and isinstance(name, str) and name in allowed:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f"vmamba2d: refusing getattr({owner!r}, {name!r}) while loading with weights_only=True; only "
        f"HistoryBuffer statistic methods ({', '.join(sorted(allowed))}) are allowed")


def _numeric_dtype_classes() -> List[type]:
    classes = []
    for char in np.typecodes["All"]:
        dtype = np.dtype(char)
        if dtype.kind in _NUMERIC_KINDS and type(dtype) not in classes:
            classes.append(type(dtype))
    return classes


def mmengine_checkpoint_globals() -> List[Union[Callable, Tuple[Callable, str]]]:
    """The globals (with the pickle names they appear under) that mmengine checkpoints need."""
    try:
        from numpy._core import multiarray  # numpy >= 2
    except ImportError:
        from numpy.core import multiarray

    entries: List[Union[Callable, Tuple[Callable, str]]] = [
        (HistoryBuffer, "mmengine.logging.history_buffer.HistoryBuffer"),
        (_history_buffer_getattr, "builtins.getattr"),
        (np.ndarray, "numpy.ndarray"),
        (np.dtype, "numpy.dtype"),
    ]
    for package in ("numpy._core", "numpy.core"):
        entries.append((multiarray._reconstruct, f"{package}.multiarray._reconstruct"))
        entries.append((multiarray.scalar, f"{package}.multiarray.scalar"))
    for dtype_class in _numeric_dtype_classes():
        entries.append((dtype_class, f"numpy.dtypes.{dtype_class.__name__}"))
    return entries


def allow_mmengine_checkpoint_globals() -> None:
    """Register :func:`mmengine_checkpoint_globals` with ``torch.serialization.add_safe_globals``."""
    torch.serialization.add_safe_globals(mmengine_checkpoint_globals())
