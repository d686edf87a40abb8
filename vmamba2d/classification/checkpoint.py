"""Classification checkpoints: safe (weights_only) loads, format tag, key / shape checks.

The run folder protocol (``last.pth`` as the commit point, ``best.pth``, ``metrics.jsonl``,
repair on resume) lives in ``vmamba2d.runs.run_folder``.
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any, Optional

import torch

from vmamba2d.models.weights import key_mismatch_parts
from vmamba2d.runs import BEST_NAME, LAST_NAME  # noqa: F401  (re-exported for the scripts)

from .errors import UsageError

CHECKPOINT_FORMAT = "vmamba2d.classification/1"


def load_checkpoint_file(path: Path, *, trust: bool = False,
                         trust_option: Optional[str] = "--trust-checkpoint") -> Any:
    """Load a ``.pth``/``.pt``/``.safetensors`` file on CPU.

    ``torch.load`` runs with ``weights_only=True`` (tensors, containers, numbers, strings only)
    unless ``trust`` is set, which the caller must have asked for explicitly. ``trust_option``:
    the option of the calling script that sets it, named in the refusal (None: it has none).
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:
        raise UsageError(f"checkpoint {path} is empty (0 bytes)")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path), device="cpu")
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as error:
        cause = _weights_only_cause(error)
        if "GLOBAL" not in cause:  # no refused object: the bytes are not a pickle torch reads
            raise UsageError(f"checkpoint {path} is not a torch checkpoint (unreadable pickle: "
                             f"{cause})") from error
        how = (f"pass {trust_option} to load it with full unpickling" if trust_option else
               "load it with torch.load(..., weights_only=False), keep its tensors and plain "
               "values, and save those")
        raise UsageError(
            f"checkpoint {path} holds objects other than tensors and plain containers, which a "
            f"weights_only load refuses ({cause}). If you trust the file, {how}") from error
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        first = (str(error).strip().splitlines() or [""])[0]
        raise UsageError(f"checkpoint {path} cannot be read ({type(error).__name__}"
                         f"{': ' + first if first else ''}); a truncated or foreign "
                         "file?") from error


def _weights_only_cause(error: pickle.UnpicklingError) -> str:
    """The cause in torch's multi-line weights_only message (``Unsupported global: GLOBAL
    pathlib.PosixPath ...``, ``Trying to load unsupported GLOBAL posix.getcwd ...``,
    ``Unsupported operand 0``) without the advice around it."""
    advice = ("Weights only load failed", "Check the documentation", "Please file an issue",
              "(1)", "(2)")
    lines = [line.split("WeightsUnpickler error:", 1)[-1].strip()
             for line in str(error).splitlines()]
    causes = [line for line in lines if line and not line.startswith(advice)]
    cause = causes[0] if causes else type(error).__name__
    return re.split(r"\. Please ", cause, maxsplit=1)[0].rstrip(".")


def is_training_checkpoint(obj: Any) -> bool:
    """True for checkpoints written by classification/train.py."""
    return isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT


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
        raise UsageError(f"{source} does not fit model {type(model).__name__}: "
                         + describe_key_mismatch(missing, unexpected, mis_shaped))


def describe_key_mismatch(missing: list[str], unexpected: list[str],
                          mis_shaped: list[str]) -> str:
    """'missing keys (N): a, b, ...; unexpected keys (M): ...; shape mismatches (K): ...'."""
    return "; ".join(key_mismatch_parts(missing, unexpected, mis_shaped, limit=5))


def describe_load_error(error: Exception) -> str:
    """Readable summary of a failed ``load_state_dict``: the first missing / unexpected keys and
    shape mismatches parsed from torch's message, else the message itself (whitespace folded,
    shortened)."""
    text = str(error)
    missing = _quoted_keys(text, "Missing key(s) in state_dict:")
    unexpected = _quoted_keys(text, "Unexpected key(s) in state_dict:")
    mis_shaped = [f"{match.group(1)}: checkpoint {_shape(match.group(2))} vs model "
                  f"{_shape(match.group(3))}" for match in _SIZE_MISMATCH.finditer(text)]
    if missing or unexpected or mis_shaped:
        return describe_key_mismatch(missing, unexpected, mis_shaped)
    folded = " ".join(text.split())
    return folded if len(folded) <= 600 else folded[:600] + " ..."


_SIZE_MISMATCH = re.compile(r"size mismatch for ([^:\s]+): copying a param with shape "
                            r"torch\.Size\(\[([\d, ]*)\]\) from checkpoint, the shape in current "
                            r"model is torch\.Size\(\[([\d, ]*)\]\)")


def _shape(numbers: str) -> tuple[int, ...]:
    return tuple(int(n) for n in numbers.split(",") if n.strip())


def _quoted_keys(text: str, heading: str) -> list[str]:
    """The "quoted", comma-separated keys after ``heading`` up to the end of its line."""
    start = text.find(heading)
    if start < 0:
        return []
    line = text[start + len(heading):].split("\n", 1)[0]
    return re.findall(r'"([^"]+)"', line)
