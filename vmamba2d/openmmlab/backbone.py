"""2DVMamba / VMamba backbones for OpenMMLab toolkits.

One class serves mmsegmentation and mmdetection: this module imports neither; :mod:`vmamba2d.seg`
registers :class:`VMamba2DBackbone` in mmseg's MODELS registry and :mod:`vmamba2d.det` in mmdet's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import print_log
from mmengine.model import BaseModule
from timm.layers import LayerNorm2d
from torch.nn.modules.batchnorm import _BatchNorm

import vmamba2d  # noqa: F401  (registers the vmamba2d_* / vmamba_* timm models)
from vmamba2d.models.weights import listed_keys

from .complexity import warn_if_scans_untraceable
from .errors import MissingFileError
from .pretrained import classification_weights, load_matching_weights, read_checkpoint, strip_prefix

_INIT_CFG_KEYS = {"type", "checkpoint", "prefix", "trusted"}
_NORM_TYPES = (_BatchNorm, nn.LayerNorm, nn.GroupNorm)  # timm's LayerNorm2d is an nn.LayerNorm


class VMamba2DBackbone(BaseModule):
    """A timm VMamba-family model as a multi-scale backbone for mmseg and mmdet.

    Args:
        model_name: timm model name: ``vmamba2d_{tiny,small,base}`` (2D scan) or
            ``vmamba_{tiny,small,base}`` (1D scan); any timm model with ``forward_intermediates``
            works too.
        out_indices: stages whose outputs are returned.
        drop_path_rate: stochastic depth of the backbone (0.2 for T, 0.3 for S in the recipe).
        with_cp: gradient checkpointing (recompute blocks in backward to save memory).
        out_norm: a LayerNorm2d on every returned stage output (as VMamba's segmentation and
            detection backbones).
        frozen_stages: -1 (default) trains everything; 0 freezes the stem; k >= 1 freezes the stem
            and stages 0..k-1 with their output norms (the ResNet / Swin convention of mmseg and
            mmdet). Frozen modules get ``requires_grad=False`` and stay in eval mode through
            ``train()`` (no stochastic depth in them).
        norm_eval: keep every norm layer in eval mode during training (the mmseg / mmdet
            convention, meant for BatchNorm running statistics). VMamba's norms are LayerNorms,
            which have no running statistics and compute the same in train and eval mode, so for
            VMamba models this changes nothing; it matters only for a timm model with BatchNorm. It
            does not freeze parameters.
        model_kwargs: extra keyword arguments for ``timm.create_model`` (e.g. ``dims``, ``depths``,
            ``scan_backend``).
        pretrained: path of ImageNet weights (ours or official VMamba v2); same as
            ``init_cfg=dict(type='Pretrained', checkpoint=path)``.
        init_cfg: ``dict(type='Pretrained', checkpoint=path, prefix=None, trusted=False)`` or None.
            Loads an ImageNet checkpoint (ours or official VMamba v2) into the timm model, or, with
            ``prefix='backbone.'``, the backbone of a whole segmentor or detector checkpoint
            (``prefix`` keeps the keys that start with it and strips it). As in mmseg / mmdet, keys
            the model lacks or the checkpoint lacks are logged, not raised (e.g.
            ``out_indices=(0, 1, 2)`` with a full checkpoint); shape mismatches and a checkpoint of
            which no key matches are errors. ``trusted`` allows files that
            ``torch.load(weights_only=True)`` refuses.

    Inputs (B, 3, H, W) of any size: they are zero-padded at the bottom/right to a multiple of the
    network stride and every output is cropped back to ceil(H / stride_i) x ceil(W / stride_i).
    Outputs: tuple of (B, C_i, H_i, W_i) for i in ``out_indices``.
    """

    def __init__(
        self,
        model_name: str = "vmamba2d_tiny",
        out_indices: Sequence[int] = (0, 1, 2, 3),
        drop_path_rate: float = 0.0,
        with_cp: bool = False,
        out_norm: bool = True,
        frozen_stages: int = -1,
        norm_eval: bool = False,
        model_kwargs: Optional[Dict[str, Any]] = None,
        pretrained: Optional[str] = None,
        init_cfg: Optional[Dict[str, Any]] = None,
    ) -> None:
        if pretrained is not None and init_cfg is not None:
            raise ValueError("pass the backbone weights either as pretrained=path or as init_cfg, not both")
        if pretrained is not None:
            if not isinstance(pretrained, str):
                raise TypeError(f"pretrained must be a checkpoint path (str), got {type(pretrained).__name__}")
            init_cfg = dict(type="Pretrained", checkpoint=pretrained)
        if init_cfg is not None and (not isinstance(init_cfg, dict) or init_cfg.get("type") != "Pretrained"
                                     or not isinstance(init_cfg.get("checkpoint"), str)
                                     or not isinstance(init_cfg.get("prefix") or "", str)
                                     or set(init_cfg) - _INIT_CFG_KEYS):
            raise ValueError("init_cfg must be dict(type='Pretrained', checkpoint=<path>[, prefix=str, "
                             f"trusted=bool]), got {init_cfg!r}")
        if not isinstance(norm_eval, bool):
            raise TypeError(f"norm_eval must be a bool, got {norm_eval!r}")
        super().__init__(init_cfg=init_cfg)
        if not isinstance(model_name, str) or not timm.is_model(model_name):
            known = ", ".join(timm.list_models("vmamba*"))
            raise ValueError(f"model_name must be a timm model name (e.g. {known}), got {model_name!r}")
        if isinstance(out_indices, int) or not all(isinstance(i, int) for i in out_indices) or not out_indices:
            raise TypeError(f"out_indices must be a non-empty sequence of stage indices, got {out_indices!r}")
        if not isinstance(drop_path_rate, (int, float)) or not 0.0 <= drop_path_rate < 1.0:
            raise ValueError(f"drop_path_rate must be a float in [0, 1), got {drop_path_rate!r}")
        model_kwargs = dict(model_kwargs or {})
        reserved = {"pretrained", "num_classes", "features_only", "drop_path_rate"} & set(model_kwargs)
        if reserved:
            raise ValueError(f"model_kwargs may not set {sorted(reserved)} (they are backbone arguments)")

        model = timm.create_model(model_name, pretrained=False, num_classes=0,
                                  drop_path_rate=float(drop_path_rate), **model_kwargs)
        if not hasattr(model, "forward_intermediates"):
            raise ValueError(f"timm model {model_name!r} has no forward_intermediates(); it cannot be a backbone here")
        feature_info = list(model.feature_info)
        num_stages = len(feature_info)
        bad = [i for i in out_indices if not 0 <= i < num_stages]
        if bad or len(set(out_indices)) != len(out_indices):
            raise ValueError(f"out_indices must be distinct stage indices in [0, {num_stages}), got {tuple(out_indices)}")
        self.out_indices = tuple(sorted(out_indices))
        self.size_divisor = max(info["reduction"] for info in feature_info)
        self.strides = tuple(feature_info[i]["reduction"] for i in self.out_indices)
        self.out_channels = tuple(feature_info[i]["num_chs"] for i in self.out_indices)
        # Drop the classifier, final norm and unused trailing stages: every parameter gets a gradient
        # (DistributedDataParallel without find_unused_parameters).
        model.prune_intermediate_layers(list(self.out_indices), prune_norm=True, prune_head=True)
        if with_cp:
            model.set_grad_checkpointing(True)
        self.model_name = model_name
        self.model = model
        self.out_norms = nn.ModuleList(
            LayerNorm2d(c) if out_norm else nn.Identity() for c in self.out_channels
        )
        self.norm_eval = norm_eval
        built = len(getattr(self.model, "stages", ()))
        if isinstance(frozen_stages, bool) or not isinstance(frozen_stages, int) or not -1 <= frozen_stages <= built:
            raise ValueError(f"frozen_stages must be an int in [-1, {built}] (-1: none, 0: the stem, k: the stem "
                             f"and the first k of the {built} stages built for out_indices={self.out_indices}), "
                             f"got {frozen_stages!r}")
        if frozen_stages >= 0 and not hasattr(self.model, "stem"):
            raise ValueError(f"frozen_stages needs a timm model with .stem and .stages; {model_name} has no .stem")
        self.frozen_stages = frozen_stages
        for module in self._frozen_modules():
            module.requires_grad_(False)
        self.train()

    def _frozen_modules(self) -> List[nn.Module]:
        """The stem, stages 0..frozen_stages-1 and their output norms (empty for frozen_stages=-1)."""
        if self.frozen_stages < 0:
            return []
        modules = [self.model.stem]
        for stage in range(self.frozen_stages):
            modules.append(self.model.stages[stage])
            if stage in self.out_indices:
                modules.append(self.out_norms[self.out_indices.index(stage)])
        return modules

    def train(self, mode: bool = True) -> "VMamba2DBackbone":
        """Set train / eval mode; frozen stages (and with ``norm_eval`` every norm) stay in eval mode."""
        super().train(mode)
        if mode:
            for module in self._frozen_modules():
                module.eval()
            if self.norm_eval:
                for module in self.modules():
                    if isinstance(module, _NORM_TYPES):
                        module.eval()
        return self

    def forward(self, x: torch.Tensor) -> tuple:
        """(B, 3, H, W) -> tuple of (B, C_i, ceil(H / s_i), ceil(W / s_i)) for the out_indices."""
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"backbone input must be a (B, C, H, W) tensor, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if torch.jit.is_tracing():
            warn_if_scans_untraceable(self, x)
        height, width = x.shape[-2:]
        pad_h = -height % self.size_divisor
        pad_w = -width % self.size_divisor
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        features = self.model.forward_intermediates(x, indices=list(self.out_indices), intermediates_only=True)
        outputs = []
        for feature, norm, stride in zip(features, self.out_norms, self.strides):
            feature = feature[..., : -(-height // stride), : -(-width // stride)]
            outputs.append(norm(feature))
        return tuple(outputs)

    def init_weights(self) -> None:
        """Load the ``init_cfg`` checkpoint (see the class docstring); log missing / unexpected keys."""
        if self.init_cfg is None:
            super().init_weights()
            return
        path = self.init_cfg["checkpoint"]
        prefix = self.init_cfg.get("prefix")
        if not Path(path).expanduser().is_file():
            raise MissingFileError(
                f"{type(self).__name__}: init_cfg checkpoint {path} not found. Put the ImageNet-1K weights "
                "there, point to them with --cfg-options model.backbone.init_cfg.checkpoint=PATH, or train "
                "the backbone from scratch with --cfg-options model.backbone.init_cfg=None "
                "(seg/train.py, det/train.py: --from-scratch).")
        state_dict = read_checkpoint(path, trusted=bool(self.init_cfg.get("trusted", False)))
        source = f"{path}" + (f" (prefix {prefix!r})" if prefix else "")
        if prefix:
            state_dict = strip_prefix(state_dict, prefix, str(path))
        if any(key.startswith("model.") for key in state_dict):  # this class's own layout
            missing, unexpected = load_matching_weights(self, state_dict, source)
        else:  # an ImageNet classification checkpoint of the timm model
            missing, unexpected = load_matching_weights(self.model, classification_weights(state_dict), source)
        message = f"{type(self).__name__} ({self.model_name}): loaded {source}"
        if missing:
            message += f"\n  missing keys ({len(missing)}): {listed_keys(missing)}"
        if unexpected:
            message += f"\n  unexpected keys ({len(unexpected)}): {listed_keys(unexpected)}"
            built = len(self.model.stages) if hasattr(self.model, "stages") else None
            if built is not None and any(key.removeprefix("model.").startswith(f"stages.{built}.")
                                         for key in unexpected):
                message += f" (stages {built}+ are not built for out_indices={self.out_indices})"
        print_log(message, logger="current", level=30 if missing or unexpected else 20)
        self._is_init = True
