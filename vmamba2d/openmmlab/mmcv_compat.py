"""A narrow stand-in for ``mmcv.ops`` when mmcv's compiled extension is missing.

mmsegmentation 1.2.2 imports a few names from ``mmcv.ops`` at module level (``point_sample`` in
``mmseg.utils.mask_classification``, ``mmseg.models.utils.point_sample`` and the SAN head;
``sigmoid_focal_loss`` in ``mmseg.models.losses.focal_loss``), so ``import mmseg.models`` fails
with ``mmcv-lite``, whose ``mmcv.ops`` package needs the compiled ``mmcv._ext``. UperNet and the
FCN head use no compiled op, so a stand-in module lets mmseg import and train them:

* ``point_sample`` and ``sigmoid_focal_loss`` are implemented in PyTorch (same semantics as mmcv's);
* the compiled ops that mmseg imports inside ``try`` blocks (``CrissCrossAttention``, ``PSAMask``,
  ``DeformConv2d``, ``ModulatedDeformConv2d``) are placeholders that raise ``NotImplementedError``
  naming the op when they are built;
* every other name raises ``AttributeError`` (so ``from mmcv.ops import X`` fails clearly).

The stand-in is installed only when ``mmcv._ext`` cannot be found; with a full mmcv build nothing
is changed.
"""
from __future__ import annotations

import importlib.util
import sys
import types
import warnings

import torch
import torch.nn.functional as F

_MODULE_NAME = "mmcv.ops"
_MARKER = "__vmamba2d_compat__"
_INSTALL_HINT = ("install a full mmcv build (e.g. `pip install mmcv==2.1.0`, compiled from source) "
                 "to use it")
_UNAVAILABLE_OPS = ("CrissCrossAttention", "PSAMask", "DeformConv2d", "ModulatedDeformConv2d")


def point_sample(input: torch.Tensor, points: torch.Tensor, align_corners: bool = False,
                 **kwargs) -> torch.Tensor:
    """Bilinearly sample ``input`` at normalised point coordinates (mmcv.ops.point_sample).

    Args:
        input: (N, C, H, W) feature map.
        points: (N, P, 2) or (N, Hg, Wg, 2) coordinates (x, y) in [0, 1].
        align_corners: as in ``torch.nn.functional.grid_sample``.
        **kwargs: passed on to ``grid_sample`` (e.g. ``mode``, ``padding_mode``).

    Returns:
        (N, C, P) for 3-D ``points``, else (N, C, Hg, Wg).
    """
    if input.dim() != 4:
        raise ValueError(f"point_sample: input must be (N, C, H, W), got shape {tuple(input.shape)}")
    if points.dim() not in (3, 4) or points.shape[-1] != 2:
        raise ValueError("point_sample: points must be (N, P, 2) or (N, Hg, Wg, 2), got shape "
                         f"{tuple(points.shape)}")
    grid = points.unsqueeze(2) if points.dim() == 3 else points
    output = F.grid_sample(input, 2.0 * grid - 1.0, align_corners=align_corners, **kwargs)
    return output.squeeze(3) if points.dim() == 3 else output


def sigmoid_focal_loss(input: torch.Tensor, target: torch.Tensor, gamma: float = 2.0,
                       alpha: float = 0.25, weight: torch.Tensor | None = None,
                       reduction: str = "mean") -> torch.Tensor:
    """Sigmoid focal loss with class-index targets (mmcv.ops.sigmoid_focal_loss).

    Element (n, c) is positive when ``target[n] == c``: loss ``-alpha (1-p)^gamma log p``,
    otherwise ``-(1-alpha) p^gamma log(1-p)``, with ``p = sigmoid(input[n, c])``; a ``target``
    equal to the number of classes (background) makes every element negative.

    Args:
        input: (N, C) logits.
        target: (N,) int64 class indices in [0, C].
        gamma, alpha: focusing and balance parameters.
        weight: optional (C,) per-class weight, applied through ``weight[target[n]]``.
        reduction: "none" -> (N, C); "mean" -> sum / N; "sum" -> sum.

    Returns:
        The loss, shaped by ``reduction``.
    """
    if input.dim() != 2:
        raise ValueError(f"sigmoid_focal_loss: input must be (N, C), got shape {tuple(input.shape)}")
    if target.shape != input.shape[:1] or target.dtype != torch.long:
        raise ValueError("sigmoid_focal_loss: target must be an int64 tensor of shape "
                         f"({input.shape[0]},), got {target.dtype} {tuple(target.shape)}")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"sigmoid_focal_loss: reduction must be 'none', 'mean' or 'sum', got "
                         f"{reduction!r}")
    classes = torch.arange(input.shape[1], device=input.device)
    positive = (target.unsqueeze(1) == classes.unsqueeze(0)).to(input.dtype)
    prob = input.sigmoid()
    positive_loss = -alpha * (1 - prob).pow(gamma) * F.logsigmoid(input)
    negative_loss = -(1 - alpha) * prob.pow(gamma) * F.logsigmoid(-input)
    loss = positive * positive_loss + (1 - positive) * negative_loss
    if weight is not None:
        if weight.dim() != 1 or weight.shape[0] != input.shape[1]:
            raise ValueError(f"sigmoid_focal_loss: weight must be ({input.shape[1]},), got shape "
                             f"{tuple(weight.shape)}")
        # mmcv indexes the weight by the target class; background targets (== C) get weight 1
        padded = torch.cat([weight.to(loss.dtype), weight.new_ones(1).to(loss.dtype)])
        loss = loss * padded[target].unsqueeze(1)
    if reduction == "mean":
        return loss.sum() / input.shape[0]
    if reduction == "sum":
        return loss.sum()
    return loss


def _unavailable_op(name: str) -> type:
    """A placeholder class for a compiled mmcv op that fails loudly when it is built."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"mmcv.ops.{name} is a compiled mmcv op and mmcv's compiled extension (mmcv._ext) is "
            f"not installed (vmamba2d's mmcv-lite compatibility layer is active); {_INSTALL_HINT}.")

    return type(name, (torch.nn.Module,), {"__init__": __init__, "__module__": _MODULE_NAME})


def _missing_name(name: str):
    raise AttributeError(
        f"module 'mmcv.ops' has no attribute {name!r}: mmcv's compiled extension (mmcv._ext) is not "
        f"installed and vmamba2d's mmcv-lite compatibility layer provides only "
        f"point_sample, sigmoid_focal_loss and placeholders for {', '.join(_UNAVAILABLE_OPS)}; "
        f"{_INSTALL_HINT}.")


def compiled_mmcv_ops_available() -> bool:
    """True when mmcv's compiled extension ``mmcv._ext`` can be found (a full mmcv install)."""
    try:
        return importlib.util.find_spec("mmcv._ext") is not None
    except ModuleNotFoundError:  # mmcv itself is not installed
        return False


def compat_layer_active() -> bool:
    """True when the stand-in ``mmcv.ops`` module of this file is the one in use."""
    return getattr(sys.modules.get(_MODULE_NAME), _MARKER, False)


def install_mmcv_ops_compat() -> bool:
    """Install the stand-in ``mmcv.ops`` if (and only if) compiled mmcv ops are missing.

    Returns:
        True when the stand-in is (now or already) in use, False when real mmcv ops are used.
    """
    if compat_layer_active():
        return True
    if compiled_mmcv_ops_available():
        return False
    import mmcv  # mmcv-lite: the package exists, its compiled ops do not

    module = types.ModuleType(_MODULE_NAME, __doc__)
    setattr(module, _MARKER, True)
    module.point_sample = point_sample
    module.sigmoid_focal_loss = sigmoid_focal_loss
    for name in _UNAVAILABLE_OPS:
        setattr(module, name, _unavailable_op(name))
    module.__getattr__ = _missing_name
    module.__all__ = ["point_sample", "sigmoid_focal_loss", *_UNAVAILABLE_OPS]
    sys.modules[_MODULE_NAME] = module
    mmcv.ops = module
    warnings.warn(
        "vmamba2d: mmcv's compiled ops (mmcv._ext) are not installed; using a PyTorch stand-in for "
        "mmcv.ops (point_sample, sigmoid_focal_loss). UperNet/FCN heads need no compiled op; heads "
        "that do (CCNet, PSANet, DCN) raise NotImplementedError.", stacklevel=2)
    return True
