"""Parameters and FLOPs of a whole mmseg segmentor (fvcore: one multiply-add = one flop), and the
scan's FLOP handle for mmengine's counter (what mmseg's ``analysis_tools/get_flops.py`` uses)."""
from __future__ import annotations

import warnings
from typing import Dict, Sequence

import torch
import torch.nn as nn
from mmengine.model import revert_sync_batchnorm

from vmamba2d.flops import flops_by_operator
from vmamba2d.ops import resolve_backend
from vmamba2d.ops.flops import FVCORE_OP_HANDLES

# Backends whose scan is one custom op in a trace (what the FLOP handles count).
_COMPILED_BACKENDS = ("cpu", "cuda", "triton")
_warned_untraceable = False


def register_mmengine_flop_handles() -> None:
    """Make mmengine's ``FlopAnalyzer`` (and so ``get_model_complexity_info`` and mmseg's
    get_flops tool) count each selective scan by the convention of docs/scan.md, and its
    ``ActivationAnalyzer`` count the scan's output elements as activations (as it counts a linear
    layer's), instead of reporting the scan ops as unsupported.

    mmengine's counter is a copy of fvcore's; it builds every analyzer from the module-level tables
    ``_DEFAULT_SUPPORTED_FLOP_OPS`` / ``_DEFAULT_SUPPORTED_ACT_OPS`` (op name -> handle), so the
    scan's handles are added there.
    """
    from mmengine.analysis import complexity_analysis
    from mmengine.analysis.jit_handles import generic_activation_jit

    complexity_analysis._DEFAULT_SUPPORTED_FLOP_OPS.update(FVCORE_OP_HANDLES)
    complexity_analysis._DEFAULT_SUPPORTED_ACT_OPS.update({name: generic_activation_jit() for name in FVCORE_OP_HANDLES})


def warn_if_scans_untraceable(model: nn.Module, inputs: torch.Tensor) -> None:
    """Warn once when a jit trace (a FLOP counter) would not see the scans as single ops.

    Only the compiled kernels appear in a trace as the scan op the FLOP handles count; the
    pure-PyTorch backends show up as many elementwise ops, which FLOP counters skip.
    """
    global _warned_untraceable
    if _warned_untraceable:
        return
    backends = {resolve_backend(m.scan_backend, inputs.device, inputs.dtype)
                for m in model.modules() if hasattr(m, "scan_backend")}
    slow = sorted(backends - set(_COMPILED_BACKENDS))
    if slow:
        _warned_untraceable = True
        warnings.warn(
            f"vmamba2d: tracing {type(model).__name__} with the {'/'.join(slow)} scan backend: FLOP counters "
            "(mmengine / fvcore) will not count the selective scans. Use the compiled kernel "
            "(scan_backend='auto' with the extension built; see vmamba2d.ops.backend_info()).",
            RuntimeWarning, stacklevel=2)


class _InferenceForward(nn.Module):
    """(B, 3, H, W) -> decode-head logits (B, classes, H/4, W/4): what inference computes
    (backbone, neck, decode head; the auxiliary head is training-only)."""

    def __init__(self, segmentor: nn.Module) -> None:
        super().__init__()
        self.segmentor = segmentor

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.segmentor._forward(inputs)


def segmentor_complexity(segmentor: nn.Module, shape: Sequence[int] = (512, 2048)) -> Dict[str, object]:
    """Count the parameters and FLOPs of ``segmentor`` on one (1, 3, height, width) image.

    Args:
        segmentor: an mmseg segmentor (e.g. ``EncoderDecoder``); SyncBN is reverted to BN and the
            model is put in eval mode.
        shape: (height, width) of the input.

    Returns:
        dict with ``params`` (all parameters), ``params_inference`` (without the auxiliary head),
        ``flops`` (inference forward, fvcore convention) and ``flops_by_operator``.

    Raises:
        ValueError for a bad ``shape``; RuntimeError when the model has scan layers but the compiled
        scan kernel is unavailable (see :func:`vmamba2d.flops.flops_by_operator`).
    """
    if len(shape) != 2 or not all(isinstance(s, int) and s > 0 for s in shape):
        raise ValueError(f"shape must be (height, width) positive ints, got {tuple(shape)}")
    segmentor = revert_sync_batchnorm(segmentor).eval()
    params = sum(p.numel() for p in segmentor.parameters())
    aux = getattr(segmentor, "auxiliary_head", None)
    aux_params = sum(p.numel() for p in aux.parameters()) if isinstance(aux, nn.Module) else 0
    by_operator = flops_by_operator(_InferenceForward(segmentor), (3, *shape))
    return {
        "params": params,
        "params_inference": params - aux_params,
        "flops": sum(by_operator.values()),
        "flops_by_operator": by_operator,
    }
