"""Model creation by timm name (vmamba2d models registered on import) and weight loading."""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Optional

import timm
import torch

import vmamba2d  # noqa: F401  (registers the vmamba2d_* / vmamba_* models with timm)

from .checkpoint import (check_state_dict_matches, describe_load_error, is_training_checkpoint,
                         load_checkpoint_file)
from .errors import UsageError


def check_model_name(name: str) -> None:
    """UsageError (with close matches) when ``name`` is not a registered timm model."""
    if timm.is_model(name):
        return
    close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
    hint = f"; did you mean: {', '.join(close)}" if close else ""
    raise UsageError(f"--model: unknown model name '{name}' (not registered in timm{hint})")


def create_classifier(name: str, num_classes: int, drop_path: float = 0.0,
                      model_kwargs: Optional[dict[str, Any]] = None) -> torch.nn.Module:
    """A randomly initialised ``name`` with a ``num_classes``-way head and stochastic depth."""
    check_model_name(name)
    kwargs: dict[str, Any] = {**(model_kwargs or {}), "num_classes": num_classes}
    if drop_path > 0:
        kwargs["drop_path_rate"] = drop_path
    try:
        return timm.create_model(name, pretrained=False, **kwargs)
    except (TypeError, ValueError) as error:
        raise UsageError(f"--model {name}: cannot be built with {kwargs} ({error})") from error


def select_state_dict(checkpoint: Any, use_ema: bool, source: str) -> dict[str, torch.Tensor]:
    """Weights from a checkpoint object: our training checkpoints, official VMamba files
    (``model`` / ``model_ema``), timm (``state_dict`` / ``state_dict_ema``) or a plain state dict.
    A leading ``module.`` (DDP) is stripped."""
    if not isinstance(checkpoint, dict):
        raise UsageError(f"{source}: expected a dict of weights, got {type(checkpoint).__name__}")
    keys = ("model_ema", "state_dict_ema") if use_ema else ("model", "state_dict")
    state = None
    for key in keys:
        if isinstance(checkpoint.get(key), dict):
            state = checkpoint[key]
            break
    if state is None:
        if use_ema:
            raise UsageError(f"{source}: --use-ema given but the checkpoint has no EMA weights "
                             f"(top-level keys: {sorted(checkpoint)[:10]})")
        if not all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
            raise UsageError(f"{source}: no 'model'/'state_dict' entry and not a plain state dict "
                             f"(top-level keys: {sorted(checkpoint)[:10]})")
        state = checkpoint
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state.items()}


def load_model_for_eval(name: str, checkpoint_path: Path, num_classes: int, use_ema: bool,
                        trust_checkpoint: bool = False,
                        model_kwargs: Optional[dict[str, Any]] = None) -> torch.nn.Module:
    """Build ``name`` with ``num_classes`` outputs and load ``checkpoint_path`` into it, strictly.

    Our training checkpoints are loaded as they are (with the ``model_kwargs`` they were trained
    with, unless ``model_kwargs`` is given); other files (official VMamba releases, plain
    state dicts) go through timm's pretrained loading (``pretrained_cfg_overlay=state_dict``) so the
    model's own checkpoint filter converts foreign layouts.
    """
    check_model_name(name)
    checkpoint = load_checkpoint_file(checkpoint_path, trust=trust_checkpoint)
    source = f"checkpoint {checkpoint_path}"
    state = select_state_dict(checkpoint, use_ema, source)
    if is_training_checkpoint(checkpoint):
        if checkpoint.get("model_name") != name:
            raise UsageError(f"{source} was trained as '{checkpoint.get('model_name')}', "
                             f"not --model '{name}'")
        if model_kwargs is None:
            model_kwargs = checkpoint.get("config", {}).get("model_kwargs", {})
        model = create_classifier(name, num_classes, model_kwargs=model_kwargs)
        check_state_dict_matches(model, state, source)
        model.load_state_dict(state, strict=True)
        return model
    try:
        return timm.create_model(name, pretrained=True, num_classes=num_classes,
                                 **(model_kwargs or {}),
                                 pretrained_cfg_overlay={"state_dict": state,
                                                         "num_classes": num_classes})
    except (RuntimeError, ValueError) as error:  # strict load_state_dict / checkpoint filter
        raise UsageError(f"{source} does not fit model '{name}' with {num_classes} classes: "
                         f"{describe_load_error(error)}") from error


def check_model_input(model: torch.nn.Module, name: str, img_size: int,
                      device: torch.device) -> None:
    """Run ``model`` once on a zero (1, 3, img_size, img_size) batch in eval mode, so an input
    size the model cannot take is reported (naming --img-size and the model's own reason)
    before anything is written, not in the middle of the first epoch."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, img_size, img_size, device=device))
    except (RuntimeError, ValueError, AssertionError, TypeError) as error:
        reason = " ".join(str(error).split())[:400]
        raise UsageError(f"--img-size {img_size}: model '{name}' cannot take a (batch, 3, "
                         f"{img_size}, {img_size}) input: {reason}") from error
    finally:
        model.train(was_training)
