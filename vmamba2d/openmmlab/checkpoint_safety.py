"""Let ``torch.load(weights_only=True)`` (torch >= 2.6 default) read mmengine checkpoints, and make
mmengine load local checkpoint files that way on every torch.

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

mmengine's loader for local files (``Runner.load_checkpoint`` / ``resume``, ``load_from``,
``mmengine.runner.load_checkpoint``, mmseg's ``init_model``, mmdet's ``init_detector``) calls
``torch.load`` without ``weights_only``: torch < 2.6 then unpickles anything, executing what a
malicious file says.
:func:`use_weights_only_local_loader` replaces it by :func:`load_from_local_file`, which always passes
``weights_only=True`` (an explicit value, which ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot override)
and reports a refused or unreadable file in one line. mmengine's URL loaders (``http://``, ``s3://``
...) are left as they are; the seg and det entry points only load local files.
"""
from __future__ import annotations

import os.path as osp
import pickle
import re
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader

from .errors import RefusedCheckpointError, InputError, MissingFileError

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


def load_from_local_file(filename: str, map_location: Optional[Any] = None) -> Any:
    """mmengine's local checkpoint loader, with ``torch.load(weights_only=True)`` on every torch version.

    Args:
        filename: checkpoint path (``~`` expanded).
        map_location: as for ``torch.load``.

    Returns:
        the loaded object (an mmengine checkpoint dict, or a plain state dict).

    Raises:
        MissingFileError (a FileNotFoundError) when there is no such file; RefusedCheckpointError
        when the file holds pickled objects outside the allow-list (nothing of it is executed);
        InputError when torch cannot read it (truncated, not a torch file). Each message is one
        line naming the file.
    """
    path = osp.expanduser(filename)
    if not osp.isfile(path):
        raise MissingFileError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise RefusedCheckpointError(
            f"checkpoint {path} refused: it holds Python objects that weights-only loading does not allow "
            f"({load_error_reason(error)}); nothing of it was executed. If you trust the file, re-save "
            "only its state dict (tensors) and load that") from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise InputError(f"checkpoint {path} cannot be read: {load_error_reason(error)}") from None


def load_error_reason(error: Exception) -> str:
    """One line saying why ``torch.load`` failed.

    For a weights_only refusal, the cause in torch's multi-line message (``Unsupported global: GLOBAL
    print ...``, ``Trying to load unsupported GLOBAL posix.mkdir ...``) without the advice around it;
    otherwise ``'<ExceptionType>: <first line of the message>'``.
    """
    if not isinstance(error, pickle.UnpicklingError):
        first_line = (str(error).strip().splitlines() or [""])[0]
        return f"{type(error).__name__}: {first_line}"
    advice = ("Weights only load failed", "Check the documentation", "(1)", "(2)")
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    causes = [line.split("WeightsUnpickler error:", 1)[-1].strip() for line in lines
              if "WeightsUnpickler error:" in line or not line.startswith(advice)]
    cause = (causes or lines or [type(error).__name__])[0]
    return re.split(r"\. Please ", cause, maxsplit=1)[0].rstrip(".")


def use_weights_only_local_loader() -> None:
    """Make mmengine's ``CheckpointLoader`` load local files with :func:`load_from_local_file`."""
    CheckpointLoader.register_scheme(prefixes="", loader=load_from_local_file, force=True)
