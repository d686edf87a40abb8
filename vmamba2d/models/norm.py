"""LayerNorm over the channels of NCHW maps that keeps the map's dtype under autocast."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

Tensor = torch.Tensor

__all__ = ["LayerNorm2d"]


def _layer_norm_channels(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm over dim 1 of x (B, C, H, W), in x's dtype (statistics in fp32 for half types):
    the channels-last permutation is a view for channels-last maps (no copy)."""
    shape = [x.shape[1]]
    return F.layer_norm(x.permute(0, 2, 3, 1), shape, weight, bias, eps).permute(0, 3, 1, 2)


def layer_norm_2d(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm over dim 1 of x (B, C, H, W), returned in x's dtype also under autocast.

    A plain function so that FX symbolic tracing records it as one call (``torch.fx.wrap`` below);
    TorchScript compiles the plain path (it has no autocast).
    """
    if torch.jit.is_scripting():
        return _layer_norm_channels(x, weight, bias, eps)
    return _layer_norm_outside_autocast(x, weight, bias, eps)


torch.fx.wrap("layer_norm_2d")


@torch.jit.unused
def _layer_norm_outside_autocast(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """:func:`_layer_norm_channels` with autocast off when it is on: autocast's policy would run
    layer_norm in fp32 and return fp32 (a cast of the map in, and a map twice as wide out, which
    every following convolution casts back)."""
    if not torch.is_autocast_enabled(x.device.type):
        return _layer_norm_channels(x, weight, bias, eps)
    with torch.autocast(x.device.type, enabled=False):
        return _layer_norm_channels(x, weight.to(x.dtype), bias.to(x.dtype), eps)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of each pixel of (B, C, H, W) maps: timm's ``LayerNorm2d``
    (same parameters, state_dict keys and results) outside autocast. Under autocast it returns
    the input's dtype: for bf16 / fp16 maps the kernel computes the statistics and the
    normalisation in fp32 and rounds once on the way out, with the weight and bias in the map's
    dtype (C elements each). So a bf16 residual stream stays bf16 and the convolutions that read
    the norm's output need no cast of their input.
    """

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, C, H, W) in x's dtype."""
        return layer_norm_2d(x, self.weight, self.bias, self.eps)
