"""2DMambaMIL and its baselines for whole-slide-image classification / survival (docs/mil.md).

Every model shares one API (batch of one slide):

    model = build_model("mambamil2d", in_dim=1024, num_classes=3)   # or MambaMIL2D(...), ...
    out = model(features, coords)                           # features (n, in_dim), coords (n, 2)
    out["logits"]     (1, num_classes)
    out["attention"]  (H, W) softmax attention of each grid cell (models with an attention score)

``coords`` are integer grid positions (x = column, y = row), as ``vmamba2d.mil.data`` produces
them; the grid is ``H = max row + 1`` by ``W = max col + 1`` unless ``grid_size=(H, W)`` is passed
(absolute placement on a fixed canvas, docs/mil.md#fixed-canvas). The models never crop.

Models (``MODELS``, by name):
    ``mambamil2d``  ``MambaMIL2D``: input projection -> slide canvas filled with a pad token ->
                    ``num_blocks`` x [RMSNorm -> Mamba mixer whose scan is ``selective_scan_2d``
                    over the H x W grid, residual] -> LayerNorm -> attention pooling -> head.
    ``mambamil``    ``MambaMIL``: the same mixer on a 1D sequence of the slide's tissue tokens (our
                    scan on a 1 x n map, no pad cells). ``order="raster"`` (default) sorts the
                    tokens row-major by grid position, so the model is invariant to the file's row
                    order and equals MambaMIL2D on fully occupied 1 x W / H x 1 grids;
                    ``order="file"`` keeps the file's row order, as the official baseline does.
    ``abmil``       ``ABMIL``: input projection -> attention pooling -> head (no sequence mixing).
    ``clam_sb``, ``dsmil``, ``transmil``, ``s4mil``, ``mambamil_sr``, ``dtfdmil``: the paper's other
                    baselines (``vmamba2d.mil.baselines``).

Outputs besides ``logits``: ``embedding`` (1, dim) pooled slide vector, ``probabilities`` (1, C)
softmax; with ``survival=True`` instead ``hazards`` (1, K) = sigmoid(logits), ``survival`` (1, K)
= cumprod(1 - hazards) and ``risk`` (1,) = -sum(survival), K = num_classes time bins (docs/mil.md:
survival, survival head size). Models with a per-instance attention score (``has_attention``)
also return ``attention`` (H, W) and ``attention_scores`` (H, W) pre-softmax scores (0 on cells
without a patch, excluded from the softmax).

Training losses: ``model.loss_weights`` names the loss terms and their default weights; the term
``"slide"`` is the task loss of ``logits``, the others come from
``model.auxiliary_losses(output, label, task_loss)`` (CLAM's instance loss, DSMIL's max-instance
loss). ``vmamba2d.mil.engine`` adds them up; ``mil/train.py --loss-weights`` overrides weights.

``build_model(name, **kwargs)`` / ``model.config`` / ``model_from_checkpoint(path)`` let scripts
save and rebuild a model: a checkpoint is a dict holding ``"model"`` (state dict) and
``"model_config"`` (= ``model.config``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import selective_scan_2d

Tensor = torch.Tensor

CONV_KINDS = ("1d", "2d")
PAD_TOKENS = ("trainable", "zero")
SCANS = ("2d", "raster")
INITS = ("official", "mamba")
BASELINE_INITS = ("torch", "xavier")
ORDERS = ("raster", "file")
ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


def _require_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def _require_positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_slide_inputs(
    features: Tensor, coords: Tensor, in_dim: int, grid_size: Optional[tuple[int, int]]
) -> tuple[int, int]:
    """Validate one slide's inputs; return the grid ``(H, W)``.

    Expected: ``features`` (n, in_dim) floating point with n >= 1 and finite values; ``coords``
    (n, 2) integer (x = column, y = row), non-negative, distinct, on the features' device;
    ``grid_size`` None (H = max row + 1, W = max col + 1) or an (H, W) covering every coordinate.
    """
    if not isinstance(features, torch.Tensor) or not features.is_floating_point():
        raise TypeError(f"features must be a floating-point tensor (n, {in_dim}), got {type(features).__name__}"
                        + (f" of dtype {features.dtype}" if isinstance(features, torch.Tensor) else ""))
    if features.dim() != 2 or features.shape[1] != in_dim:
        raise ValueError(f"features must have shape (n, in_dim={in_dim}), got {tuple(features.shape)}")
    if features.shape[0] == 0:
        raise ValueError("features is empty (n = 0): a slide needs at least one patch")
    if not isinstance(coords, torch.Tensor) or coords.is_floating_point() or coords.is_complex() or coords.dtype == torch.bool:
        raise TypeError("coords must be an integer tensor (n, 2) of grid positions (x = column, y = row), got "
                        + (str(coords.dtype) if isinstance(coords, torch.Tensor) else type(coords).__name__))
    if coords.shape != (features.shape[0], 2):
        raise ValueError(f"coords must have shape (n, 2) = ({features.shape[0]}, 2) to match features, got {tuple(coords.shape)}")
    if coords.device != features.device:
        raise ValueError(f"coords is on {coords.device} but features is on {features.device}")
    if torch.compiler.is_exporting():
        return _exported_grid(coords, grid_size)
    if bool((coords < 0).any()):
        raise ValueError("coords must be non-negative grid positions (the data layer shifts them to the tissue bounding box)")
    needed = (int(coords[:, 1].max()) + 1, int(coords[:, 0].max()) + 1)
    if grid_size is None:
        return needed
    height, width = int(grid_size[0]), int(grid_size[1])
    if height < needed[0] or width < needed[1]:
        raise ValueError(f"grid_size={tuple(grid_size)} does not cover the coords: they need at least (H, W) = {needed}")
    return height, width


def _exported_grid(coords: Tensor, grid_size: Optional[tuple[int, int]]) -> tuple[int, int]:
    """The grid ``(H, W)`` while ``torch.export`` (ONNX export) traces a model.

    The value checks of :func:`check_slide_inputs` (non-negative, distinct coords inside
    ``grid_size``) depend on the data, and an exported graph has no assertions: the exported model
    takes its coords as valid, like those the data layer writes. Without ``grid_size`` the grid is
    read from the coords at run time (symbolic sizes).
    """
    if grid_size is not None:
        return int(grid_size[0]), int(grid_size[1])
    height = coords[:, 1].max().item() + 1
    width = coords[:, 0].max().item() + 1
    torch._check(height >= 1)  # lets the tracer reason about sizes built from H and W
    torch._check(width >= 1)
    return height, width


def cell_index(coords: Tensor, width: int) -> Tensor:
    """Row-major cell index ``row * width + col`` of each (x, y) grid position: (n, 2) -> (n,)."""
    return coords[:, 1].long() * width + coords[:, 0].long()


def _cumprod(x: Tensor) -> Tensor:
    """``torch.cumprod(x, dim=1)`` of (1, K); while ``torch.export`` traces, as K - 1 products in the
    same order (torch 2.14's ONNX exporter has no translation for cumprod)."""
    if not torch.compiler.is_exporting():
        return torch.cumprod(x, dim=1)
    columns = [x[:, :1]]
    for k in range(1, x.shape[1]):
        columns.append(columns[-1] * x[:, k : k + 1])
    return torch.cat(columns, dim=1)


def _require_distinct(index: Tensor) -> None:
    if torch.compiler.is_exporting():  # a value check: see _exported_grid
        return
    if index.numel() != torch.unique(index).numel():
        raise ValueError("coords contain duplicate grid positions: every patch needs its own cell")


class RMSNorm(nn.Module):
    """Root-mean-square norm with a weight and no bias: (..., dim) -> (..., dim)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * scale * self.weight


class MambaMixer(nn.Module):
    """Mamba's mixer with the 2D selective scan over a height x width grid (docs/mil.md#model).

    ``conv="1d"``: causal depthwise Conv1d (kernel ``d_conv``) along the row-major sequence, as the
    official model; ``conv="2d"``: depthwise 3 x 3 Conv2d on the grid (sees the cells below and to
    the right, so the block is no longer causal on the grid).
    """

    def __init__(self, dim: int, d_state: int = 16, expand: int = 2, d_conv: int = 4, conv: str = "1d",
                 scan_backend: str = "auto") -> None:
        super().__init__()
        self.conv_kind = _require_choice("conv", conv, CONV_KINDS)
        self.scan_backend = scan_backend
        inner = expand * dim
        self.d_state = d_state
        self.dt_rank = math.ceil(dim / 16)
        self.in_proj = nn.Linear(dim, 2 * inner, bias=False)
        if conv == "1d":
            self.conv = nn.Conv1d(inner, inner, d_conv, groups=inner, padding=d_conv - 1)
        else:
            self.conv = nn.Conv2d(inner, inner, 3, groups=inner, padding=1)
        self.x_proj = nn.Linear(inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, inner)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, dim, bias=False)

    def _conv(self, conv: nn.Module, u: Tensor, height: int, width: int) -> Tensor:
        """(E, L) -> (E, L) depthwise convolution ``conv`` on the raster sequence or on the grid."""
        length = u.shape[1]
        if self.conv_kind == "2d":
            return conv(u.view(1, -1, height, width))[0].reshape(-1, length)
        # Causal depthwise Conv1d as a sum of shifted products: same result as conv(u)[..., :L],
        # many times faster on CPU than the depthwise convolution kernel for one long sequence.
        taps = conv.weight.shape[-1]
        padded = F.pad(u, (taps - 1, 0))
        out = conv.bias.unsqueeze(1).to(u.dtype)
        for k in range(taps):
            out = out + conv.weight[:, 0, k : k + 1] * padded[:, k : k + length]
        return out

    def _branch(self, u: Tensor, z: Tensor, height: int, width: int, conv: nn.Module, x_proj: nn.Linear,
                dt_proj: nn.Linear, A_log: Tensor, D: Tensor) -> Tensor:
        """One selective-scan branch: u, z (E, L) after in_proj -> gated y * SiLU(z) (E, L)."""
        u = F.silu(self._conv(conv, u, height, width))
        dt, B, C = x_proj(u.t()).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.linear(dt, dt_proj.weight).t()  # (E, L), bias applied inside the scan
        scan_dtype = torch.promote_types(u.dtype, torch.float32)
        y = selective_scan_2d(
            u.unsqueeze(0), delta.unsqueeze(0),
            -torch.exp(A_log.to(scan_dtype)),
            B.t()[None, None], C.t()[None, None],
            D.to(scan_dtype), dt_proj.bias.to(scan_dtype), True,
            height=height, width=width, backend=self.scan_backend,
        )[0]
        return y * F.silu(z)

    def forward(self, x: Tensor, height: int, width: int) -> Tensor:
        """x (L, dim) tokens in row-major order of a height x width grid -> (L, dim)."""
        u, z = self.in_proj(x).t().chunk(2, dim=0)  # (E, L) each
        y = self._branch(u, z, height, width, self.conv, self.x_proj, self.dt_proj, self.A_log, self.D)
        return self.out_proj(y.t())


class MambaBlock(nn.Module):
    """Pre-norm residual block: x + mixer(RMSNorm(x)); (L, dim) -> (L, dim)."""

    def __init__(self, dim: int, **mixer_options: Any) -> None:
        super().__init__()
        self.norm = RMSNorm(dim)
        self.mixer = MambaMixer(dim, **mixer_options)

    def forward(self, x: Tensor, height: int, width: int) -> Tensor:
        return x + self.mixer(self.norm(x), height, width)


class AttentionPool(nn.Module):
    """Attention pooling: score = w2 . tanh(W1 t); softmax over the kept tokens; sum of a * t."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(dim, hidden)
        self.score = nn.Linear(hidden, 1)

    def forward(self, tokens: Tensor, keep: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (L, dim), keep (L,) bool or None (all) -> (embedding (1, dim), weights (L,), scores (L,))."""
        scores = self.score(torch.tanh(self.hidden(tokens))).squeeze(-1)
        masked = scores if keep is None else scores.masked_fill(~keep, float("-inf"))
        weights = torch.softmax(masked, dim=0)
        return (weights.unsqueeze(0) @ tokens), weights, scores


def _require_dropout(name: str, value: float) -> float:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return value


def _activation(act: str) -> nn.Module:
    return ACTIVATIONS[_require_choice("act", act, tuple(ACTIVATIONS))]()


TaskLoss = Callable[[Tensor], Tensor]


class _MILModel(nn.Module):
    """What every MIL model shares: sizes, the classification / survival outputs, the loss terms,
    the config and the Xavier init.

    Class attributes: ``has_attention`` (returns an (H, W) ``attention`` map),
    ``permutation_invariant`` (the output does not depend on the order or the grid positions of
    the patches: a bag model), ``default_loss_weights`` (loss term -> weight; ``"slide"`` = the
    task loss of ``logits``).
    """

    model_name = ""
    has_attention = True
    permutation_invariant = False
    default_loss_weights: dict[str, float] = {"slide": 1.0}

    def __init__(self, in_dim: int, num_classes: int, survival: bool) -> None:
        super().__init__()
        self.in_dim = _require_positive("in_dim", in_dim)
        self.num_classes = _require_positive("num_classes", num_classes)
        self.survival = survival
        self._config: dict[str, Any] = {}

    @property
    def config(self) -> dict[str, Any]:
        """Constructor keywords plus ``"name"``: ``build_model(**model.config)`` rebuilds the model."""
        return {"name": self.model_name, **self._config}

    @property
    def loss_weights(self) -> dict[str, float]:
        """Default weight of each loss term this model trains with (a copy)."""
        return dict(self.default_loss_weights)

    def auxiliary_losses(self, output: dict[str, Tensor], label: int, task_loss: TaskLoss) -> dict[str, Tensor]:
        """Loss terms besides ``"slide"`` for one slide of class / time bin ``label``.

        ``output`` is this model's forward output; ``task_loss`` maps (1, C) logits to the task's
        loss (cross-entropy or the survival NLL) for this slide. Returns term name -> scalar.
        """
        return {}

    def head_outputs(self, logits: Tensor, **extra: Tensor) -> dict[str, Tensor]:
        """``logits`` (1, C) -> dict with ``logits``, ``extra`` and ``probabilities`` (classification)
        or ``hazards`` / ``survival`` / ``risk`` (survival)."""
        out = {"logits": logits, **extra}
        if self.survival:
            hazards = torch.sigmoid(logits)
            surv = _cumprod(1 - hazards)
            out.update(hazards=hazards, survival=surv, risk=-surv.sum(dim=1))
        else:
            out["probabilities"] = torch.softmax(logits, dim=1)
        return out

    def _init_xavier(self) -> None:
        """Xavier-normal weights and zero biases for every Linear; LayerNorm (1, 0)
        (docs/mil.md#initialisation)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)


class _AttentionMIL(_MILModel):
    """Input projection (Linear -> activation -> dropout), attention pooling and a linear head."""

    def __init__(self, in_dim: int, num_classes: int, dim: int, dropout: float, attn_hidden: int,
                 survival: bool, act: str = "gelu", pool: Optional[nn.Module] = None) -> None:
        super().__init__(in_dim, num_classes, survival)
        _require_positive("dim", dim)
        _require_positive("attn_hidden", attn_hidden)
        self.proj = nn.Sequential(nn.Linear(in_dim, dim), _activation(act), nn.Dropout(_require_dropout("dropout", dropout)))
        self.pool = AttentionPool(dim, attn_hidden) if pool is None else pool
        self.classifier = nn.Linear(dim, num_classes)

    def _outputs(self, embedding: Tensor, weights: Tensor, scores: Tensor, grid: tuple[int, int]) -> dict[str, Tensor]:
        return self.head_outputs(self.classifier(embedding), attention=weights.view(grid),
                                 attention_scores=scores.view(grid), embedding=embedding)


def _init_mamba_dt(dt_proj: nn.Linear, dt_rank: int, dt_min: float = 1e-3, dt_max: float = 1e-1,
                   floor: float = 1e-4) -> None:
    """Mamba's dt_proj init: weight U(+-rank^-0.5); bias = softplus^-1 of log-uniform dt in [dt_min, dt_max]."""
    bound = dt_rank ** -0.5
    nn.init.uniform_(dt_proj.weight, -bound, bound)
    inner = dt_proj.bias.numel()
    dt = torch.exp(torch.rand(inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
    with torch.no_grad():
        dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))


class _SSMMIL(_AttentionMIL):
    """Projection, U Mamba blocks, final LayerNorm, attention pooling and head."""

    def __init__(self, in_dim: int, num_classes: int, *, dim: int, d_state: int, expand: int, d_conv: int,
                 num_blocks: int, dropout: float, conv: str, attn_hidden: int, init: str, survival: bool,
                 scan_backend: str) -> None:
        super().__init__(in_dim, num_classes, dim, dropout, attn_hidden, survival)
        _require_positive("num_blocks", num_blocks)
        _require_positive("d_state", d_state)
        _require_positive("expand", expand)
        _require_choice("init", init, INITS)
        self.blocks = nn.ModuleList(
            MambaBlock(dim, d_state=d_state, expand=expand, d_conv=d_conv, conv=conv, scan_backend=scan_backend)
            for _ in range(num_blocks)
        )
        self.norm = nn.LayerNorm(dim)
        self._config = dict(in_dim=in_dim, num_classes=num_classes, dim=dim, d_state=d_state, expand=expand,
                            d_conv=d_conv, num_blocks=num_blocks, dropout=dropout, conv=conv,
                            attn_hidden=attn_hidden, init=init, survival=survival, scan_backend=scan_backend)

    def _apply_init(self, init: str) -> None:
        if init == "official":
            self._init_xavier()
        else:
            for block in self.blocks:
                _init_mamba_dt(block.mixer.dt_proj, block.mixer.dt_rank)

    def _mix(self, tokens: Tensor, height: int, width: int) -> Tensor:
        """(L, dim) tokens in row-major order of a height x width grid -> normalised (L, dim)."""
        for block in self.blocks:
            tokens = block(tokens, height, width)
        return self.norm(tokens)


class MambaMIL2D(_SSMMIL):
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
        _require_choice("pad_token", pad_token, PAD_TOKENS)
        self.scan = _require_choice("scan", scan, SCANS)
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
        _require_distinct(index)
        projected = self.proj(features)
        canvas = self.pad_token.to(projected.dtype).expand(grid[0] * grid[1], -1).index_copy(0, index, projected)
        tissue = torch.zeros(canvas.shape[0], dtype=torch.bool, device=canvas.device)
        tissue[index] = True
        shape = (1, grid[0] * grid[1]) if self.scan == "raster" else grid
        return self._mix(canvas, *shape), tissue, grid

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) grid (x, y) -> dict (see the module docstring)."""
        tokens, tissue, grid = self.encode(features, coords, grid_size)
        embedding, weights, scores = self.pool(tokens, tissue if self.mask_pad else None)
        return self._outputs(embedding, weights, scores, grid)


def scatter_to_grid(values: Tensor, index: Tensor, grid: tuple[int, int]) -> Tensor:
    """(n,) values at row-major cells ``index`` -> (H, W) map, 0 elsewhere."""
    flat = values.new_zeros(grid[0] * grid[1]).index_copy(0, index, values)
    return flat.view(grid)


def ordered_instances(features: Tensor, coords: Tensor, grid_size: Optional[tuple[int, int]], in_dim: int,
                      order: str) -> tuple[Tensor, Tensor, tuple[int, int]]:
    """Check one slide and put its patches in sequence order.

    features (n, in_dim), coords (n, 2) -> (features (n, in_dim) in ``order``: ``"raster"`` =
    row-major by grid cell, ``"file"`` = as given; their row-major cell index (n,); grid (H, W)).
    """
    grid = check_slide_inputs(features, coords, in_dim, grid_size)
    index = cell_index(coords, grid[1])
    _require_distinct(index)
    if order == "raster":
        index, perm = torch.sort(index)
        features = features[perm]
    return features, index, grid


class _TokenMIL(_AttentionMIL):
    """Models of the tissue tokens only (no pad cells); attention scattered back onto the grid."""

    def _tokens(self, features: Tensor, coords: Tensor, grid_size: Optional[tuple[int, int]],
                order: str) -> tuple[Tensor, Tensor, tuple[int, int]]:
        features, index, grid = ordered_instances(features, coords, grid_size, self.in_dim, order)
        return self.proj(features), index, grid

    def _finish(self, tokens: Tensor, index: Tensor, grid: tuple[int, int]) -> dict[str, Tensor]:
        embedding, weights, scores = self.pool(tokens)
        return self._outputs(embedding, scatter_to_grid(weights, index, grid).flatten(),
                             scatter_to_grid(scores, index, grid).flatten(), grid)


class MambaMIL(_TokenMIL, _SSMMIL):
    """1D MambaMIL baseline: the MambaMIL2D block (same options and parameters except the pad token)
    run on the slide's tissue tokens as a 1 x n sequence.

    Args: as ``MambaMIL2D`` (no ``mask_pad`` / ``pad_token``: there are no pad cells), plus
        order: ``"raster"`` (tokens sorted row-major by grid position; default) or ``"file"`` (the
            file's row order, as the official baseline; then the output depends on the row order).
    ``conv="2d"`` is not available (the sequence has no grid).
    """

    model_name = "mambamil"

    def __init__(self, *, in_dim: int, num_classes: int, dim: int = 128, d_state: int = 16, expand: int = 2,
                 d_conv: int = 4, num_blocks: int = 1, dropout: float = 0.25, order: str = "raster",
                 attn_hidden: int = 128, init: str = "official", survival: bool = False,
                 scan_backend: str = "auto") -> None:
        _SSMMIL.__init__(self, in_dim, num_classes, dim=dim, d_state=d_state, expand=expand, d_conv=d_conv,
                         num_blocks=num_blocks, dropout=dropout, conv="1d", attn_hidden=attn_hidden, init=init,
                         survival=survival, scan_backend=scan_backend)
        self.order = _require_choice("order", order, ORDERS)
        del self._config["conv"]
        self._config["order"] = order
        self._apply_init(init)

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) grid (x, y) -> dict (see the module docstring)."""
        tokens, index, grid = self._tokens(features, coords, grid_size, self.order)
        return self._finish(self._mix(tokens, 1, tokens.shape[0]), index, grid)


class ABMIL(_TokenMIL):
    """Attention-based MIL (bag model): projection -> attention pooling -> head; no token mixing.

    Defaults = the official 2DMamba repository's ``DAttention`` (``act='relu'``): Linear(in_dim, 512)
    -> ReLU -> Dropout(0.25), attention 512 -> 128 -> 1 (tanh), classifier 512 -> C, PyTorch's
    default init (592,132 parameters at in_dim 1024, 3 classes).

    Args: in_dim, num_classes, dim (512), dropout (0.25), attn_hidden (128), act (``"relu"`` or
    ``"gelu"``), init (``"torch"``: PyTorch's default init; ``"xavier"``: Xavier-normal Linear
    weights, zero biases), survival. ``ABMIL(dim=128, act="gelu", init="xavier")`` is the smaller
    variant this package shipped before (148,228 parameters at in_dim 1024, 3 classes).
    """

    model_name = "abmil"
    permutation_invariant = True

    def __init__(self, *, in_dim: int, num_classes: int, dim: int = 512, dropout: float = 0.25,
                 attn_hidden: int = 128, act: str = "relu", init: str = "torch", survival: bool = False) -> None:
        super().__init__(in_dim, num_classes, dim, dropout, attn_hidden, survival, act=act)
        if _require_choice("init", init, BASELINE_INITS) == "xavier":
            self._init_xavier()
        self._config = dict(in_dim=in_dim, num_classes=num_classes, dim=dim, dropout=dropout,
                            attn_hidden=attn_hidden, act=act, init=init, survival=survival)

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) grid (x, y) -> dict (see the module docstring)."""
        tokens, index, grid = self._tokens(features, coords, grid_size, "raster")
        return self._finish(tokens, index, grid)


# The baselines build on the classes above, so they are imported after them.
from .baselines import CLAMSB, DSMIL, DTFDMIL, MambaMILSR, S4MIL, TransMIL  # noqa: E402

MODELS: dict[str, type[_MILModel]] = {
    cls.model_name: cls for cls in (MambaMIL2D, MambaMIL, ABMIL, CLAMSB, DSMIL, DTFDMIL, TransMIL, S4MIL, MambaMILSR)}


def build_model(name: str, **kwargs: Any) -> _MILModel:
    """A MIL model by name (a key of ``MODELS``, e.g. ``"mambamil2d"``, ``"transmil"``) and constructor keywords."""
    if name not in MODELS:
        raise ValueError(f"model name must be one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name](**kwargs)


def model_from_checkpoint(path: Union[str, Path], map_location: Union[str, torch.device] = "cpu") -> _MILModel:
    """Rebuild a model from a checkpoint dict with ``"model_config"`` (``model.config``) and ``"model"`` (state dict)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(checkpoint, dict) or "model_config" not in checkpoint or "model" not in checkpoint:
        raise ValueError(f"{path} is not a MIL checkpoint: expected a dict with 'model_config' and 'model' keys")
    config = dict(checkpoint["model_config"])
    model = build_model(config.pop("name"), **config)
    model.load_state_dict(checkpoint["model"])
    return model
