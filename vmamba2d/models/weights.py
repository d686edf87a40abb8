"""Checkpoint loading for VMamba / 2DVMamba: our native layout and the public VMamba v2 layout.

Public VMamba v2 checkpoints (``{"model": ..., "model_ema": ...}``) name the modules differently:

    official                                  native (this package)
    patch_embed.{0,2,5,7}.*                   stem.{conv1,norm1,conv2,norm2}.*
    layers.{i}.blocks.{j}.*                   stages.{i}.blocks.{j}.*
    layers.{i}.downsample.{1,3}.*  (i < 3)    stages.{i+1}.downsample.{conv,norm}.*
    classifier.norm.*                         norm.*
    classifier.head.*                         head.fc.*

Inside a block the names are the same. VMamba stores its pointwise layers (SS2D in_proj / out_proj,
MLP fc1 / fc2) as Linear weights (out, in); ours are 1x1 convs (out, in, 1, 1), so such weights are
reshaped.

Official VMamba training checkpoints also pickle their yacs ``CfgNode`` training config, which
``torch.load(weights_only=True)`` refuses; :func:`official_checkpoint_loading` lets it through as a
plain ``OrderedDict`` (no yacs import, no code run), keeping ``weights_only`` on.
"""
from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Dict, Iterator, List, Sequence
from urllib.error import URLError

import torch
import torch.nn as nn

Tensor = torch.Tensor

OFFICIAL_PREFIXES = ("patch_embed.", "layers.", "classifier.")
CHECKPOINT_KEYS = ("model_ema", "state_dict_ema", "model", "state_dict")  # EMA first, as timm
CLASSIFIER_PREFIX = "head.fc."  # timm itself drops / adapts these when num_classes differs
_STEM_NAMES = {"0": "conv1", "2": "norm1", "5": "conv2", "7": "norm2"}
_DOWNSAMPLE_NAMES = {"1": "conv", "3": "norm"}
_MAX_LISTED = 20


class _ConfigNodeAsDict:
    """Unpickles a yacs ``CfgNode`` as an empty ``OrderedDict``; the unpickler then fills in its
    items and sets its attributes (``__immutable__`` ...), so nothing of yacs is needed or run."""

    def __new__(cls, *args: object, **kwargs: object) -> OrderedDict:
        return OrderedDict()


# The pickle name an official checkpoint stores its training config under, and its stand-in.
OFFICIAL_CHECKPOINT_GLOBALS = [(_ConfigNodeAsDict, "yacs.config.CfgNode")]


@contextmanager
def clear_pretrained_errors(variant: str, url: str, file: str) -> Iterator[None]:
    """Within this context a failed ``pretrained=True`` load raises RuntimeError saying what is
    wrong instead of timm's raw ``URLError`` (no network) or a message-less FileNotFoundError /
    EOFError (a missing or empty ``pretrained_cfg_overlay`` file).

    Args:
        variant: the model name (for the message).
        url: the resolved pretrained cfg's url ('' when none).
        file: the resolved pretrained cfg's file ('' when none).
    """
    if file:
        path = os.path.expanduser(file)
        if not os.path.isfile(path):
            raise RuntimeError(f"{variant}: pretrained_cfg_overlay file {file} does not exist")
        if os.path.getsize(path) == 0:
            raise RuntimeError(f"{variant}: pretrained_cfg_overlay file {file} is empty (0 bytes)")
    try:
        yield
    except URLError as error:
        raise RuntimeError(
            f"{variant}: pretrained=True could not download {url} ({error.reason}). Without network, "
            "download the file elsewhere and pass pretrained_cfg_overlay=dict(file=PATH)") from None
    except EOFError as error:
        raise RuntimeError(f"{variant}: pretrained file {file or url} ends early (truncated): "
                           f"{type(error).__name__} {error}".rstrip()) from None


@contextmanager
def official_checkpoint_loading() -> Iterator[None]:
    """Within this context ``torch.load(weights_only=True)`` also reads official VMamba training
    checkpoints (``{"model", "model_ema", "optimizer", ..., "config": CfgNode}``)."""
    with torch.serialization.safe_globals(OFFICIAL_CHECKPOINT_GLOBALS):
        yield


def unwrap_checkpoint(checkpoint: Mapping) -> Dict[str, Tensor]:
    """The state dict inside a checkpoint dict (EMA weights first), without a DDP ``module.`` prefix."""
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f"checkpoint must be a dict (a state dict or a training checkpoint), got {type(checkpoint).__name__}")
    for key in CHECKPOINT_KEYS:
        inner = checkpoint.get(key)
        if isinstance(inner, Mapping):
            checkpoint = inner
            break
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in checkpoint.items()}


def is_official_layout(state_dict: Mapping) -> bool:
    """True when the keys follow the public VMamba code's module names."""
    return any(key.startswith(OFFICIAL_PREFIXES) for key in state_dict)


def _native_name(key: str) -> str:
    """Map one official VMamba key to ours; unknown keys come back unchanged (and are then reported)."""
    match = re.match(r"patch_embed\.(\d+)\.(.+)", key)
    if match and match.group(1) in _STEM_NAMES:
        return f"stem.{_STEM_NAMES[match.group(1)]}.{match.group(2)}"
    match = re.match(r"layers\.(\d+)\.blocks\.(.+)", key)
    if match:
        return f"stages.{match.group(1)}.blocks.{match.group(2)}"
    match = re.match(r"layers\.(\d+)\.downsample\.(\d+)\.(.+)", key)
    if match and match.group(2) in _DOWNSAMPLE_NAMES:
        return f"stages.{int(match.group(1)) + 1}.downsample.{_DOWNSAMPLE_NAMES[match.group(2)]}.{match.group(3)}"
    match = re.match(r"classifier\.(norm|head)\.(.+)", key)
    if match:
        return ("norm." if match.group(1) == "norm" else CLASSIFIER_PREFIX) + match.group(2)
    return key


def convert_official_vmamba(state_dict: Mapping) -> Dict[str, Tensor]:
    """Rename a public VMamba v2 state dict to this package's layout (shapes untouched)."""
    return {_native_name(key): value for key, value in state_dict.items()}


def listed_keys(keys: Sequence[str], limit: int = _MAX_LISTED) -> str:
    """The first ``limit`` keys, comma-separated, and how many more there are."""
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def key_mismatch_parts(missing: Sequence[str], unexpected: Sequence[str], mis_shaped: Sequence[str] = (),
                       limit: int = _MAX_LISTED) -> List[str]:
    """A state dict's mismatch with a model, one line per non-empty list: 'missing keys (N): ...',
    'unexpected keys (N): ...', 'shape mismatches (N): ...' (the first ``limit`` of each)."""
    kinds = (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", mis_shaped))
    return [f"{kind} ({len(items)}): {listed_keys(list(items), limit)}" for kind, items in kinds if items]


def checkpoint_filter_fn(state_dict: Mapping, model: nn.Module) -> Dict[str, Tensor]:
    """Turn a native or official VMamba checkpoint into a state dict for ``model``.

    Args:
        state_dict: a state dict, or a checkpoint dict holding one under ``model_ema`` / ``model`` /
            ``state_dict`` (official VMamba files, our training checkpoints).
        model: the VMamba / 2DVMamba model being loaded (scan "1d" or "2d": same parameters).
    Returns:
        the state dict with ``model``'s names and shapes (the classifier ``head.fc.*`` is passed
        through for timm to keep, drop or adapt).
    Raises:
        ValueError listing missing keys, unexpected keys and shape mismatches when the checkpoint
        does not fit ``model``.
    """
    state_dict = unwrap_checkpoint(state_dict)
    if is_official_layout(state_dict):
        state_dict = convert_official_vmamba(state_dict)
    target = model.state_dict()
    converted = {}
    for key, value in state_dict.items():
        expected = target.get(key)
        is_linear_for_pointwise_conv = (
            expected is not None and value.dim() == 2 and expected.dim() == 4
            and tuple(expected.shape[2:]) == (1, 1) and tuple(value.shape) == tuple(expected.shape[:2])
        )
        converted[key] = value.reshape(expected.shape) if is_linear_for_pointwise_conv else value

    def checked(keys):
        return sorted(k for k in keys if not k.startswith(CLASSIFIER_PREFIX))

    missing = checked(set(target) - set(converted))
    unexpected = checked(set(converted) - set(target))
    mismatched = [
        f"{k}: checkpoint {tuple(converted[k].shape)} vs model {tuple(target[k].shape)}"
        for k in checked(set(target) & set(converted))
        if tuple(converted[k].shape) != tuple(target[k].shape)
    ]
    if missing or unexpected or mismatched:
        problems = key_mismatch_parts(missing, unexpected, mismatched)
        raise ValueError(
            "checkpoint does not match the model (expected a VMamba v2 / 2DVMamba checkpoint of the same "
            "variant, native or official layout): " + "; ".join(problems)
        )
    return converted
