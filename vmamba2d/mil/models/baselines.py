"""The paper's MIL baselines under the MIL API of :mod:`vmamba2d.mil.models.base` (docs/mil.md#baselines).

Default sizes: the 2DMamba code's (MambaMIL), the MambaMIL repository trainer's, which the 2DMamba
trainer descends from (TransMIL, S4MIL), and the authors' own code's (CLAM-SB, DSMIL); the
parameter counts at in_dim 1024 and 3 classes are stated (and derived) in tests/mil/test_mil_baselines.py.

    ``MambaMIL``    the MambaMIL2D block (:mod:`.mamba`) on the tissue tokens as a 1 x n sequence.
    ``ABMIL``       ABMIL (Ilse et al., ICML 2018): attention pooling of the projected patches.
    ``CLAMSB``      CLAM-SB (Lu et al., Nat. Biomed. Eng. 2021): gated attention pooling plus an
                    instance-level clustering loss on the top / bottom-k attended patches.
    ``DSMIL``       DSMIL (Li et al., CVPR 2021): a max-instance stream and a bag stream whose
                    attention is the similarity to the critical (highest-scoring) instance.
    ``TransMIL``    TransMIL (Shao et al., NeurIPS 2021): two Nyström attention layers with the PPEG
                    positional module between them and a class token.
    ``S4MIL``       S4MIL (Fillioux et al., MICCAI 2023): an S4D layer over the instance sequence,
                    max-pooled.
    ``MambaMILSR``  MambaMIL (Yang et al., MICCAI 2024) with its SRMamba block: a Mamba scan of the
                    sequence plus a second scan of the sequence reordered with stride ``rate``.
    ``DTFDMIL``     DTFD-MIL (Zhang et al., CVPR 2022): gated attention MIL on random pseudo-bags,
                    then on one feature vector distilled from each.

Bag models (``permutation_invariant``): ABMIL, CLAM-SB, DSMIL. TransMIL, S4MIL and MambaMIL are
sequence models: their output depends on the order of the patches. ``order="raster"`` (default)
sorts the patches row-major by grid position, so they do not depend on the file's row order (but do
on the positions); ``order="file"`` keeps the row order of the feature file, as the official code.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import (BASELINE_INITS, ORDERS, MILModel, TaskLoss, TokenMIL, activation_layer, ordered_instances,
                   require_choice, require_dropout, require_positive, scatter_to_grid)
from .mamba import INITS, MambaMixer, SSMMIL, init_mamba_dt
from .nystrom import NystromAttention
from .s4d import S4D

Tensor = torch.Tensor


# --- MambaMIL (1D) ----------------------------------------------------------------------------

class MambaMIL(TokenMIL, SSMMIL):
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
        SSMMIL.__init__(self, in_dim, num_classes, dim=dim, d_state=d_state, expand=expand, d_conv=d_conv,
                         num_blocks=num_blocks, dropout=dropout, conv="1d", attn_hidden=attn_hidden, init=init,
                         survival=survival, scan_backend=scan_backend)
        self.order = require_choice("order", order, ORDERS)
        del self._config["conv"]
        self._config["order"] = order
        self._apply_init(init)

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) grid (x, y) -> dict (see :mod:`vmamba2d.mil.models`)."""
        tokens, index, grid = self._tokens(features, coords, grid_size, self.order)
        return self._finish(self._mix(tokens, 1, tokens.shape[0]), index, grid)


# --- ABMIL ----------------------------------------------------------------------------------------

class ABMIL(TokenMIL):
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
        if require_choice("init", init, BASELINE_INITS) == "xavier":
            self._init_xavier()
        self._config = dict(in_dim=in_dim, num_classes=num_classes, dim=dim, dropout=dropout,
                            attn_hidden=attn_hidden, act=act, init=init, survival=survival)

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) grid (x, y) -> dict (see :mod:`vmamba2d.mil.models`)."""
        tokens, index, grid = self._tokens(features, coords, grid_size, "raster")
        return self._finish(tokens, index, grid)


# --- CLAM-SB --------------------------------------------------------------------------------------

class GatedAttentionPool(nn.Module):
    """Gated attention pooling: score = w . (tanh(W_a t) * sigmoid(W_b t)); softmax over tokens."""

    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.attention_a = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Dropout(dropout))
        self.attention_b = nn.Sequential(nn.Linear(dim, hidden), nn.Sigmoid(), nn.Dropout(dropout))
        self.score = nn.Linear(hidden, 1)

    def forward(self, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (n, dim) -> (embedding (1, dim), weights (n,), scores (n,))."""
        scores = self.score(self.attention_a(tokens) * self.attention_b(tokens)).squeeze(-1)
        weights = torch.softmax(scores, dim=0)
        return weights.unsqueeze(0) @ tokens, weights, scores


class CLAMSB(TokenMIL):
    """CLAM-SB: projection -> gated attention pooling -> head, plus the instance clustering loss.

    Defaults = CLAM's ``CLAM_SB`` (size "small", gated, k_sample 8, bag_weight 0.7 in
    ``default_loss_weights``): Linear(in_dim, 512) -> ReLU -> Dropout(0.25), gated attention
    512 -> 256 -> 1 with Dropout(0.25), classifier 512 -> C, one Linear(512, 2) instance classifier
    per class, PyTorch's default init.

    Instance loss (term ``"instance"``): the k patches with the highest and the k with the lowest
    attention score get pseudo labels 1 and 0 for the classifier of the slide's class
    (cross-entropy); with ``subtyping=True`` the top k of every other class's classifier also get
    label 0 and the sum is divided by the number of classes. k = min(k_sample, patches) (CLAM
    itself fails on slides with fewer than k_sample patches).

    Args: in_dim, num_classes, dim (512), attn_hidden (256), dropout (0.25), k_sample (8),
    subtyping (False), init (``"torch"`` / ``"xavier"``), survival (the instance loss then uses the
    time bin as the class).
    """

    model_name = "clam_sb"
    permutation_invariant = True
    default_loss_weights = {"slide": 0.7, "instance": 0.3}

    def __init__(self, *, in_dim: int, num_classes: int, dim: int = 512, attn_hidden: int = 256,
                 dropout: float = 0.25, k_sample: int = 8, subtyping: bool = False, init: str = "torch",
                 survival: bool = False) -> None:
        require_positive("attn_hidden", attn_hidden)
        pool = GatedAttentionPool(dim, attn_hidden, require_dropout("dropout", dropout))
        super().__init__(in_dim, num_classes, dim, dropout, attn_hidden, survival, act="relu", pool=pool)
        self.k_sample = require_positive("k_sample", k_sample)
        self.subtyping = subtyping
        self.instance_classifiers = nn.ModuleList(nn.Linear(dim, 2) for _ in range(num_classes))
        if require_choice("init", init, BASELINE_INITS) == "xavier":
            self._init_xavier()
        self._config = dict(in_dim=in_dim, num_classes=num_classes, dim=dim, attn_hidden=attn_hidden,
                            dropout=dropout, k_sample=k_sample, subtyping=subtyping, init=init, survival=survival)

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) -> dict (vmamba2d.mil.models) with ``instance_tokens``
        (n, dim) and ``instance_scores`` (n,) for the instance loss."""
        tokens, index, grid = self._tokens(features, coords, grid_size, "raster")
        embedding, weights, scores = self.pool(tokens)
        out = self._outputs(embedding, scatter_to_grid(weights, index, grid), scatter_to_grid(scores, index, grid), grid)
        out.update(instance_tokens=tokens, instance_scores=scores)
        return out

    def auxiliary_losses(self, output: dict[str, Tensor], label: int, task_loss: TaskLoss) -> dict[str, Tensor]:
        """``{"instance": CLAM's instance clustering loss}`` for a slide of class ``label``."""
        if not 0 <= label < self.num_classes:
            raise ValueError(f"label must be a class index in [0, {self.num_classes}), got {label}")
        tokens, scores = output["instance_tokens"], output["instance_scores"]
        k = min(self.k_sample, tokens.shape[0])
        top = torch.topk(scores, k).indices
        bottom = torch.topk(-scores, k).indices
        ones = torch.ones(k, dtype=torch.long, device=tokens.device)
        loss_dtype = torch.promote_types(tokens.dtype, torch.float32)
        losses = []
        for index, classifier in enumerate(self.instance_classifiers):
            if index == label:
                logits = classifier(torch.cat([tokens[top], tokens[bottom]]))
                losses.append(F.cross_entropy(logits.to(loss_dtype), torch.cat([ones, 0 * ones])))
            elif self.subtyping:
                losses.append(F.cross_entropy(classifier(tokens[top]).to(loss_dtype), 0 * ones))
        loss = torch.stack(losses).sum()
        return {"instance": loss / self.num_classes if self.subtyping else loss}


# --- DSMIL ----------------------------------------------------------------------------------------

class DSMIL(MILModel):
    """DSMIL: an instance classifier (max-instance stream) and a bag classifier whose attention is
    the query similarity of every patch to each class's critical patch.

    Defaults = the official DSMIL (``dsmil.py``; ``train_tcga.py``: non-linear queries, no value
    projection, ``dropout_node`` 0) on the input features: instance classifier Linear(in_dim, C);
    queries Linear(in_dim, 128) -> ReLU -> Linear(128, 128) -> Tanh; values = the features;
    attention softmax over patches of q_i . q_crit(c) / sqrt(128); bag classifier
    Conv1d(C, C, kernel in_dim) over the C class embeddings; PyTorch's default init.

    Loss terms: ``"slide"`` (bag stream) and ``"max_instance"`` (the task loss of the per-class
    maximum of the instance logits), 0.5 each as in DSMIL's training. ``logits`` are the bag
    stream's; ``attention`` is the attention of the predicted class; ``instance_logits`` (n, C).

    Args: in_dim, num_classes, query_dim (128), nonlinear (True: the two-layer query network),
    passing_v (False: values = features; True: Dropout(dropout_v) -> Linear -> ReLU), dropout_v
    (0.0), init (``"torch"`` / ``"xavier"``), survival.
    """

    model_name = "dsmil"
    permutation_invariant = True
    default_loss_weights = {"slide": 0.5, "max_instance": 0.5}

    def __init__(self, *, in_dim: int, num_classes: int, query_dim: int = 128, nonlinear: bool = True,
                 passing_v: bool = False, dropout_v: float = 0.0, init: str = "torch", survival: bool = False) -> None:
        super().__init__(in_dim, num_classes, survival)
        require_positive("query_dim", query_dim)
        require_dropout("dropout_v", dropout_v)
        self.instance_classifier = nn.Linear(in_dim, num_classes)
        if nonlinear:
            self.query = nn.Sequential(nn.Linear(in_dim, query_dim), nn.ReLU(), nn.Linear(query_dim, query_dim),
                                       nn.Tanh())
        else:
            self.query = nn.Linear(in_dim, query_dim)
        self.value = (nn.Sequential(nn.Dropout(dropout_v), nn.Linear(in_dim, in_dim), nn.ReLU())
                      if passing_v else nn.Identity())
        self.bag_classifier = nn.Conv1d(num_classes, num_classes, kernel_size=in_dim)
        if require_choice("init", init, BASELINE_INITS) == "xavier":
            self._init_xavier()
        self._config = dict(in_dim=in_dim, num_classes=num_classes, query_dim=query_dim, nonlinear=nonlinear,
                            passing_v=passing_v, dropout_v=dropout_v, init=init, survival=survival)

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) -> dict (vmamba2d.mil.models) with ``instance_logits`` (n, C)."""
        features, index, grid = ordered_instances(features, coords, grid_size, self.in_dim, "raster")
        instance_logits = self.instance_classifier(features)  # (n, C)
        queries = self.query(features)  # (n, Q)
        critical = queries[instance_logits.argmax(dim=0)]  # (C, Q)
        scores = queries @ critical.t() / math.sqrt(queries.shape[1])  # (n, C)
        weights = torch.softmax(scores, dim=0)
        bags = weights.t() @ self.value(features)  # (C, V)
        logits = self.bag_classifier(bags.unsqueeze(0)).view(1, self.num_classes)
        shown = int(logits.argmax())
        return self.head_outputs(
            logits, attention=scatter_to_grid(weights[:, shown], index, grid),
            attention_scores=scatter_to_grid(scores[:, shown], index, grid),
            embedding=bags.reshape(1, -1), instance_logits=instance_logits)

    def auxiliary_losses(self, output: dict[str, Tensor], label: int, task_loss: TaskLoss) -> dict[str, Tensor]:
        """``{"max_instance": task loss of the per-class maximum of the instance logits}``."""
        return {"max_instance": task_loss(output["instance_logits"].max(dim=0).values.unsqueeze(0))}


# --- TransMIL -------------------------------------------------------------------------------------

class TransLayer(nn.Module):
    """x + NystromAttention(LayerNorm(x)): (n, dim) -> (n, dim)."""

    def __init__(self, dim: int, **attention_options) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = NystromAttention(dim, **attention_options)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.attn(self.norm(x))


class PPEG(nn.Module):
    """TransMIL's pyramid position encoding generator: the tokens after the class token, laid out
    row-major on a side x side square, plus depthwise 7x7, 5x5 and 3x3 convolutions of them."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.proj1 = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        self.proj2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: Tensor, side: int) -> Tensor:
        """x (1 + side * side, dim) -> same shape."""
        square = x[1:].t().reshape(1, x.shape[1], side, side)
        mixed = square + self.proj(square) + self.proj1(square) + self.proj2(square)
        return torch.cat([x[:1], mixed.flatten(2)[0].t()])


class TransMIL(MILModel):
    """TransMIL: projection -> square padding -> class token -> Nyström layer -> PPEG -> Nyström
    layer -> LayerNorm -> the class token's head.

    Defaults = TransMIL as the MambaMIL / 2DMamba trainers build it (``act='relu'``, dropout 0.25):
    Linear(in_dim, 512) -> ReLU -> Dropout(0.25); two layers of 8-head Nyström attention (head size
    64, 256 landmarks, 6 pseudo-inverse iterations, value convolution of length 33, dropout 0.1);
    PPEG; LayerNorm; classifier 512 -> C; Xavier-normal Linear init, class token ~ N(0, 1e-6).
    The n tokens are padded to side^2 (side = ceil(sqrt(n))) by repeating the first ones.
    No per-instance attention score (``has_attention`` False).

    Args: in_dim, num_classes, dim (512), heads (8), landmarks (256), pinv_iterations (6),
    residual_kernel (33), attn_dropout (0.1), dropout (0.25), act (``"relu"`` / ``"gelu"``),
    order (``"raster"`` / ``"file"``), init (``"xavier"`` / ``"torch"``), survival.
    """

    model_name = "transmil"
    has_attention = False

    def __init__(self, *, in_dim: int, num_classes: int, dim: int = 512, heads: int = 8, landmarks: int = 256,
                 pinv_iterations: int = 6, residual_kernel: int = 33, attn_dropout: float = 0.1,
                 dropout: float = 0.25, act: str = "relu", order: str = "raster", init: str = "xavier",
                 survival: bool = False) -> None:
        super().__init__(in_dim, num_classes, survival)
        require_positive("dim", dim)
        if require_positive("heads", heads) and dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
        self.order = require_choice("order", order, ORDERS)
        self.proj = nn.Sequential(nn.Linear(in_dim, dim), activation_layer(act), nn.Dropout(require_dropout("dropout", dropout)))
        self.cls_token = nn.Parameter(torch.randn(1, dim) * 1e-6)
        attention = dict(heads=heads, head_dim=dim // heads, landmarks=require_positive("landmarks", landmarks),
                         pinv_iterations=pinv_iterations, residual_kernel=residual_kernel,
                         dropout=require_dropout("attn_dropout", attn_dropout))
        self.layer1 = TransLayer(dim, **attention)
        self.pos_layer = PPEG(dim)
        self.layer2 = TransLayer(dim, **attention)
        self.norm = nn.LayerNorm(dim)
        self.classifier = nn.Linear(dim, num_classes)
        if require_choice("init", init, BASELINE_INITS) == "xavier":
            self._init_xavier()
        self._config = dict(in_dim=in_dim, num_classes=num_classes, dim=dim, heads=heads, landmarks=landmarks,
                            pinv_iterations=pinv_iterations, residual_kernel=residual_kernel,
                            attn_dropout=attn_dropout, dropout=dropout, act=act, order=order, init=init,
                            survival=survival)

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) -> dict (vmamba2d.mil.models), no attention map."""
        features, _, _ = ordered_instances(features, coords, grid_size, self.in_dim, self.order)
        tokens = self.proj(features)
        side = math.isqrt(tokens.shape[0] - 1) + 1
        tokens = torch.cat([self.cls_token.to(tokens.dtype), tokens, tokens[: side * side - tokens.shape[0]]])
        tokens = self.layer2(self.pos_layer(self.layer1(tokens), side))
        embedding = self.norm(tokens)[:1]
        return self.head_outputs(self.classifier(embedding), embedding=embedding)


# --- S4MIL ----------------------------------------------------------------------------------------

class S4MIL(MILModel):
    """S4MIL: projection -> LayerNorm -> S4D over the patch sequence -> max over patches -> head.

    Defaults = S4MIL as the MambaMIL / 2DMamba trainers build it (``act='gelu'``, dropout 0.25):
    Linear(in_dim, 512) -> GELU -> Dropout(0.25), LayerNorm(512), S4D(512, N = 32), classifier
    512 -> C, PyTorch's default init and S4D's own. No per-instance attention score.

    Args: in_dim, num_classes, dim (512), d_state (32, even), dropout (0.25), act (``"gelu"`` /
    ``"relu"``), order (``"raster"`` / ``"file"``), survival.
    """

    model_name = "s4mil"
    has_attention = False

    def __init__(self, *, in_dim: int, num_classes: int, dim: int = 512, d_state: int = 32, dropout: float = 0.25,
                 act: str = "gelu", order: str = "raster", survival: bool = False) -> None:
        super().__init__(in_dim, num_classes, survival)
        require_positive("dim", dim)
        self.order = require_choice("order", order, ORDERS)
        self.proj = nn.Sequential(nn.Linear(in_dim, dim), activation_layer(act), nn.Dropout(require_dropout("dropout", dropout)))
        self.norm = nn.LayerNorm(dim)
        self.s4 = S4D(dim, d_state)
        self.classifier = nn.Linear(dim, num_classes)
        self._config = dict(in_dim=in_dim, num_classes=num_classes, dim=dim, d_state=d_state, dropout=dropout,
                            act=act, order=order, survival=survival)

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) -> dict (vmamba2d.mil.models), no attention map."""
        features, _, _ = ordered_instances(features, coords, grid_size, self.in_dim, self.order)
        embedding = self.s4(self.norm(self.proj(features))).max(dim=0, keepdim=True).values
        return self.head_outputs(self.classifier(embedding), embedding=embedding)


# --- MambaMIL (SRMamba) ---------------------------------------------------------------------------

def stride_reorder(x: Tensor, rate: int) -> Tensor:
    """(C, L) -> (C, P): zero-pad to P = rate * ceil(L / rate), then read with stride ``rate``:
    positions 0, rate, 2 rate, ..., then 1, rate + 1, ... (output w * P / rate + k = input k * rate + w)."""
    channels, length = x.shape
    stripes = -(-length // rate)
    padded = F.pad(x, (0, stripes * rate - length))
    return padded.view(channels, stripes, rate).transpose(1, 2).reshape(channels, stripes * rate)


def stride_restore(y: Tensor, rate: int, length: int) -> Tensor:
    """Inverse of ``stride_reorder``: (C, P) -> (C, length), padding dropped."""
    channels, padded = y.shape
    return y.view(channels, rate, padded // rate).transpose(1, 2).reshape(channels, padded)[:, :length]


class SRMambaMixer(MambaMixer):
    """MambaMIL's SRMamba mixer on a 1D sequence: the Mamba branch plus a second branch (its own
    conv, x / dt projections, A and D; shared in / out projections) over the in-projected sequence
    reordered with stride ``rate`` (``stride_reorder``, zero padded); the gated outputs of both
    branches, the second restored to the original order, are summed before out_proj."""

    def __init__(self, dim: int, rate: int = 10, d_state: int = 16, expand: int = 2, d_conv: int = 4,
                 scan_backend: str = "auto") -> None:
        super().__init__(dim, d_state=d_state, expand=expand, d_conv=d_conv, conv="1d", scan_backend=scan_backend)
        self.rate = require_positive("rate", rate)
        inner = expand * dim
        self.conv_b = nn.Conv1d(inner, inner, d_conv, groups=inner, padding=d_conv - 1)
        self.x_proj_b = nn.Linear(inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj_b = nn.Linear(self.dt_rank, inner)
        self.A_b_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(inner, 1))
        self.D_b = nn.Parameter(torch.ones(inner))

    def forward(self, x: Tensor, height: int = 1, width: int = 0) -> Tensor:
        """x (L, dim) tokens of one sequence -> (L, dim) (``height`` / ``width`` are ignored)."""
        length = x.shape[0]
        xz = self.in_proj(x).t()  # (2E, L)
        u, z = xz.chunk(2, dim=0)
        y = self._branch(u, z, 1, length, self.conv, self.x_proj, self.dt_proj, self.A_log, self.D)
        u_b, z_b = stride_reorder(xz, self.rate).chunk(2, dim=0)
        y_b = self._branch(u_b, z_b, 1, u_b.shape[1], self.conv_b, self.x_proj_b, self.dt_proj_b, self.A_b_log,
                           self.D_b)
        return self.out_proj((y + stride_restore(y_b, self.rate, length)).t())


class SRMambaBlock(nn.Module):
    """Pre-norm residual block: x + SRMambaMixer(LayerNorm(x)); (L, dim) -> (L, dim)."""

    def __init__(self, dim: int, **mixer_options) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mixer = SRMambaMixer(dim, **mixer_options)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mixer(self.norm(x))


class MambaMILSR(TokenMIL):
    """MambaMIL with SRMamba blocks: projection -> U x [LayerNorm -> SRMamba, residual] -> LayerNorm
    -> attention pooling -> head.

    Defaults = the official 2DMamba repository's ``mamba_mil`` (docs/mil.md#baselines): Linear(in_dim,
    128) -> GELU -> Dropout(0.25), one SRMamba block (N 16, conv 4, expand 2, rate 10), LayerNorm,
    attention 128 -> 64 -> 1, classifier 128 -> C, Xavier-normal Linear init (so dt bias 0).

    Args: in_dim, num_classes, dim (128), d_state (16), expand (2), d_conv (4), num_blocks (1),
    rate (10), dropout (0.25), attn_hidden (64), order (``"raster"`` / ``"file"``), init
    (``"official"`` / ``"mamba"`` as MambaMIL2D), survival, scan_backend.
    """

    model_name = "mambamil_sr"

    def __init__(self, *, in_dim: int, num_classes: int, dim: int = 128, d_state: int = 16, expand: int = 2,
                 d_conv: int = 4, num_blocks: int = 1, rate: int = 10, dropout: float = 0.25, attn_hidden: int = 64,
                 order: str = "raster", init: str = "official", survival: bool = False,
                 scan_backend: str = "auto") -> None:
        super().__init__(in_dim, num_classes, dim, dropout, attn_hidden, survival, act="gelu")
        require_positive("num_blocks", num_blocks)
        require_positive("d_state", d_state)
        require_positive("expand", expand)
        self.order = require_choice("order", order, ORDERS)
        self.blocks = nn.ModuleList(
            SRMambaBlock(dim, rate=rate, d_state=d_state, expand=expand, d_conv=d_conv, scan_backend=scan_backend)
            for _ in range(num_blocks))
        self.norm = nn.LayerNorm(dim)
        if require_choice("init", init, INITS) == "official":
            self._init_xavier()
        else:
            for block in self.blocks:
                init_mamba_dt(block.mixer.dt_proj, block.mixer.dt_rank)
                init_mamba_dt(block.mixer.dt_proj_b, block.mixer.dt_rank)
        self._config = dict(in_dim=in_dim, num_classes=num_classes, dim=dim, d_state=d_state, expand=expand,
                            d_conv=d_conv, num_blocks=num_blocks, rate=rate, dropout=dropout,
                            attn_hidden=attn_hidden, order=order, init=init, survival=survival,
                            scan_backend=scan_backend)

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) grid (x, y) -> dict (see vmamba2d.mil.models)."""
        tokens, index, grid = self._tokens(features, coords, grid_size, self.order)
        for block in self.blocks:
            tokens = block(tokens)
        return self._finish(self.norm(tokens), index, grid)


# --- DTFD-MIL ---------------------------------------------------------------------------------------

# DTFD-MIL (Zhang et al., CVPR 2022): double-tier feature distillation over pseudo-bags.
#
# A slide's patches are split at random into M pseudo-bags that inherit the slide's label. Tier 1 is
# a gated attention MIL model run on each pseudo-bag (its prediction trained against the slide's
# label: the ``"pseudo_bag"`` loss term); from each pseudo-bag one or two feature vectors are
# *distilled* and tier 2, a second gated attention MIL model, aggregates the M (or 2M) distilled
# vectors into the slide's prediction (the ``"slide"`` term).
#
# Distillation (``distill``):
#     ``"afs"``      aggregated feature selection: the pseudo-bag's attention-pooled embedding
#                    (the paper's best; the default of its code);
#     ``"maxs"``     the instance with the highest derived probability of the ranked class;
#     ``"maxmins"``  that instance and the one with the lowest probability.
# Instance probabilities come from the paper's derivation for attention MIL: the pseudo-bag logit
# of class c is ``sum_k a_k w_c . h_k + b_c``, so instance k contributes ``a_k w_c . h_k`` and its
# probability is the softmax over classes of those contributions. The ranked class is the one the
# pseudo-bag predicts (for two classes, max / min of either class's probability pick the same pair,
# so ``"maxmins"`` equals ranking by the positive class).
#
# Pseudo-bags: in training mode a fresh random split from the global torch generator on every
# forward (the paper reshuffles each time a slide is seen); in eval mode a fixed split (a
# permutation from a generator seeded with ``eval_seed``, taken over the patches in row-major grid
# order), so evaluation is deterministic and does not depend on the file's row order. The split is
# ``torch.tensor_split`` of the permuted patches into min(M, n) near-equal parts.

DISTILLATIONS = ("afs", "maxs", "maxmins")


class DTFDMIL(MILModel):
    """DTFD-MIL: shared reduction -> tier 1 (gated attention MIL per pseudo-bag) -> distillation ->
    tier 2 (gated attention MIL over the distilled vectors) -> head.

    Defaults = the DTFD-MIL code's (``numGroup`` 4, ``mDim`` 512, ``distill_type`` AFS, drop rate 0):
    Linear(in_dim, 512, no bias) -> ReLU; tier 1 gated attention 512 -> 128 -> 1 (tanh x sigmoid)
    and classifier 512 -> C; tier 2 the same with its own weights; PyTorch's default init
    (790,280 parameters at in_dim 1024, 3 classes).

    Outputs besides the common ones: ``pseudo_bag_logits`` (M, C) tier-1 logits;
    ``attention`` (H, W) = each patch's weight in the slide embedding (tier-2 weight of its
    pseudo-bag times its tier-1 weight for ``"afs"``, which sums to 1; the tier-2 weight of the
    selected patches for ``"maxs"`` / ``"maxmins"``); ``attention_scores`` the tier-1 scores.

    Loss terms: ``"slide"`` (tier 2) and ``"pseudo_bag"`` (mean over pseudo-bags of the task loss
    of their logits), 1 each: the code's two optimisers step on the sum of both tiers' gradients.

    Args: in_dim, num_classes, dim (512), attn_hidden (128), num_groups (M, 4), distill
    (``"afs"`` / ``"maxs"`` / ``"maxmins"``), eval_seed (0), init (``"torch"`` / ``"xavier"``), survival.
    """

    model_name = "dtfdmil"
    default_loss_weights = {"slide": 1.0, "pseudo_bag": 1.0}

    def __init__(self, *, in_dim: int, num_classes: int, dim: int = 512, attn_hidden: int = 128, num_groups: int = 4,
                 distill: str = "afs", eval_seed: int = 0, init: str = "torch", survival: bool = False) -> None:
        super().__init__(in_dim, num_classes, survival)
        require_positive("dim", dim)
        require_positive("attn_hidden", attn_hidden)
        self.num_groups = require_positive("num_groups", num_groups)
        self.distill = require_choice("distill", distill, DISTILLATIONS)
        if isinstance(eval_seed, bool) or not isinstance(eval_seed, int):
            raise ValueError(f"eval_seed must be an int, got {eval_seed!r}")
        self.eval_seed = eval_seed
        self.reduce = nn.Sequential(nn.Linear(in_dim, dim, bias=False), nn.ReLU())
        self.attention1 = GatedAttentionPool(dim, attn_hidden, 0.0)
        self.classifier1 = nn.Linear(dim, num_classes)
        self.attention2 = GatedAttentionPool(dim, attn_hidden, 0.0)
        self.classifier = nn.Linear(dim, num_classes)
        if require_choice("init", init, BASELINE_INITS) == "xavier":
            self._init_xavier()
        self._config = dict(in_dim=in_dim, num_classes=num_classes, dim=dim, attn_hidden=attn_hidden,
                            num_groups=num_groups, distill=distill, eval_seed=eval_seed, init=init, survival=survival)

    def pseudo_bags(self, count: int, device: torch.device) -> list[Tensor]:
        """Split ``count`` patches into min(M, count) pseudo-bags: a list of index tensors (n_g,).

        Training mode draws the permutation from the global generator, eval mode from one seeded
        with ``eval_seed``.
        """
        generator = None if self.training else torch.Generator().manual_seed(self.eval_seed)
        order = torch.randperm(count, generator=generator).to(device)
        return list(torch.tensor_split(order, min(self.num_groups, count)))

    def instance_probabilities(self, tokens: Tensor, weights: Tensor) -> Tensor:
        """The paper's instance probabilities in a pseudo-bag: tokens (n_g, dim) and tier-1 attention
        weights (n_g,) -> softmax over classes of ``a_k * W1 h_k`` (n_g, C)."""
        return torch.softmax(weights.unsqueeze(1) * (tokens @ self.classifier1.weight.t()), dim=1)

    def tier2(self, distilled: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """distilled (m, dim) -> (logits (1, C), weights (m,), embedding (1, dim)); invariant to the
        order of the m rows."""
        embedding, weights, _ = self.attention2(distilled)
        return self.classifier(embedding), weights, embedding

    def forward(self, features: Tensor, coords: Tensor,
                grid_size: Optional[tuple[int, int]] = None) -> dict[str, Tensor]:
        """features (n, in_dim), coords (n, 2) grid (x, y) -> dict (vmamba2d.mil.models) with
        ``pseudo_bag_logits`` (M, C)."""
        features, index, grid = ordered_instances(features, coords, grid_size, self.in_dim, "raster")
        tokens = self.reduce(features)  # (n, dim)
        groups = self.pseudo_bags(tokens.shape[0], tokens.device)
        group_logits, distilled, owners = [], [], []
        dtype = torch.promote_types(tokens.dtype, torch.float32)  # under autocast: fp32 maps, as the softmax
        scores = tokens.new_zeros(tokens.shape[0], dtype=dtype)
        tier1_weights = tokens.new_zeros(tokens.shape[0], dtype=dtype)
        for group in groups:
            members = tokens[group]
            embedding, weights, group_scores = self.attention1(members)
            logits = self.classifier1(embedding)  # (1, C)
            group_logits.append(logits)
            scores = scores.index_copy(0, group, group_scores.to(dtype))
            tier1_weights = tier1_weights.index_copy(0, group, weights.to(dtype))
            if self.distill == "afs":
                distilled.append(embedding)
                owners.append(group)
                continue
            ranked = self.instance_probabilities(members, weights)[:, int(logits.argmax())]
            picks = [int(ranked.argmax())] + ([int(ranked.argmin())] if self.distill == "maxmins" else [])
            distilled.append(members[picks])
            owners.extend(group[pick : pick + 1] for pick in picks)
        logits, bag_weights, embedding = self.tier2(torch.cat(distilled))
        if self.distill == "afs":
            patch_weights = tokens.new_zeros(tokens.shape[0], dtype=dtype)
            for group, weight in zip(owners, bag_weights.to(dtype)):
                patch_weights = patch_weights.index_copy(0, group, weight * tier1_weights[group])
        else:  # a patch picked twice (a one-patch pseudo-bag under maxmins) gets both weights
            patch_weights = tokens.new_zeros(tokens.shape[0], dtype=dtype).index_add(0, torch.cat(owners),
                                                                                   bag_weights.to(dtype))
        return self.head_outputs(logits, attention=scatter_to_grid(patch_weights, index, grid),
                                 attention_scores=scatter_to_grid(scores, index, grid), embedding=embedding,
                                 pseudo_bag_logits=torch.cat(group_logits))

    def auxiliary_losses(self, output: dict[str, Tensor], label: int, task_loss: TaskLoss) -> dict[str, Tensor]:
        """``{"pseudo_bag": mean over pseudo-bags of the task loss of their tier-1 logits}`` (each
        pseudo-bag carries the slide's label)."""
        logits = output["pseudo_bag_logits"]
        return {"pseudo_bag": torch.stack([task_loss(logits[g : g + 1]) for g in range(logits.shape[0])]).mean()}
