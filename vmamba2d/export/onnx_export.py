"""Export a model of the zoo to one ONNX file and check it against eager PyTorch in onnxruntime.

Needs the ``onnx`` extra (``pip install "vmamba2d[onnx]"``: onnx, onnxscript, onnxruntime).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn

ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")
INPUT_NAME = "image"
# The scan translations are written in opset 18; torch's exporter cannot convert some of its own
# nodes (Split) to an older opset and then keeps 18 instead of the opset asked for.
MIN_OPSET = 18


class MissingOnnxExtraError(ImportError):
    """The packages of the ``onnx`` extra are not installed."""


def missing_onnx_packages() -> List[str]:
    """The packages of the ``onnx`` extra that cannot be imported."""
    missing = []
    for name in ONNX_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def require_onnx_extra() -> None:
    """Raise MissingOnnxExtraError naming the missing packages and the install command."""
    missing = missing_onnx_packages()
    if missing:
        raise MissingOnnxExtraError(
            f"ONNX export needs the onnx extra; missing: {', '.join(missing)}. "
            'Install it with: pip install "vmamba2d[onnx]"'
        )


def _per_route_scans(model: nn.Module) -> bool:
    return any(getattr(m, "cross_scan", None) == "per_route" for m in model.modules())


def _example_size(model: nn.Module, img_size: Tuple[int, int], dynamic_size: bool) -> Tuple[int, int]:
    """The input size to trace at: ``img_size``, raised for a dynamic export until every stage's
    map is at least 2 x 2 (a size-1 map traces as a constant 1 and the graph breaks at other sizes)."""
    if not dynamic_size:
        return img_size
    info = getattr(model, "feature_info", None)
    if info is None:
        raise TypeError(f"dynamic_size needs a model with feature_info (stage reductions), got {type(model).__name__}")
    reductions = info.reduction() if hasattr(info, "reduction") else [stage["reduction"] for stage in info]
    side = 2 * max(reductions)
    return max(img_size[0], side), max(img_size[1], side)


def _dynamic_shapes(dynamic_size: bool) -> tuple:
    dims = {0: torch.export.Dim("batch")}
    if dynamic_size:
        dims.update({2: torch.export.Dim("height"), 3: torch.export.Dim("width")})
    return (dims,)


def export_onnx(
    model: nn.Module,
    path: Union[str, Path],
    img_size: Tuple[int, int],
    *,
    in_chans: int = 3,
    dynamic_size: bool = False,
    opset: Optional[int] = None,
) -> Path:
    """Export ``model`` (eval mode, CPU) to a self-contained ONNX file at ``path``, checked by
    ``onnx.checker``.

    The graph takes ``image`` (batch, in_chans, H, W) with a dynamic batch; H and W are fixed at
    ``img_size`` unless ``dynamic_size``. The scan ops become standard ONNX operators
    (:mod:`vmamba2d.export.onnx_scan`). Models built with ``cross_scan="per_route"`` give their
    route grids to the scan as Python ints, so they export with a fixed size only.
    Returns the path written.
    """
    require_onnx_extra()
    from .onnx_scan import translation_table

    check_opset(opset)
    height, width = img_size
    if height < 1 or width < 1:
        raise ValueError(f"img_size must be two positive ints (H, W), got {img_size}")
    if dynamic_size and _per_route_scans(model):
        raise ValueError(
            "dynamic_size needs the fused scan: this model has cross_scan='per_route' mixers, whose "
            "route grids are Python ints fixed at export; export it with a fixed img_size or build "
            "it with cross_scan='fused'"
        )
    model = model.eval().cpu()
    # Batch 2, not 1: torch.export specialises a size-1 dimension instead of keeping it dynamic.
    example = torch.randn(2, in_chans, *_example_size(model, (height, width), dynamic_size),
                          generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        program = torch.onnx.export(
            model, (example,), dynamo=True, custom_translation_table=translation_table(),
            dynamic_shapes=_dynamic_shapes(dynamic_size), input_names=[INPUT_NAME],
            opset_version=opset, verbose=False,
        )
    return save_checked(program, path)


def check_opset(opset: Optional[int]) -> None:
    """Raise ValueError unless ``opset`` is None (the exporter's default) or at least MIN_OPSET."""
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, int) or opset < MIN_OPSET):
        raise ValueError(f"opset must be None or an int >= {MIN_OPSET}, got {opset!r}")


def save_checked(program, path: Union[str, Path]) -> Path:
    """Write ``program`` (a torch.onnx.ONNXProgram) to one self-contained file at ``path``, checked
    by ``onnx.checker``; return the path."""
    import onnx

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path), external_data=False)
    onnx.checker.check_model(str(path), full_check=True)
    return path


def _as_list(outputs: Union[torch.Tensor, Sequence[torch.Tensor]]) -> List[np.ndarray]:
    if isinstance(outputs, torch.Tensor):
        return [outputs.numpy()]
    return [t.numpy() for t in outputs]


def onnx_session(path: Union[str, Path], threads: Optional[int] = None):
    """An onnxruntime CPU InferenceSession for ``path`` (``threads``: intra-op threads, None:
    onnxruntime's default)."""
    require_onnx_extra()
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        # idle threads sleep instead of spinning, so they do not slow a PyTorch run beside them
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def max_relative_error(model: nn.Module, path: Union[str, Path], images: torch.Tensor, session=None) -> float:
    """Run ``images`` (batch, C, H, W) through the ONNX file in onnxruntime and through ``model``
    in eager PyTorch; return max |onnx - eager| / max |eager| over every output. The file's one
    input may have any name (``image`` from :func:`export_onnx`, ``x`` from a bare
    ``torch.onnx.export``)."""
    session = session or onnx_session(path)
    got = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    with torch.no_grad():
        want = _as_list(model.eval()(images))
    return max_relative_difference(got, want)


def max_relative_difference(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """max |got - want| / max |want| over pairs of arrays of equal shapes (AssertionError naming
    the mismatch otherwise)."""
    if len(got) != len(want):
        raise AssertionError(f"the ONNX file has {len(got)} outputs, the model {len(want)}")
    errors = []
    for g, w in zip(got, want):
        if g.shape != w.shape:
            raise AssertionError(f"ONNX output shape {g.shape} differs from eager {w.shape}")
        errors.append(float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), np.finfo(np.float32).tiny)))
    return max(errors)
