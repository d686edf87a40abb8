"""A Conv2d that keeps its weight in oneDNN's blocked layout for CPU inference.

``F.conv2d`` on the CPU hands oneDNN the plain weight, which oneDNN reorders into its blocked
layout on every call: at batch 1 that reorder is a large part of a 1x1 convolution on a 7x7 or
14x14 map (the tiny models' last stages) and of the 3x3 downsamples
(benchmarks/model_cpu_routes.md). :class:`PackedWeightConv2d` reorders once per weight version
and reuses the result where it gives ``F.conv2d``'s output bitwise.
"""

import functools
import warnings
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn

Tensor = torch.Tensor

__all__ = ["PackedWeightConv2d", "packed_convolution_available"]

MAX_CHECKED_SHAPES = 16  # input shapes whose check result a conv keeps (then starts afresh)


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
