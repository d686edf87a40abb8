"""VMamba v2 and 2DVMamba backbones for timm.

Architecture (VMamba v2, forward type "v05_noz", channels-first throughout):
stem "v2" (conv3x3/2 -> LN2d -> GELU -> conv3x3/2 -> LN2d), four stages of VSS blocks
(x + DropPath(SS2D(LN2d(x))); x + DropPath(MLP(LN2d(x)))), a "v3" downsample (conv3x3/2 -> LN2d)
at the start of stages 1-3, a final LN2d, global average pooling and a linear classifier.

``scan="2d"`` is 2DVMamba (every SS2D route is a 2D selective scan); ``scan="1d"`` is the VMamba
baseline (1D scans of the same routes). Both have identical parameters, so one checkpoint loads into
either. Registered names: ``vmamba2d_{tiny,small,base}`` and ``vmamba_{tiny,small,base}``; the
``vmamba_*.in1k`` tags download the official VMamba v2 ImageNet-1k weights (no 2DVMamba weights are
public: their cfg notes say how to start from VMamba's).
"""
import contextlib
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import ClassifierHead, DropPath, get_device_dtype, trunc_normal_
from timm.models import build_model_with_cfg, checkpoint_seq, generate_default_cfgs, register_model
from timm.models._builder import resolve_pretrained_cfg
from timm.models._features import feature_take_indices

from .cpu_inference import PackedWeightConv2d, chunk_size, inference_chunk_limit, run_in_chunks, runs_in_chunks
from .norm import LayerNorm2d
from .ss2d import LAYER_NORM_EPS, SS2D
from .weights import checkpoint_filter_fn, clear_pretrained_errors, official_checkpoint_loading

Tensor = torch.Tensor

__all__ = [
    "VMamba", "VSSBlock", "PointwiseMlp", "VMambaStage", "Stem", "Downsample", "check_image_input", "checkpoint_filter_fn",
]


DEFAULT_DEPTHS = (2, 2, 8, 2)


def _norm(channels: int, **dd: Any) -> nn.Module:
    return LayerNorm2d(channels, eps=LAYER_NORM_EPS, **dd)


def _strided_conv3x3(in_channels: int, out_channels: int, **dd: Any) -> nn.Conv2d:
    return PackedWeightConv2d(in_channels, out_channels, kernel_size=3, stride=2, padding=1, **dd)


def check_image_input(x: Tensor, in_chans: int) -> Tensor:
    """Return x if it is a (B, in_chans, H, W) floating-point tensor with H, W >= 1; raise
    TypeError / ValueError naming what was expected otherwise.

    A plain function so that FX symbolic tracing records it as one call (``torch.fx.wrap`` below):
    a traced graph still checks its real input, and tracing never sees a data-dependent branch.
    TorchScript compiles it too (it types x itself, so the isinstance check is eager-only).
    """
    if not torch.jit.is_scripting() and not isinstance(x, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor of shape (B, {in_chans}, H, W), got {type(x).__name__}")
    shape = list(x.shape)
    if not x.is_floating_point():
        raise TypeError(f"input must be a floating-point tensor, got dtype {x.dtype}")
    if len(shape) != 4:
        raise ValueError(f"input must be 4-D (B, {in_chans}, H, W), got shape {shape}")
    if shape[1] != in_chans:
        raise ValueError(f"input must have in_chans={in_chans} channels (B, {in_chans}, H, W), got shape {shape}")
    if shape[2] < 1 or shape[3] < 1:
        raise ValueError(f"input height and width must be at least 1, got {shape[2]}x{shape[3]}")
    return x


torch.fx.wrap("check_image_input")


def _gelu_reusing_input(x: Tensor) -> Tensor:
    """Exact GELU of x (any shape), written over x when autograd does not need x (inference, or
    no parameter upstream requires grad), as a new tensor otherwise.

    Saves a fresh buffer of x's size. Large buffers (the MLP's hidden maps: 37 MiB at batch 8 on
    the first stage's 56x56 maps) are handed back to the system when freed, so every fresh one
    costs page faults on first touch (benchmarks/model_cpu_routes.md).
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return F.gelu(x)
    return torch.ops.aten.gelu_(x)


torch.fx.wrap("_gelu_reusing_input")  # FX records one call; the autograd check runs on real tensors


def _add_residual(x: Tensor, branch: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """x + branch (same shape), written into ``out`` when given (without autograd only: the last
    block of a batch chunk writes straight into the stage's output, :class:`VMambaStage`)."""
    if out is None:
        return x + branch
    if torch.is_grad_enabled() and (x.requires_grad or branch.requires_grad):
        raise RuntimeError("VSSBlock: out= is for inference only (autograd is recording)")
    return torch.add(x, branch, out=out)


torch.fx.wrap("_add_residual")  # FX records one call; the autograd check runs on real tensors


class PointwiseMlp(nn.Module):
    """1x1 conv -> GELU -> dropout -> 1x1 conv -> dropout on (B, C, H, W) maps (timm's ``Mlp`` with
    ``use_conv=True``: same parameters, same state_dict keys ``fc1.*`` / ``fc2.*``), with GELU
    over fc1's output in inference (:func:`_gelu_reusing_input`).
    """

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.fc1 = PackedWeightConv2d(dim, hidden_dim, kernel_size=1, device=device, dtype=dtype)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = PackedWeightConv2d(hidden_dim, dim, kernel_size=1, device=device, dtype=dtype)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, C, H, W)."""
        hidden = _gelu_reusing_input(self.fc1(x))
        return self.drop2(self.fc2(self.drop1(hidden)))


class Stem(nn.Module):
    """Patch embedding "v2": two 3x3 stride-2 convs (padding 1),
    (B, in_chans, H, W) -> (B, dim, ceil(H/4), ceil(W/4)).

    It also validates the network input (see :func:`check_image_input`) so every entry point,
    ``features_only`` wrappers included, rejects bad input before any kernel runs.
    """

    def __init__(self, in_chans: int, dim: int, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.in_chans = in_chans
        self.conv1 = _strided_conv3x3(in_chans, dim // 2, **dd)
        self.norm1 = _norm(dim // 2, **dd)
        self.conv2 = _strided_conv3x3(dim // 2, dim, **dd)
        self.norm2 = _norm(dim, **dd)

    def forward(self, x: Tensor) -> Tensor:
        x = _channels_last_image(check_image_input(x, self.in_chans))
        x = _gelu_reusing_input(self.norm1(self.conv1(x)))
        return self.norm2(self.conv2(x))


def _channels_last_image(x: Tensor) -> Tensor:
    """The image x (B, C, H, W) channels-last, so that the stem's first conv writes channels-last,
    the layout LayerNorm2d normalises in without a copy (an NCHW conv output would be copied
    there, 4x the image's size). Under autocast also in the autocast dtype, which the conv would
    cast it to: one pass over the image instead of a layout copy and then autocast's cast.

    A plain function so that FX symbolic tracing records it as one call (``torch.fx.wrap`` below).
    """
    if torch.jit.is_scripting():
        return x.contiguous(memory_format=torch.channels_last)
    return _channels_last_image_eager(x)


torch.fx.wrap("_channels_last_image")


@torch.jit.unused
def _channels_last_image_eager(x: Tensor) -> Tensor:
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return x.to(dtype=torch.get_autocast_dtype(device), memory_format=torch.channels_last)
    return x.contiguous(memory_format=torch.channels_last)


class Downsample(nn.Module):
    """Downsample "v3": 3x3 stride-2 conv (padding 1) then LN2d,
    (B, C, H, W) -> (B, C_out, ceil(H/2), ceil(W/2))."""

    def __init__(self, dim: int, out_dim: int, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.conv = _strided_conv3x3(dim, out_dim, device=device, dtype=dtype)
        self.norm = _norm(out_dim, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.conv(x))


class VSSBlock(nn.Module):
    """x + DropPath(SS2D(LN2d(x))); x + DropPath(MLP(LN2d(x))) on (B, C, H, W) maps."""

    def __init__(
        self,
        dim: int,
        drop_path: float = 0.0,
        mlp_ratio: float = 4.0,
        proj_drop: float = 0.0,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        **ss2d_kwargs: Any,
    ) -> None:
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.norm = _norm(dim, **dd)
        self.op = SS2D(dim, proj_drop=proj_drop, **ss2d_kwargs, **dd)
        self.norm2 = _norm(dim, **dd)
        self.mlp = PointwiseMlp(dim, int(dim * mlp_ratio), drop=proj_drop, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, out: Optional[Tensor] = None) -> Tensor:
        """(B, C, H, W) -> (B, C, H, W); ``out``: where to write the result (inference only)."""
        x = x + self.drop_path(self.op(self.norm(x)))
        return _add_residual(x, self.drop_path(self.mlp(self.norm2(x))), out)


class VMambaStage(nn.Module):
    """Optional downsample followed by ``depth`` VSS blocks; gradient checkpointing per block.

    With a chunk limit (``inference_chunk_bytes > 0``, or ``None``: the CPU default of
    :mod:`vmamba2d.models.cpu_inference` for maps on the CPU and no limit on other devices), without
    autograd the blocks run on batch chunks small enough that a block's widest buffer (the MLP's
    hidden map or SS2D's per-route step sizes) stays within that many bytes; every block works per
    sample, so the result is the same (why: :mod:`vmamba2d.models.cpu_inference`). A stage
    whose ``blocks`` carry forward hooks or pre-hooks (or while global module forward hooks are
    registered) runs the whole batch through ``blocks`` at once, so those hooks fire as without
    chunking; hooks on the blocks themselves fire once per chunk.
    """

    def __init__(
        self,
        dim: int,
        out_dim: int,
        depth: int,
        downsample: bool,
        drop_path: Sequence[float],
        inference_chunk_bytes: Optional[int] = None,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        **block_kwargs: Any,
    ) -> None:
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.grad_checkpointing = False
        self.inference_chunk_bytes = inference_chunk_bytes
        self.downsample = Downsample(dim, out_dim, **dd) if downsample else nn.Identity()
        self.blocks = nn.Sequential(
            *[VSSBlock(out_dim, drop_path=drop_path[i], **block_kwargs, **dd) for i in range(depth)]
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.downsample(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self.blocks, x)
        if not torch.jit.is_scripting() and self._runs_in_chunks(x):
            return self._blocks_in_chunks(x)
        return self.blocks(x)

    @torch.jit.unused
    def _runs_in_chunks(self, x: Tensor) -> bool:
        return runs_in_chunks(self.blocks, x, self.inference_chunk_bytes)

    @torch.jit.unused
    def inference_chunk_limit(self, x: Tensor) -> int:
        """Bytes a block's widest buffer may take for x in inference (0: no limit)."""
        return inference_chunk_limit(x, self.inference_chunk_bytes)

    @torch.jit.unused
    def inference_chunk_size(self, x: Tensor) -> int:
        """Samples per chunk for x (B, C, H, W): the batch split into the fewest near-equal chunks
        that keep the widest buffer of a block within the chunk limit (at least one sample per
        chunk)."""
        block = self.blocks[0]
        widest_channels = max(block.mlp.fc1.out_channels, block.op.widest_map_channels(x))
        per_sample = widest_channels * x.shape[2] * x.shape[3] * x.element_size()
        return chunk_size(x.shape[0], per_sample, self.inference_chunk_limit(x))

    @torch.jit.unused
    def _blocks_in_chunks(self, x: Tensor) -> Tensor:
        return run_in_chunks(self.blocks, x, self.inference_chunk_size(x))


class VMamba(nn.Module):
    """VMamba v2 / 2DVMamba image classifier and backbone (timm model API).

    Args:
        in_chans: input image channels.
        num_classes: classifier outputs (0 for no classifier).
        global_pool: pooling before the classifier ("avg", "max", "avgmax", "" for none).
        dims: stage widths (an int means (d, 2d, 4d, 8d)).
        depths: blocks per stage.
        d_state: SSM state size N.
        ssm_ratio: SS2D inner width / block width.
        dt_rank: "auto" (ceil(C/16)) or an int.
        d_conv: SS2D depthwise conv size.
        conv_bias: bias on the SS2D depthwise conv.
        mlp_ratio: MLP hidden width / block width.
        scan: "2d" (2DVMamba) or "1d" (VMamba).
        scan_backend: backend of the scan ops ("auto", "cpu", "cuda", "triton", "torch", "reference").
        routes: SS2D route set: "cross" (the paper's four routes) or "corners" (one route from each
            corner of the map; not in the paper).
        cross_scan: "fused" (one four-route op per SS2D, projections in map order) or
            "per_route" (VMamba's route-order copies; for comparison). Same parameters and results.
        drop_rate: dropout before the classifier.
        proj_drop_rate: dropout after SS2D's out_proj and inside the MLP.
        drop_path_rate: stochastic depth, rising linearly over the blocks to this value.
        inference_chunk_mib: without autograd, run each stage on batch chunks whose widest buffer
            stays within this many MiB (0: the whole batch at once; same results either way).
            "auto": ``vmamba2d.models.cpu_inference.CPU_INFERENCE_CHUNK_MIB`` (24, below glibc's mmap threshold) for inputs on
            the CPU, the whole batch on other devices. Stages with forward hooks on their
            ``blocks`` run the whole batch, so those hooks fire (:class:`VMambaStage`).
        device, dtype: where and in which dtype to create the parameters (e.g. ``device="meta"``,
            then ``to_empty(device=...)`` and :meth:`init_weights` or a state dict).

    Inputs are (B, in_chans, H, W) of any size H, W >= 1 (square or not): every stride-2 conv has
    padding 1, so stage i's map is ceil(H / 2^(i+2)) x ceil(W / 2^(i+2)).
    """

    def __init__(
        self,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        dims: Union[int, Sequence[int]] = 96,
        depths: Sequence[int] = DEFAULT_DEPTHS,
        d_state: int = 1,
        ssm_ratio: float = 1.0,
        dt_rank: Union[int, str] = "auto",
        d_conv: int = 3,
        conv_bias: bool = False,
        mlp_ratio: float = 4.0,
        scan: str = "2d",
        scan_backend: str = "auto",
        routes: str = "cross",
        cross_scan: str = "fused",
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        inference_chunk_mib: Union[float, str] = "auto",
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        chunk_mib_ok = inference_chunk_mib == "auto" or (
            isinstance(inference_chunk_mib, (int, float)) and not isinstance(inference_chunk_mib, bool)
            and inference_chunk_mib >= 0)
        if not chunk_mib_ok:
            raise ValueError(f'inference_chunk_mib must be "auto" or a number >= 0, got {inference_chunk_mib!r}')
        chunk_bytes = None if inference_chunk_mib == "auto" else int(inference_chunk_mib * 2**20)
        if isinstance(in_chans, bool) or not isinstance(in_chans, int) or in_chans < 1:
            raise ValueError(f"in_chans must be a positive int, got {in_chans!r}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f"num_classes must be an int >= 0, got {num_classes!r}")
        depths = tuple(depths)
        if not depths or any(d < 1 for d in depths):
            raise ValueError(f"depths must be a non-empty sequence of positive ints, got {depths}")
        num_stages = len(depths)
        dims = tuple(dims * 2**i for i in range(num_stages)) if isinstance(dims, int) else tuple(dims)
        if len(dims) != num_stages:
            raise ValueError(f"dims must have one width per stage ({num_stages}), got {dims}")
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.scan = scan
        self.dims = dims
        self.drop_rate = drop_rate
        self.grad_checkpointing = False

        self.stem = Stem(in_chans, dims[0], **dd)
        num_blocks = sum(depths)
        drop_paths = [drop_path_rate * i / max(num_blocks - 1, 1) for i in range(num_blocks)]
        block_kwargs = dict(
            d_state=d_state, ssm_ratio=ssm_ratio, dt_rank=dt_rank, d_conv=d_conv, conv_bias=conv_bias,
            scan=scan, scan_backend=scan_backend, routes=routes, cross_scan=cross_scan, mlp_ratio=mlp_ratio, proj_drop=proj_drop_rate,
        )
        stages = []
        self.feature_info = []
        first_block = 0
        for i in range(num_stages):
            stages.append(
                VMambaStage(
                    dims[max(i - 1, 0)], dims[i], depths[i], downsample=i > 0,
                    drop_path=drop_paths[first_block:first_block + depths[i]],
                    inference_chunk_bytes=chunk_bytes, **block_kwargs, **dd,
                )
            )
            first_block += depths[i]
            self.feature_info.append(dict(num_chs=dims[i], reduction=4 * 2**i, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self.num_features = self.head_hidden_size = dims[-1]
        self.norm = _norm(dims[-1], **dd)
        self.head = ClassifierHead(dims[-1], num_classes, pool_type=global_pool, drop_rate=drop_rate, **dd)
        self.init_weights(needs_reset=False)  # the layers initialised themselves when created

    @torch.no_grad()
    def init_weights(self, needs_reset: bool = True) -> None:
        """(Re)initialise every parameter as a new model is (timm convention).

        Args:
            needs_reset: also call each layer's own ``reset_parameters`` (needed after
                ``to_empty()`` of a model built on the meta device); False when the layers have
                just initialised themselves in ``__init__``.
        """
        if needs_reset:
            for module in self.modules():
                if module is not self and hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # VMamba initialises its Linear layers (here: Linear and the 1x1 "Linear2d" convs) with
        # trunc_normal(0.02) and zero bias; 3x3 convs keep PyTorch's default.
        is_pointwise = isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1)
        if isinstance(module, nn.Linear) or is_pointwise:
            trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        """Names of parameters to exclude from weight decay: SS2D's A_logs and Ds (as VMamba)."""
        return {name for name, _ in self.named_parameters() if name.endswith((".A_logs", ".Ds"))}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        """Regexes grouping parameters by stem / stage / block (for layer-wise LR decay)."""
        return dict(
            stem=r"^stem",
            blocks=r"^stages\.(\d+)" if coarse else [
                (r"^stages\.(\d+)\.downsample", (0,)),
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^norm", (99999,)),
            ],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each VSS block in backward instead of storing its activations."""
        self.grad_checkpointing = enable
        for stage in self.stages:
            stage.grad_checkpointing = enable

    @torch.jit.ignore
    def set_weight_packing(self, enable: bool = True) -> None:
        """CPU inference convolves with weight copies packed once in oneDNN's layout (default on:
        1.2x at batch 1 for the tiny models, same outputs; costs the weights' size in memory).
        ``False`` convolves with the parameters as stored and frees the copies."""
        for module in self.modules():
            if isinstance(module, PackedWeightConv2d):
                module.set_weight_packing(enable)

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """Replace the classifier with ``num_classes`` outputs (0 removes it); optionally change pooling.

        The new layer is created on the model's device and in its dtype.
        """
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f"num_classes must be an int >= 0, got {num_classes!r}")
        self.num_classes = num_classes
        self.head.reset(num_classes, pool_type=global_pool, in_features=self.num_features, **get_device_dtype(self))

    def forward_intermediates(
        self,
        x: Tensor,
        indices: Optional[Union[int, List[int]]] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """Stage outputs (NCHW) for stage ``indices`` (last n if int, all if None).

        Args:
            x: (B, in_chans, H, W) images.
            indices: stages to return.
            norm: apply the final norm to the last stage's output if it is taken.
            stop_early: stop after the last requested stage.
            output_fmt: only "NCHW".
            intermediates_only: return only the list of stage outputs.
        Returns:
            list of (B, dims[i], ceil(H / 2^(i+2)), ceil(W / 2^(i+2))), or (final features, that list).
        """
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        last_index = len(self.stages) - 1
        stages = self.stages if not stop_early else self.stages[: max_index + 1]
        intermediates = []
        x = self.stem(x)
        for index, stage in enumerate(stages):
            x = stage(x)
            if index in take_indices:
                intermediates.append(self.norm(x) if norm and index == last_index else x)
        if intermediates_only:
            return intermediates
        if index == last_index:
            x = self.norm(x)
        return x, intermediates

    def prune_intermediate_layers(
        self,
        indices: Union[int, List[int]] = 1,
        prune_norm: bool = False,
        prune_head: bool = True,
    ) -> List[int]:
        """Drop the stages after the last of ``indices`` (and the head / final norm if asked)."""
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        pruned_end = max_index < len(self.stages) - 1
        self.stages = self.stages[: max_index + 1]
        if prune_norm or pruned_end:
            self.norm = nn.Identity()
        if pruned_end:
            self.num_features = self.head_hidden_size = self.feature_info[max_index]["num_chs"]
        if prune_head or pruned_end:
            self.reset_classifier(0, "")
        return take_indices

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, in_chans, H, W) -> normalised last-stage map (B, num_features, ceil(H/32), ceil(W/32))."""
        x = self.stem(x)
        x = self.stages(x)
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """(B, num_features, h, w) -> logits (B, num_classes), or pooled features if pre_logits."""
        return self.head(x, pre_logits=True) if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """(B, in_chans, H, W) -> (B, num_classes) logits (pooled features when num_classes=0)."""
        return self.forward_head(self.forward_features(x))


def _require_weight_source(variant: str, pretrained_cfg: Any, pretrained_cfg_overlay: Optional[Dict]) -> Any:
    """The resolved pretrained cfg; RuntimeError, quoting the cfg's notes (how to get weights), when
    ``pretrained=True`` has nothing to load: no url, file, state dict or hub id in it."""
    cfg = resolve_pretrained_cfg(variant, pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=pretrained_cfg_overlay)
    if cfg.state_dict or cfg.file or cfg.url or cfg.hf_hub_id:
        return cfg
    name = f"{variant}.{cfg.tag}" if cfg.tag else variant
    raise RuntimeError(f"pretrained=True but {name} has no pretrained weights. " + " ".join(cfg.notes or ()))


def _check_out_indices(out_indices: Any, num_stages: int) -> None:
    """Every feature index names a stage: an int in [-num_stages, num_stages)."""
    indices = out_indices if isinstance(out_indices, (list, tuple)) else (out_indices,)
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, int) or not -num_stages <= index < num_stages:
            raise ValueError(
                f"out_indices must hold stage indices in [{-num_stages}, {num_stages - 1}] "
                f"(the model has {num_stages} stages), got {out_indices!r}"
            )


def _create_vmamba(variant: str, pretrained: bool = False, **kwargs: Any) -> VMamba:
    out_indices = kwargs.pop("out_indices", (0, 1, 2, 3))
    if kwargs.get("features_only"):
        _check_out_indices(out_indices, len(kwargs.get("depths", DEFAULT_DEPTHS)))
    # the caller's feature_cfg (e.g. {"feature_cls": "fx"}) on top of the family's defaults
    feature_cfg = {"flatten_sequential": True, "out_indices": out_indices, **(kwargs.pop("feature_cfg", None) or {})}
    guard = contextlib.nullcontext()
    if pretrained:
        source = _require_weight_source(variant, kwargs.get("pretrained_cfg"), kwargs.get("pretrained_cfg_overlay"))
        guard = clear_pretrained_errors(variant, source.url or "", source.file or "")
    with guard, official_checkpoint_loading() if pretrained else contextlib.nullcontext():
        return build_model_with_cfg(
            VMamba,
            variant,
            pretrained,
            pretrained_filter_fn=checkpoint_filter_fn,
            feature_cfg=feature_cfg,
            **kwargs,
        )


def _cfg(**kwargs: Any) -> Dict[str, Any]:
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": (7, 7),
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "stem.conv1",
        "classifier": "head.fc",
        **kwargs,
    }


# Official VMamba v2 ImageNet-1k checkpoints (release "#v2cls" of MzeroMiko/VMamba, MIT licence):
# training checkpoints in the official layout, converted on load by checkpoint_filter_fn.
VMAMBA_V2_RELEASE_URL = "https://github.com/MzeroMiko/VMamba/releases/download/%23v2cls/"
VMAMBA_V2_CHECKPOINTS = {
    "tiny": ("vssm1_tiny_0230s_ckpt_epoch_264.pth", 82.6),
    "small": ("vssm_small_0229_ckpt_epoch_222.pth", 83.6),
    "base": ("vssm_base_0229_ckpt_epoch_237.pth", 83.9),
}


def _official_vmamba_cfg(size: str) -> Dict[str, Any]:
    file_name, top1 = VMAMBA_V2_CHECKPOINTS[size]
    return _cfg(
        url=VMAMBA_V2_RELEASE_URL + file_name,
        license="mit",
        origin_url="https://github.com/MzeroMiko/VMamba",
        notes=(
            f"Official VMamba-{size[0].upper()} v2 ImageNet-1k weights; published top-1 {top1}% at 224x224 "
            "(the authors' number, not re-measured by vmamba2d).",
        ),
    )


def _vmamba2d_cfg(size: str) -> Dict[str, Any]:
    file_name = VMAMBA_V2_CHECKPOINTS[size][0]
    return _cfg(
        notes=(
            f"No public 2DVMamba weights exist (the 2DMamba authors have not released any). 2DVMamba has "
            f"VMamba v2's parameters, so it can start from the VMamba-{size[0].upper()} v2 ImageNet-1k checkpoint "
            f"({VMAMBA_V2_RELEASE_URL + file_name}): download it, then timm.create_model('vmamba2d_{size}', "
            f"pretrained=True, pretrained_cfg_overlay=dict(file='{file_name}')), and fine-tune.",
        ),
    )


default_cfgs = generate_default_cfgs({
    "vmamba2d_tiny": _vmamba2d_cfg("tiny"),
    "vmamba2d_small": _vmamba2d_cfg("small"),
    "vmamba2d_base": _vmamba2d_cfg("base"),
    "vmamba_tiny.in1k": _official_vmamba_cfg("tiny"),
    "vmamba_small.in1k": _official_vmamba_cfg("small"),
    "vmamba_base.in1k": _official_vmamba_cfg("base"),
})

# Variant hyper-parameters (docs/models.md#variants). drop_path_rate stays a training choice (timm
# convention: 0 unless passed); the paper trains T/S/B with 0.2 / 0.3 / 0.6.
_TINY = dict(dims=96, depths=(2, 2, 8, 2), d_state=1, ssm_ratio=1.0)
_SMALL = dict(dims=96, depths=(2, 2, 15, 2), d_state=1, ssm_ratio=2.0)
_BASE = dict(dims=128, depths=(2, 2, 15, 2), d_state=1, ssm_ratio=2.0)


def _variant(name: str, arch: Dict[str, Any], scan: str, pretrained: bool, kwargs: Dict[str, Any]) -> VMamba:
    if "scan" in kwargs:
        other = "vmamba_" if scan == "2d" else "vmamba2d_"
        raise TypeError(f"{name} always uses scan={scan!r}; use the {other}* models for the other scan")
    return _create_vmamba(name, pretrained=pretrained, **{**arch, "scan": scan, **kwargs})


@register_model
def vmamba2d_tiny(pretrained: bool = False, **kwargs: Any) -> VMamba:
    """2DVMamba-T: VMamba v2 tiny with 2D selective scans."""
    return _variant("vmamba2d_tiny", _TINY, "2d", pretrained, kwargs)


@register_model
def vmamba2d_small(pretrained: bool = False, **kwargs: Any) -> VMamba:
    """2DVMamba-S: VMamba v2 small with 2D selective scans."""
    return _variant("vmamba2d_small", _SMALL, "2d", pretrained, kwargs)


@register_model
def vmamba2d_base(pretrained: bool = False, **kwargs: Any) -> VMamba:
    """2DVMamba-B: VMamba v2 base with 2D selective scans."""
    return _variant("vmamba2d_base", _BASE, "2d", pretrained, kwargs)


@register_model
def vmamba_tiny(pretrained: bool = False, **kwargs: Any) -> VMamba:
    """VMamba-T (v2, "v05_noz"): the 1D-scan baseline."""
    return _variant("vmamba_tiny", _TINY, "1d", pretrained, kwargs)


@register_model
def vmamba_small(pretrained: bool = False, **kwargs: Any) -> VMamba:
    """VMamba-S (v2, "v05_noz"): the 1D-scan baseline."""
    return _variant("vmamba_small", _SMALL, "1d", pretrained, kwargs)


@register_model
def vmamba_base(pretrained: bool = False, **kwargs: Any) -> VMamba:
    """VMamba-B (v2, "v05_noz"): the 1D-scan baseline."""
    return _variant("vmamba_base", _BASE, "1d", pretrained, kwargs)
