"""NAS-FPN / NAS-FCOS merge cells with mmcv's interface (``mmcv.ops.merge_cells``) in PyTorch.

Part of vmamba2d's stand-in for ``mmcv.ops`` (see :mod:`vmamba2d.openmmlab.mmcv_compat`). A cell
takes two feature maps of equal (N, C), optionally convolves each (``input1_conv``,
``input2_conv``), brings both to one spatial size, merges them (sum, concatenation or global
attention) and optionally applies ``out_conv``. Submodule names match mmcv's, so checkpoints load.

Resizing follows mmcv: sizes are compared as (h, w) tuples; a smaller map is interpolated up
(``upsample_mode``), a larger one is zero-padded (evenly, extra on the bottom / right) to a
multiple of the target and max-pooled down. Without ``out_size`` the larger of the two is used.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from torch import nn


class BaseMergeCell(nn.Module):
    """Two inputs -> optional input convs -> common size -> ``_merge`` -> optional ``out_conv``.

    Args:
        fused_channels: channels entering ``out_conv`` (after the merge).
        out_channels: channels of the inputs and of ``out_conv``'s output.
        with_out_conv: apply ``out_conv`` (a ConvModule built from ``out_conv_cfg``,
            ``out_norm_cfg`` and ``out_conv_order``) after the merge.
        with_input1_conv, with_input2_conv: apply a 3x3 ConvModule (``input_conv_cfg``,
            ``input_norm_cfg``) to the corresponding input first.
        upsample_mode: 'nearest' or 'bilinear', for inputs smaller than the target size.
    """

    def __init__(self, fused_channels: int | None = 256, out_channels: int | None = 256,
                 with_out_conv: bool = True, out_conv_cfg: dict | None = None,
                 out_norm_cfg: dict | None = None,
                 out_conv_order: tuple[str, ...] = ("act", "conv", "norm"),
                 with_input1_conv: bool = False, with_input2_conv: bool = False,
                 input_conv_cfg: dict | None = None, input_norm_cfg: dict | None = None,
                 upsample_mode: str = "nearest"):
        super().__init__()
        if upsample_mode not in ("nearest", "bilinear"):
            raise ValueError(f"{type(self).__name__}: upsample_mode must be 'nearest' or "
                             f"'bilinear', got {upsample_mode!r}")
        if out_conv_cfg is None:
            out_conv_cfg = dict(groups=1, kernel_size=3, padding=1, bias=True)
        self.with_out_conv = with_out_conv
        self.with_input1_conv = with_input1_conv
        self.with_input2_conv = with_input2_conv
        self.upsample_mode = upsample_mode
        if with_out_conv:
            self.out_conv = ConvModule(fused_channels, out_channels, **out_conv_cfg,
                                       norm_cfg=out_norm_cfg, order=out_conv_order)
        self.input1_conv = (self._input_conv(out_channels, input_conv_cfg, input_norm_cfg)
                            if with_input1_conv else nn.Sequential())
        self.input2_conv = (self._input_conv(out_channels, input_conv_cfg, input_norm_cfg)
                            if with_input2_conv else nn.Sequential())

    @staticmethod
    def _input_conv(channels: int, conv_cfg: dict | None, norm_cfg: dict | None) -> ConvModule:
        return ConvModule(channels, channels, 3, padding=1, conv_cfg=conv_cfg, norm_cfg=norm_cfg,
                          bias=True)

    def _merge(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define _merge")

    def _resize(self, x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        current = tuple(x.shape[-2:])
        if current == size:
            return x
        if current < size:
            return F.interpolate(x, size=size, mode=self.upsample_mode)
        target_h, target_w = size
        pad_h = math.ceil(current[0] / target_h) * target_h - current[0]
        pad_w = math.ceil(current[1] / target_w) * target_w - current[1]
        if pad_h or pad_w:
            x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
        kernel = (x.shape[-2] // target_h, x.shape[-1] // target_w)
        return F.max_pool2d(x, kernel_size=kernel, stride=kernel)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor,
                out_size: tuple[int, int] | None = None) -> torch.Tensor:
        """(N, C, H1, W1), (N, C, H2, W2) -> (N, out_channels, *out_size)."""
        if x1.shape[:2] != x2.shape[:2]:
            raise ValueError(f"{type(self).__name__}: inputs must share (N, C), got shapes "
                             f"{tuple(x1.shape)} and {tuple(x2.shape)}")
        if out_size is not None and len(out_size) != 2:
            raise ValueError(f"{type(self).__name__}: out_size must be (h, w), got {out_size!r}")
        size = tuple(out_size) if out_size is not None else max(tuple(x1.shape[2:]),
                                                                 tuple(x2.shape[2:]))
        merged = self._merge(self._resize(self.input1_conv(x1), size),
                             self._resize(self.input2_conv(x2), size))
        return self.out_conv(merged) if self.with_out_conv else merged


class SumCell(BaseMergeCell):
    """``x1 + x2``."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs):
        super().__init__(in_channels, out_channels, **kwargs)

    def _merge(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return x1 + x2


class ConcatCell(BaseMergeCell):
    """``cat([x1, x2], dim=1)`` (``out_conv`` takes ``2 * in_channels``)."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs):
        super().__init__(in_channels * 2, out_channels, **kwargs)

    def _merge(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return torch.cat([x1, x2], dim=1)


class GlobalPoolingCell(BaseMergeCell):
    """``x2 + sigmoid(global_avg_pool(x2)) * x1`` (channel attention from ``x2``)."""

    def __init__(self, in_channels: int | None = None, out_channels: int | None = None,
                 **kwargs):
        super().__init__(in_channels, out_channels, **kwargs)
        self.global_pool = nn.AdaptiveAvgPool2d((1, 1))

    def _merge(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return x2 + self.global_pool(x2).sigmoid() * x1
