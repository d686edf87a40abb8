"""FLOP counting for VMamba / 2DVMamba models with fvcore.

Convention (the one VMamba and 2DMamba publish): one multiply-add = one flop; convolutions, linear
layers / matmuls, layer norms and pooling are counted by fvcore's default handles, element-wise ops
(activations, additions, flips) are not; each selective scan counts 9 * B * L * D * N (+ B * D * L for
the D skip) when it is a 1D scan and 15 * B * L * D * N (+ B * D * L) when it is a 2D scan
(docs/scan.md). The scan is visible to fvcore only as the compiled kernel's custom op, so the
trace runs with the compiled backend of the model's device.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator, Sequence

import torch
import torch.nn as nn

from .ops import resolve_backend

__all__ = ["count_flops", "flops_by_operator"]


@contextlib.contextmanager
def _compiled_scans(model: nn.Module, device: torch.device) -> Iterator[int]:
    """Temporarily switch every module with a ``scan_backend`` to the device's compiled kernel.

    Yields the number of such modules. Raises RuntimeError if the kernel is unavailable.
    """
    kernel = "cuda" if device.type == "cuda" else "cpu"
    scanners = [m for m in model.modules() if hasattr(m, "scan_backend")]
    if scanners:
        try:
            resolve_backend(kernel, device)
        except (RuntimeError, ValueError) as err:
            raise RuntimeError(
                f"count_flops needs the compiled {kernel} scan kernel so that fvcore sees each scan as one "
                f"op; it is unavailable ({err}). See vmamba2d.ops.backend_info()."
            ) from err
    saved = [m.scan_backend for m in scanners]
    try:
        for m in scanners:
            m.scan_backend = kernel
        yield len(scanners)
    finally:
        for m, backend in zip(scanners, saved):
            m.scan_backend = backend


def flops_by_operator(model: nn.Module, input_size: Sequence[int] = (3, 224, 224)) -> dict[str, int]:
    """FLOPs of one forward pass of ``model`` on a (1, *input_size) image, per fvcore operator name.

    Args:
        model: a VMamba / 2DVMamba model (or any module; modules with a ``scan_backend`` attribute
            are traced with the compiled kernel of the model's device).
        input_size: (channels, height, width).
    Returns:
        {operator name: flops} (one multiply-add = one flop; see the module docstring); the scan
        appears as ``cross_selective_scan_2d_fwd`` (the models' four-route op) or
        ``selective_scan_2d_fwd``.
    Raises:
        ValueError for a bad ``input_size``; RuntimeError when the compiled scan kernel is missing
        or when the trace contains no scan although the model has scan modules.
    """
    with warnings.catch_warnings():
        # fvcore.nn scripts its focal loss at import: torch's deprecation of torch.jit.script is
        # fvcore's to act on, not our users'.
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
        from fvcore.nn import FlopCountAnalysis

    from .ops.flops import FVCORE_OP_HANDLES

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    input_size = tuple(input_size)
    if len(input_size) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in input_size):
        raise ValueError(f"input_size must be (channels, height, width) of positive ints, got {input_size}")
    reference = next(model.parameters(), None)
    device = reference.device if reference is not None else torch.device("cpu")
    dtype = reference.dtype if reference is not None and reference.is_floating_point() else torch.float32
    inputs = torch.zeros((1, *input_size), device=device, dtype=dtype)
    was_training = model.training
    model.eval()
    try:
        with _compiled_scans(model, device) as num_scanners, torch.no_grad():
            analysis = FlopCountAnalysis(model, inputs).set_op_handle(**FVCORE_OP_HANDLES)
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            by_operator = {name: int(count) for name, count in analysis.by_operator().items()}
    finally:
        model.train(was_training)
    scan_names = [name.split("::")[-1] for name in FVCORE_OP_HANDLES]
    if num_scanners and not any(by_operator.get(name, 0) for name in scan_names):
        raise RuntimeError(f"the fvcore trace holds no scan op ({scan_names}); the scans would go uncounted")
    return by_operator


def count_flops(model: nn.Module, input_size: Sequence[int] = (3, 224, 224)) -> int:
    """Total FLOPs of one forward pass of ``model`` on a (1, *input_size) image (fvcore).

    Same arguments, convention and errors as :func:`flops_by_operator`; returns the sum as an int.
    """
    return sum(flops_by_operator(model, input_size).values())
