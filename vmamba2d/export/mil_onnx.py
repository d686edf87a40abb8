"""Export a 2DMambaMIL slide model (``vmamba2d.mil.models.MambaMIL2D``) to one ONNX file.

The file takes one slide: ``features`` (n, in_dim) float32 and ``coords`` (n, 2) int64 grid
positions (x = column, y = row), n dynamic. The grid is read from the coords at run time
(H = max row + 1, W = max col + 1: the model's ``grid_size=None``, which is the data layer's grid
unless it sets a fixed ``canvas_size``). Its outputs are the model's output dict, in order and by name (``logits``,
``attention``, ``attention_scores``, ``embedding``, then ``probabilities`` or ``hazards`` /
``survival`` / ``risk``). The eager model's value checks on the coords (non-negative, distinct)
are not in the graph (ONNX has no assertions): validate slides with
``vmamba2d.mil.models.check_slide_inputs`` before running the file, or run it through
:func:`run_mil_onnx`, which does (an empty bag otherwise ends in an onnxruntime Reshape error).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional, Union

import torch

from .onnx_export import check_opset, max_relative_difference, onnx_session, require_onnx_extra, save_checked

FEATURES_NAME = "features"
COORDS_NAME = "coords"


def random_bag(in_dim: int, patches: int, grid: tuple[int, int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A random slide: ``patches`` distinct cells of a ``grid`` (H, W), the last row and column
    occupied so the grid is exactly (H, W). Returns features (patches, in_dim) float32, coords
    (patches, 2) int64 (x, y)."""
    height, width = grid
    if min(grid) < 1 or not 2 <= patches <= height * width:
        raise ValueError(f"patches must be in [2, H * W] on a positive grid, got {patches} on {grid}")
    generator = torch.Generator().manual_seed(seed)
    corner = height * width - 1  # (H - 1, W - 1): fixes the grid's extent
    others = torch.randperm(corner, generator=generator)[: patches - 1]
    cells = torch.cat([others, torch.tensor([corner])])
    coords = torch.stack([cells % width, cells // width], dim=1)
    return torch.randn(patches, in_dim, generator=generator), coords


def export_mil_onnx(model: torch.nn.Module, path: Union[str, Path], *, opset: Optional[int] = None) -> Path:
    """Export ``model`` (a ``MambaMIL2D``; eval mode, CPU) to a self-contained ONNX file at
    ``path`` checked by ``onnx.checker`` (inputs and outputs: see the module docstring).
    Returns the path written."""
    require_onnx_extra()
    from ..mil.models import MambaMIL2D
    from .onnx_scan import translation_table

    if not isinstance(model, MambaMIL2D):
        raise TypeError(f"model must be a vmamba2d.mil.models.MambaMIL2D, got {type(model).__name__}")
    check_opset(opset)
    model = model.eval().cpu()
    features, coords = random_bag(model.in_dim, 7, (3, 4))
    with torch.no_grad(), warnings.catch_warnings():
        # torch notes that the two inputs' "patches" axes are one axis (they are, by design)
        warnings.filterwarnings("ignore", message="# The axis name: patches will not be used")
        output_names = list(model(features, coords))
        patches = torch.export.Dim("patches")
        program = torch.onnx.export(
            model, (features, coords), dynamo=True, custom_translation_table=translation_table(),
            dynamic_shapes=({0: patches}, {0: patches}), input_names=[FEATURES_NAME, COORDS_NAME],
            output_names=output_names, opset_version=opset, verbose=False,
        )
    return save_checked(program, path)


def run_mil_onnx(session, features: torch.Tensor, coords: torch.Tensor) -> list:
    """One slide through an exported file's onnxruntime ``session`` (see :func:`onnx_session`),
    after the eager model's checks: features (n, in_dim) float with n >= 1, coords (n, 2) integer,
    non-negative, distinct. Returns the file's outputs as numpy arrays, in the model's order."""
    from ..mil.models import check_slide_inputs

    in_dim = session.get_inputs()[0].shape[1]
    check_slide_inputs(features, coords, in_dim, None)
    feeds = {FEATURES_NAME: features.float().numpy(), COORDS_NAME: coords.long().numpy()}
    return session.run(None, feeds)


def mil_max_relative_error(model: torch.nn.Module, path: Union[str, Path], features: torch.Tensor,
                           coords: torch.Tensor, session=None) -> float:
    """Run one slide (features (n, in_dim), coords (n, 2)) through the ONNX file in onnxruntime and
    through ``model`` in eager PyTorch; return max |onnx - eager| / max |eager| over every output."""
    session = session or onnx_session(path)
    got = run_mil_onnx(session, features, coords)
    with torch.no_grad():
        want = [t.numpy() for t in model.eval()(features, coords).values()]
    return max_relative_difference(got, want)

