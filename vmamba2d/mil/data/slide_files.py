"""One slide's feature file: finding it, reading it (.h5 / .pt) and checking its arrays.

Slide files (one per slide, found as ``<dir>/<slide_id>.h5``, ``<dir>/h5_files/<slide_id>.h5``,
``<dir>/<slide_id>.pt`` or ``<dir>/pt_files/<slide_id>.pt``):
    HDF5 (CLAM format): dataset ``features`` (n, F) float and ``coords`` (n, 2) int = (x, y) of each
        patch's top-left corner in level-0 pixels. Optional attributes on ``coords`` or the file:
        ``patch_size`` and ``downsample`` (CLAM: grid step = patch_size * downsample).
    ``.pt``: a dict ``{"features": (n, F), "coords": (n, 2)}`` (optional ``"patch_size"``,
        ``"downsample"``). A bare feature tensor (CLAM's pt_files) has no coordinates and is refused.

Every error names the slide and the file.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import numpy as np
import torch

from vmamba2d.extras import require_extra

from .errors import SlideDataError

Tensor = torch.Tensor
PathLike = Union[str, Path]


@dataclass
class RawSlide:
    """One slide file's content: features (n, F) float32, coords_px (n, 2) int64 (x, y) level-0 pixels."""

    slide_id: str
    features: Tensor
    coords_px: Tensor
    attrs: dict[str, Any] = field(default_factory=dict)


def find_slide_file(feature_dir: PathLike, slide_id: str) -> Path:
    """The feature file of ``slide_id`` under ``feature_dir`` (.h5 preferred over .pt, flat or CLAM's
    ``h5_files`` / ``pt_files`` subfolders). Raises FileNotFoundError naming the slide and the paths tried."""
    root = Path(feature_dir)
    candidates = [root / f"{slide_id}.h5", root / "h5_files" / f"{slide_id}.h5",
                  root / f"{slide_id}.pt", root / "pt_files" / f"{slide_id}.pt"]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"slide {slide_id!r}: no feature file; tried {', '.join(str(p) for p in candidates)}")


def _plain_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in attrs.items()}


def _read_h5(path: Path, slide_id: str) -> tuple[Any, Any, dict[str, Any]]:
    require_extra("reading .h5 slide files", ("h5py",), "mil")
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            missing = [name for name in ("features", "coords") if name not in handle]
            if missing:
                raise SlideDataError(f"slide {slide_id!r}: {path}: no dataset(s) {missing} "
                                     f"(found {sorted(handle.keys())}); expected 'features' (n, F) and 'coords' (n, 2)")
            attrs = {**_plain_attrs(handle.attrs), **_plain_attrs(handle["coords"].attrs)}
            return handle["features"][()], handle["coords"][()], attrs
    except SlideDataError:
        raise
    except Exception as error:  # truncated / empty files (OSError), a group named 'features', ...
        raise SlideDataError(f"slide {slide_id!r}: {path}: cannot read HDF5 file: {_first_line(error)}") from error


def _read_pt(path: Path, slide_id: str) -> tuple[Any, Any, dict[str, Any]]:
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # weights_only refuses arbitrary Python objects
        raise SlideDataError(f"slide {slide_id!r}: {path}: holds Python objects that are not loaded "
                             "for safety (only tensors, numbers, strings and containers are); save "
                             "a dict {'features': tensor (n, F), 'coords': tensor (n, 2)}") from error
    except Exception as error:  # truncated, empty or not a torch file: torch raises many kinds
        raise SlideDataError(f"slide {slide_id!r}: {path}: cannot read the file (truncated or not "
                             f"a torch file): {_first_line(error)}") from error
    if isinstance(content, torch.Tensor):
        raise SlideDataError(f"slide {slide_id!r}: {path}: holds a bare feature tensor without coordinates; "
                             "save a dict {'features': (n, F), 'coords': (n, 2)} or use the CLAM .h5 file")
    if not isinstance(content, dict) or "features" not in content or "coords" not in content:
        raise SlideDataError(f"slide {slide_id!r}: {path}: must hold a dict with 'features' and 'coords'")
    attrs = {k: v for k, v in content.items() if k not in ("features", "coords")}
    return content["features"], content["coords"], attrs


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _as_tensor(value: Any, name: str, path: Path, slide_id: str) -> Tensor:
    """A file's array as a tensor; unsigned integers (e.g. uint32 coords) widen to int64."""
    if isinstance(value, torch.Tensor):
        return value
    array = np.asarray(value)
    if array.dtype.kind == "u":
        array = array.astype(np.int64)
    try:
        return torch.as_tensor(array)
    except (TypeError, ValueError, RuntimeError) as error:
        raise SlideDataError(f"slide {slide_id!r}: {path}: {name} have unsupported type "
                             f"{array.dtype}; expected numbers") from error


def read_slide_file(path: PathLike, slide_id: Optional[str] = None) -> RawSlide:
    """Read and check one slide file (.h5 or .pt).

    Returns RawSlide with features (n, F) float32 and coords_px (n, 2) int64. Raises SlideDataError
    naming the slide for: missing datasets, wrong dims, n mismatch, n = 0, non-finite features,
    non-integer or negative coordinates.
    """
    path = Path(path)
    slide_id = slide_id or path.stem
    if not path.is_file():
        raise FileNotFoundError(f"slide {slide_id!r}: feature file not found: {path}")
    if path.suffix == ".h5":
        features, coords, attrs = _read_h5(path, slide_id)
    elif path.suffix == ".pt":
        features, coords, attrs = _read_pt(path, slide_id)
    else:
        raise SlideDataError(f"slide {slide_id!r}: unsupported file type {path.suffix!r} (expected .h5 or .pt)")
    features = _as_tensor(features, "features", path, slide_id)
    coords = _as_tensor(coords, "coords", path, slide_id)
    return RawSlide(slide_id, *check_slide_arrays(features, coords, slide_id), attrs)


def check_slide_arrays(features: Tensor, coords: Tensor, slide_id: str) -> tuple[Tensor, Tensor]:
    """Check one slide's arrays; return (features (n, F) float32, coords (n, 2) int64)."""
    if features.dim() != 2:
        raise SlideDataError(f"slide {slide_id!r}: features must be 2-D (n, F), got shape {tuple(features.shape)}")
    if coords.dim() != 2 or coords.shape[1] != 2:
        raise SlideDataError(f"slide {slide_id!r}: coords must have shape (n, 2), got {tuple(coords.shape)}")
    if coords.shape[0] != features.shape[0]:
        raise SlideDataError(f"slide {slide_id!r}: {features.shape[0]} feature rows but {coords.shape[0]} coords rows")
    if features.shape[0] == 0:
        raise SlideDataError(f"slide {slide_id!r}: empty slide (0 patches)")
    if not features.is_floating_point():
        raise SlideDataError(f"slide {slide_id!r}: features must be floating point, got {features.dtype}")
    features = features.float()
    bad = ~torch.isfinite(features).all(dim=1)
    if bool(bad.any()):
        raise SlideDataError(f"slide {slide_id!r}: {int(bad.sum())} feature row(s) hold NaN or infinite values "
                             f"(first row {int(bad.nonzero()[0])})")
    if coords.is_floating_point():
        if not bool((coords == coords.round()).all()) or not bool(torch.isfinite(coords).all()):
            raise SlideDataError(f"slide {slide_id!r}: coords must be integer pixel positions")
    elif coords.dtype == torch.bool or coords.is_complex():
        raise SlideDataError(f"slide {slide_id!r}: coords must be integer pixel positions, got {coords.dtype}")
    coords = coords.long()
    if bool((coords < 0).any()):
        raise SlideDataError(f"slide {slide_id!r}: coords hold negative pixel positions")
    return features, coords
