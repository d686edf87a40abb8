"""CornerNet's corner pooling with mmcv's interface (``mmcv.ops.CornerPool``) in PyTorch.

Part of vmamba2d's stand-in for ``mmcv.ops`` (see :mod:`vmamba2d.openmmlab.mmcv_compat`).
"""
from __future__ import annotations

import torch
from torch import nn


class CornerPool(nn.Module):
    """Running maximum of a feature map towards one side (mmcv.ops.CornerPool).

    Output (n, c, i, j) is the maximum of the input over rows ``i..H-1`` of column j for 'top',
    rows ``0..i`` for 'bottom', columns ``j..W-1`` of row i for 'left', columns ``0..j`` for
    'right'.

    Args:
        mode: 'top', 'bottom', 'left' or 'right'.
    """

    _DIM_AND_FLIP = {"top": (2, True), "bottom": (2, False), "left": (3, True), "right": (3, False)}

    def __init__(self, mode: str):
        super().__init__()
        if mode not in self._DIM_AND_FLIP:
            raise ValueError(f"CornerPool: mode must be one of {sorted(self._DIM_AND_FLIP)}, got "
                             f"{mode!r}")
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, C, H, W)."""
        dim, flip = self._DIM_AND_FLIP[self.mode]
        if flip:
            return torch.cummax(x.flip(dim), dim=dim).values.flip(dim)
        return torch.cummax(x, dim=dim).values

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"
