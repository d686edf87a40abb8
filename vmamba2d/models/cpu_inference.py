"""The models' CPU-only inference tricks, in one place. Both apply by themselves to inference
(no autograd) on CPU maps and leave every other call as plain PyTorch; results are unchanged.

* Packed convolution weights (:class:`PackedWeightConv2d`, every dense conv of the models).
* Batch chunking (:func:`inference_chunk_limit`, :func:`runs_in_chunks`, :func:`chunk_size`,
  :func:`run_in_chunks`, used by :class:`vmamba2d.models.vmamba.VMambaStage`).

Packed weights: ``F.conv2d`` on the CPU hands oneDNN the plain weight, which oneDNN reorders into its blocked
layout on every call: at batch 1 that reorder is a large part of a 1x1 convolution on a 7x7 or
14x14 map (the tiny models' last stages) and of the 3x3 downsamples
(benchmarks/model_cpu_routes.md). :class:`PackedWeightConv2d` reorders once per weight version
and reuses the result where it gives ``F.conv2d``'s output bitwise.

Batch chunking: glibc's malloc hands requests above its mmap threshold (at most 32 MiB) to a fresh
mmap every time, so an inference buffer of a block larger than that is page-faulted anew on every
call. Without autograd a stage runs its blocks on batch chunks small enough that a block's widest
buffer stays within ``CPU_INFERENCE_CHUNK_MIB`` (every block works per sample, so the result is
the same; benchmarks/model_cpu_routes.md).
"""

import functools
import warnings
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn

Tensor = torch.Tensor

__all__ = [
    "CPU_INFERENCE_CHUNK_MIB",
    "PackedWeightConv2d",
    "chunk_size",
    "inference_chunk_limit",
    "packed_convolution_available",
    "run_in_chunks",
    "runs_in_chunks",
]

MAX_CHECKED_SHAPES = 16  # input shapes whose check result a conv keeps (then starts afresh)
# Below glibc's largest mmap threshold (32 MiB): measured 1.12x / 1.17x inference img/s at batch
# 8 / 16 for vmamba2d_tiny on CPU, outputs unchanged (benchmarks/model_cpu_routes.md).
CPU_INFERENCE_CHUNK_MIB = 24


@functools.lru_cache(maxsize=None)
def packed_convolution_available() -> bool:
    """Whether this PyTorch has the oneDNN ops the packed path uses (``torch.ops.mkldnn.
    _reorder_convolution_weight`` / ``_convolution_pointwise``, Inductor's own) and oneDNN. Without
    them :class:`PackedWeightConv2d` is ``nn.Conv2d`` and says so once (a warning)."""
    if not torch.backends.mkldnn.is_available():
        return False
    found = all(hasattr(torch.ops.mkldnn, op) for op in ("_reorder_convolution_weight", "_convolution_pointwise"))
    if not found:
        warnings.warn("vmamba2d: this PyTorch lacks torch.ops.mkldnn._reorder_convolution_weight / "
                      "_convolution_pointwise; CPU inference convolves with unpacked weights", stacklevel=2)
    return found


class PackedWeightConv2d(nn.Conv2d):
    """``nn.Conv2d`` (same parameters, state_dict keys and results) that, without autograd on
    channels-last fp32 CPU maps, convolves with a copy of its weight reordered once into oneDNN's
    blocked layout, remade when the weight changes (its storage, dtype, device, shape or version counter).
    The copy costs the weight's size in memory; ``pack_weight = False`` (or
    :meth:`set_weight_packing`) turns it off and frees it.

    For a pre-packed weight oneDNN may pick another kernel than for the plain one (seen at batch 1
    on maps of a few pixels: 3e-7 relative differences), so the copy serves an input shape (and
    thread count) only once it has reproduced ``F.conv2d`` bitwise on a random input of that shape
    (checked once per shape, as the kernel choice does not depend on the weight's values); shapes
    where it did not run ``F.conv2d``. Elsewhere (autograd, other devices or dtypes, NCHW
    maps, autocast, tracing, scripting, compiling, oneDNN off, grouped or non-zero-padded convs)
    it is ``nn.Conv2d``. So is a 1x1 stride-1 conv on one thread below batch 16, where PyTorch
    itself does not use oneDNN.
    """

    # The packed copy is a cache of eager CPU inference: TorchScript neither reads nor types it.
    __jit_ignored_attributes__ = ["_packed_weight"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pack_weight = True
        # (weight key, weight in oneDNN layout, input shape it was packed for,
        #  {(input shape, threads): the packed weight reproduces F.conv2d})
        self._packed_weight: Optional[Tuple[tuple, Tensor, tuple, Dict[tuple, bool]]] = None

    @torch.jit.ignore
    def set_weight_packing(self, enable: bool = True) -> None:
        """Use (default) or stop using a packed weight copy in CPU inference; off frees the copy."""
        self.pack_weight = enable
        self._packed_weight = None

    def forward(self, x: Tensor) -> Tensor:
        """(B, C_in, H, W) -> (B, C_out, H_out, W_out), as ``nn.Conv2d``."""
        if torch.jit.is_scripting() or not self._uses_packed_weight(x):
            return self._conv_forward(x, self.weight, self.bias)
        return self._packed_forward(x)

    def __getstate__(self) -> Dict[str, Any]:
        return {**super().__getstate__(), "_packed_weight": None}  # a cache: not pickled or deep-copied

    @torch.jit.unused
    def _uses_packed_weight(self, x: Tensor) -> bool:
        if isinstance(x, torch.fx.Proxy) or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return False
        if not self.pack_weight or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
            return False
        if not (torch.backends.mkldnn.enabled and packed_convolution_available()):
            return False
        if self.groups != 1 or self.padding_mode != "zeros" or isinstance(self.padding, str):
            return False
        if x.device.type != "cpu" or x.dtype != torch.float32 or self.weight.dtype != torch.float32:
            return False
        if x.dim() != 4 or not x.is_contiguous(memory_format=torch.channels_last):
            return False
        # PyTorch's own choice for fp32 (Convolution.cpp, use_mkldnn): a 1x1 stride-1 conv below
        # batch 16 on one thread runs without oneDNN; keep its result there.
        pointwise = self.kernel_size == (1, 1) and self.stride == (1, 1) and self.dilation == (1, 1)
        return not (pointwise and x.shape[0] < 16 and torch.get_num_threads() == 1)

    @torch.jit.unused
    def _packed_forward(self, x: Tensor) -> Tensor:
        weight = self.weight
        weight_key = (weight.data_ptr(), weight._version, weight.dtype, weight.device, weight.shape)
        if self._packed_weight is None or self._packed_weight[0] != weight_key:
            # New values of a weight of the same dtype, device and shape are packed for the same input
            # shape as before: the same layout and kernels, so the shape checks below still hold.
            same_kind = self._packed_weight is not None and self._packed_weight[0][2:] == weight_key[2:]
            packing_shape, verdicts = self._packed_weight[2:] if same_kind else (tuple(x.shape), {})
            packed = torch.ops.mkldnn._reorder_convolution_weight(
                weight.detach(), list(self.padding), list(self.stride), list(self.dilation), self.groups,
                list(packing_shape))
            self._packed_weight = (weight_key, packed, packing_shape, verdicts)
        _, packed, _, verdicts = self._packed_weight
        shape_key = (tuple(x.shape), torch.get_num_threads())
        if shape_key not in verdicts:
            if len(verdicts) >= MAX_CHECKED_SHAPES:
                verdicts.clear()
            probe = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
            probe = probe.contiguous(memory_format=torch.channels_last)
            verdicts[shape_key] = torch.equal(self._convolve_packed(probe, packed),
                                              self._conv_forward(probe, weight, self.bias))
        if not verdicts[shape_key]:
            return self._conv_forward(x, weight, self.bias)
        return self._convolve_packed(x, packed)

    @torch.jit.unused
    def _convolve_packed(self, x: Tensor, packed: Tensor) -> Tensor:
        return torch.ops.mkldnn._convolution_pointwise(
            x, packed, self.bias, list(self.padding), list(self.stride), list(self.dilation), self.groups,
            "none", [], "")


def inference_chunk_limit(x: Tensor, chunk_bytes: Optional[int] = None) -> int:
    """Bytes a block's widest buffer may take in inference on x (0: no limit): ``chunk_bytes`` when
    given, else ``CPU_INFERENCE_CHUNK_MIB`` for maps on the CPU and no limit on other devices."""
    if chunk_bytes is not None:
        return chunk_bytes
    return CPU_INFERENCE_CHUNK_MIB * 2**20 if x.device.type == "cpu" else 0


def has_forward_hooks(module: nn.Module) -> bool:
    """Whether calling ``module`` runs forward hooks or pre-hooks: its own or global module hooks
    (``torch.nn.modules.module.register_module_forward_hook`` and its pre-hook twin)."""
    hook_dicts = (
        module._forward_hooks, module._forward_pre_hooks,
        nn.modules.module._global_forward_hooks, nn.modules.module._global_forward_pre_hooks,
    )
    return any(len(hooks) > 0 for hooks in hook_dicts)


def runs_in_chunks(blocks: nn.Module, x: Tensor, chunk_bytes: Optional[int] = None) -> bool:
    """Whether ``blocks`` run on x in batch chunks: inference only, with a limit
    (:func:`inference_chunk_limit` of ``chunk_bytes`` > 0), in eager
    mode (traced and compiled graphs keep one call on the whole batch, no shape-dependent loop),
    and not while ``blocks`` carry forward hooks (the chunks call the blocks one by one, never
    ``blocks`` itself, so its hooks would not fire)."""
    if torch.is_grad_enabled() or torch.jit.is_tracing() or isinstance(x, torch.fx.Proxy):
        return False
    if torch.compiler.is_compiling() or inference_chunk_limit(x, chunk_bytes) <= 0:
        return False
    return not has_forward_hooks(blocks)


def chunk_size(batch: int, per_sample_bytes: int, limit: int) -> int:
    """Samples per chunk: the batch split into the fewest near-equal chunks that keep
    ``per_sample_bytes`` x samples within ``limit`` (at least one sample per chunk)."""
    most = max(1, limit // max(1, per_sample_bytes))
    chunks = -(-batch // most)
    return -(-batch // chunks)


def run_in_chunks(blocks: nn.Sequential, x: Tensor, chunk: int) -> Tensor:
    """``blocks(x)`` for x (B, C, H, W) computed ``chunk`` samples at a time; each chunk's last
    block writes its residual sum straight into the output (its ``out=`` argument: no
    concatenation)."""
    if chunk >= x.shape[0]:
        return blocks(x)
    out = torch.empty_like(x)
    *first_blocks, last_block = blocks
    for part, out_part in zip(x.split(chunk), out.split(chunk)):
        for block in first_blocks:
            part = block(part)
        last_block(part, out=out_part)
    return out
