"""2DMambaMIL (:class:`MambaMIL2D`): the slide's patches on their grid, Mamba blocks with the 2D
selective scan over it, attention pooling and a head (docs/mil.md#model)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .base import cell_index, check_slide_inputs, require_choice, require_distinct
from .mamba import SSMMIL

Tensor = torch.Tensor

PAD_TOKENS = ("trainable", "zero")
SCANS = ("2d", "raster")


class MambaMIL2D(SSMMIL):
    """2DMambaMIL: Mamba blocks with the 2D selective scan over the slide's grid (docs/mil.md#model).

    Args:
        in_dim: feature size F of the patch features.
        num_classes: classes (classification) or time bins K (``survival=True``).
        dim: model width D (128). d_state: SSM states N (16). expand: mixer width E = expand * D (2).
        d_conv: kernel of the ``conv="1d"`` causal conv (4).
        num_blocks: number of Mamba blocks U >= 1 (1).
        dropout: dropout after the input projection (0.25).
        conv: ``"1d"`` causal conv along the raster sequence (official) or ``"2d"`` depthwise 3x3 on the grid.
        mask_pad: attention pooling ignores pad cells (True) or covers the whole canvas (False = official).
        pad_token: ``"trainable"`` (U[0,1) init, learned; official default) or ``"zero"`` (fixed zeros).
        scan: ``"2d"`` (the 2D selective scan over the H x W canvas) or ``"raster"`` (the same blocks
            on the row-major canvas as one 1 x H*W sequence, pad cells included: the 1D reference of
            docs/mil.md#the-1d-reference; needs ``conv="1d"``).
        attn_hidden: hidden size of the attention pooling (128).
        init: ``"official"`` (Xavier-normal Linear weights, zero biases, so dt bias = 0) or ``"mamba"``
            (PyTorch default Linear init and Mamba's dt bias init).
        survival: add hazards / survival / risk outputs.
        scan_backend: backend of ``selective_scan_2d`` (``"auto"``, ``"cpu"``, ``"cuda"``, ``"torch"``, ...).
    """

    model_name = "mambamil2d"

    def __init__(self, *, in_dim: int, num_classes: int, dim: int = 128, d_state: int = 16, expand: int = 2,
                 d_conv: int = 4, num_blocks: int = 1, dropout: float = 0.25, conv: str = "1d", mask_pad: bool = True,
                 pad_token: str = "trainable", scan: str = "2d", attn_hidden: int = 128, init: str = "official",
                 survival: bool = False, scan_backend: str = "auto") -> None:
        super().__init__(in_dim, num_classes, dim=dim, d_state=d_state, expand=expand, d_conv=d_conv,
                         num_blocks=num_blocks, dropout=dropout, conv=conv, attn_hidden=attn_hidden, init=init,
                         survival=survival, scan_backend=scan_backend)
        require_choice("pad_token", pad_token, PAD_TOKENS)
        self.scan = require_choice("scan", scan, SCANS)
        if scan == "raster" and conv != "1d":
            raise ValueError(f"scan='raster' runs the blocks on a 1 x L sequence and needs conv='1d', "
                             f"got conv={conv!r}")
        self.mask_pad = mask_pad
        if pad_token == "trainable":
            self.pad_token = nn.Parameter(torch.rand(dim))
        else:
            self.register_buffer("pad_token", torch.zeros(dim))
        self._config.update(mask_pad=mask_pad, pad_token=pad_token, scan=scan)
        self._apply_init(init)

    def encode(self, features: Tensor, coords: Tensor,
               grid_size: Optional[tuple[int, int]] = None) -> tuple[Tensor, Tensor, tuple[int, int]]:
        """Canvas tokens after the blocks and the final norm.

        features (n, in_dim), coords (n, 2) -> (tokens (H*W, dim) row-major, tissue (H*W,) bool, (H, W)).
        """
        grid = check_slide_inputs(features, coords, self.in_dim, grid_size)
        index = cell_index(coords, grid[1])
        require_distinct(index)
        projected = self.proj(features)
        canvas = self.pad_token.to(projected.dtype).expand(grid[0] * grid[1], -1).index_copy(0, index, projected)
        tissue = torch.zeros(canvas.shape[0], dtype=torch.bool, device=canvas.device)
        tissue[index] = True
        shape = (1, grid[0] * grid[1]) if self.scan == "raster" else grid
        return self._mix(canvas, *shape), tissue, grid

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) grid (x, y) -> dict (see :mod:`vmamba2d.mil.models`)."""
        tokens, tissue, grid = self.encode(features, coords, grid_size)
        embedding, weights, scores = self.pool(tokens, tissue if self.mask_pad else None)
        return self._outputs(embedding, weights, scores, grid)
