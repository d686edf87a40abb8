"""Parameters and FLOPs of a whole mmseg segmentor (fvcore: one multiply-add = one flop)."""
from __future__ import annotations

from typing import Dict, Sequence

import torch
import torch.nn as nn
from mmengine.model import revert_sync_batchnorm

from vmamba2d.models import SS2D
from vmamba2d.ops.flops import FVCORE_OP_HANDLES


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
        ``flops`` (inference forward, fvcore convention), ``flops_by_operator`` and
        ``unsupported_ops`` (operators fvcore could not count, with their numbers of calls).

    Raises:
        RuntimeError when the model has SS2D mixers but the compiled scan op does not appear in the
        trace (the scans would be counted as their PyTorch fallback's internal ops, or not at all).
    """
    from fvcore.nn import FlopCountAnalysis

    if len(shape) != 2 or not all(isinstance(s, int) and s > 0 for s in shape):
        raise ValueError(f"shape must be (height, width) positive ints, got {tuple(shape)}")
    segmentor = revert_sync_batchnorm(segmentor).eval()
    params = sum(p.numel() for p in segmentor.parameters())
    aux = getattr(segmentor, "auxiliary_head", None)
    aux_params = sum(p.numel() for p in aux.parameters()) if isinstance(aux, nn.Module) else 0
    inputs = torch.zeros(1, 3, *shape)
    with torch.no_grad():
        analysis = FlopCountAnalysis(_InferenceForward(segmentor), (inputs,))
        analysis.set_op_handle(**FVCORE_OP_HANDLES)
        analysis.unsupported_ops_warnings(False)
        analysis.uncalled_modules_warnings(False)
        flops = analysis.total()
    by_operator = dict(analysis.by_operator())
    num_mixers = sum(isinstance(m, SS2D) for m in segmentor.modules())
    scan_ops = [name for name in FVCORE_OP_HANDLES if by_operator.get(name.split("::")[-1], 0)
                or by_operator.get(name, 0)]
    if num_mixers and not scan_ops:
        raise RuntimeError(
            f"the model has {num_mixers} SS2D mixers but the compiled scan op ({', '.join(FVCORE_OP_HANDLES)}) "
            "is not in the traced graph, so its FLOPs would be wrong; the compiled CPU kernel is needed "
            "(vmamba2d.ops.backend_info() must report cpu_extension=True)")
    return {
        "params": params,
        "params_inference": params - aux_params,
        "flops": flops,
        "flops_by_operator": by_operator,
        "unsupported_ops": dict(analysis.unsupported_ops()),
    }
