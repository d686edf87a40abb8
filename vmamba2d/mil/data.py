"""Whole-slide-image MIL data: per-slide feature files -> per-slide grid -> ``SlideDataset``.

Slide files (one per slide, found as ``<dir>/<slide_id>.h5``, ``<dir>/h5_files/<slide_id>.h5``,
``<dir>/<slide_id>.pt`` or ``<dir>/pt_files/<slide_id>.pt``):
    HDF5 (CLAM format): dataset ``features`` (n, F) float and ``coords`` (n, 2) int = (x, y) of each
        patch's top-left corner in level-0 pixels. Optional attributes on ``coords`` or the file:
        ``patch_size`` and ``downsample`` (CLAM: grid step = patch_size * downsample).
    ``.pt``: a dict ``{"features": (n, F), "coords": (n, 2)}`` (optional ``"patch_size"``,
        ``"downsample"``). A bare feature tensor (CLAM's pt_files) has no coordinates and is refused.

Placement (``place_on_grid``, options in ``GridOptions``): grid step = ``GridOptions.patch_step``
if given, else from the attributes, else the GCD of the coordinate offsets (which must equal the most
common spacing, otherwise the coordinates are irregular and the step must be given). Cell =
(x // step_x, y // step_y) as the official code; ``placement="crop"`` (default) shifts the cells to
the tissue bounding box; ``placement="absolute"`` keeps them (official parity, docs/mil.md#fixed-canvas),
optionally on a fixed ``canvas_size=(H, W)``. Patches landing in one cell are an error
(``duplicates="error"``) or averaged (``"mean"``) or the last row wins (``"last"``, official).
Giant slides: with ``max_cells`` set, a grid with more cells is 2 x 2 mean-pooled until it fits
(``cap="pool"``) or cut to a window of at most ``max_cells`` cells (``cap="crop"``: a random window
around a random tissue cell in training, the window holding the most tissue at evaluation).

Labels:
    ``read_label_csv(path, label_map=None, ...)`` -> (list[SlideEntry], label_map). Columns
        ``slide_id,label,split`` by default (BRACS-style); other names via keywords (e.g. DHMC:
        ``slide_column="File Name", label_column="Diagnosis", split_column="Data Split"``).
    ``read_survival_csv(path, ...)`` -> list[SlideEntry], one per patient (``case_id``), from
        ``,case_id,slide_id,censorship,survival_months`` (censorship 1 = censored).
    ``read_split_csv(path)`` -> {"train": [...], "val": [...], "test": [...]} from ``,train,val,test``
        columns of ids (``splits_k.csv``, HIPT-style splits); ``select_split(entries, ids, by=...)``.

Dataset:
    ``SlideDataset(entries, feature_dir, grid=GridOptions(), in_dim=None, train=False, seed=0)``;
    ``dataset[i]`` -> ``SlideRecord`` with
        slide_id: str                features: (n, F) float32       coords: (n, 2) int64 grid (x=col, y=row)
        grid: (H, W) tuple            origin_px: (x0, y0) level-0 pixels of cell (0, 0)
        step_px: (sx, sy) pixels per cell (times 2**k after k poolings)
        label: int | None (class index, or the survival time bin when the entry carries one)
        case_id, time, censorship: survival fields (None for classification)
    Feed a record to a model as ``model(record.features, record.coords, grid_size=record.grid)``
    (with ``placement="crop"`` the grid is the coords' extent anyway; with a fixed ``canvas_size`` it
    is not). Use it with ``DataLoader(dataset, batch_size=None, shuffle=True)``; ``record.to(device)``
    moves the tensors; ``dataset.check_all()`` reads every slide once and reports all unusable ones.
    Survival time bins come from the training patients (``vmamba2d.mil.survival``); put them into
    the entries with ``dataclasses.replace(entry, label=bin)``.

Every error names the slide (or the CSV row) and the problem.
"""
from __future__ import annotations

import csv
import math
import pickle
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from vmamba2d.extras import require_extra

Tensor = torch.Tensor
PathLike = Union[str, Path]

PLACEMENTS = ("crop", "absolute")
DUPLICATE_POLICIES = ("error", "mean", "last")
CAPS = ("pool", "crop")
SPLIT_NAMES = ("train", "val", "test")
MAX_GRID_CELLS = 2**31
"""Grid limit: a slide's patches may span at most this many cells (H * W). A whole-slide image at
its patch step spans about 10^5 - 10^6; far beyond that the coordinates are wrong, and the cell index
row * W + col would overflow int64 before the canvas could be allocated."""
SLIDE_SUFFIXES = (".svs", ".tif", ".tiff", ".ndpi", ".mrxs", ".scn", ".h5", ".pt", ".png", ".jpg")


class SlideDataError(ValueError):
    """A slide file or a label / split table is unusable; the message names the slide or row."""


@dataclass(frozen=True)
class GridOptions:
    """How a slide's patches are placed on its grid (see the module docstring).

    patch_step: level-0 pixels between neighbouring cells, an int or (x, y); None = from the file.
    placement: ``"crop"`` (tissue bounding box) or ``"absolute"`` (official parity).
    canvas_size: fixed (H, W) for ``placement="absolute"`` (official per-dataset canvas); None = per slide.
    duplicates: ``"error"``, ``"mean"`` or ``"last"`` for patches sharing a cell.
    max_cells: cap on H * W (None = no cap). cap: ``"pool"`` or ``"crop"``.
    """

    patch_step: Optional[Union[int, tuple[int, int]]] = None
    placement: str = "crop"
    canvas_size: Optional[tuple[int, int]] = None
    duplicates: str = "error"
    max_cells: Optional[int] = None
    cap: str = "pool"

    def __post_init__(self) -> None:
        for name, value, choices in (("placement", self.placement, PLACEMENTS),
                                     ("duplicates", self.duplicates, DUPLICATE_POLICIES), ("cap", self.cap, CAPS)):
            if value not in choices:
                raise ValueError(f"GridOptions.{name} must be one of {choices}, got {value!r}")
        if self.patch_step is not None:
            steps = _as_pair(self.patch_step)
            if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in steps):
                raise ValueError(f"GridOptions.patch_step must be a positive int or (x, y) pair, got {self.patch_step!r}")
        if self.canvas_size is not None:
            if self.placement != "absolute":
                raise ValueError("GridOptions.canvas_size needs placement='absolute'")
            if len(self.canvas_size) != 2 or min(self.canvas_size) < 1:
                raise ValueError(f"GridOptions.canvas_size must be (H, W) >= 1, got {self.canvas_size!r}")
        if self.max_cells is not None and (isinstance(self.max_cells, bool) or not isinstance(self.max_cells, int)
                                           or self.max_cells < 1):
            raise ValueError(f"GridOptions.max_cells must be a positive int or None, got {self.max_cells!r}")
        if self.max_cells is not None and self.placement == "absolute":
            raise ValueError("GridOptions.max_cells (a size cap) cannot be combined with placement='absolute'")


@dataclass
class RawSlide:
    """One slide file's content: features (n, F) float32, coords_px (n, 2) int64 (x, y) level-0 pixels."""

    slide_id: str
    features: Tensor
    coords_px: Tensor
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class GridPlacement:
    """Grid positions of a slide's patches: coords (n, 2) int64 (x = col, y = row) on an (H, W) grid;
    cell (col, row) has its top-left corner at ``origin_px + (col, row) * step_px`` (level-0 pixels)."""

    coords: Tensor
    grid: tuple[int, int]
    origin_px: tuple[int, int]
    step_px: tuple[int, int]


@dataclass(frozen=True)
class SlideEntry:
    """One row of a label / survival table: which slide file to load and its targets.

    slide_id: file stem to load; slide_ids: every slide of the patient (survival; the first is loaded);
    label: class index (or survival time bin); case_id / time / censorship: survival fields; split.
    """

    slide_id: str
    label: Optional[int] = None
    split: Optional[str] = None
    case_id: Optional[str] = None
    time: Optional[float] = None
    censorship: Optional[int] = None
    slide_ids: tuple[str, ...] = ()


@dataclass
class SlideRecord:
    """What ``SlideDataset`` returns per slide (see the module docstring for the fields)."""

    slide_id: str
    features: Tensor
    coords: Tensor
    grid: tuple[int, int]
    origin_px: tuple[int, int]
    step_px: tuple[int, int]
    label: Optional[int] = None
    case_id: Optional[str] = None
    time: Optional[float] = None
    censorship: Optional[int] = None

    def to(self, device: Union[str, torch.device]) -> "SlideRecord":
        """A copy with ``features`` and ``coords`` on ``device``."""
        return replace(self, features=self.features.to(device), coords=self.coords.to(device))


def _as_pair(value: Union[int, Sequence[int]]) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value), int(value)
    pair = tuple(value)
    if len(pair) != 2:
        raise ValueError(f"expected an int or an (x, y) pair, got {value!r}")
    return pair[0], pair[1]


# ----------------------------------------------------------------------------------------- files

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


# ------------------------------------------------------------------------------------- placement

def patch_step_from_attrs(attrs: Mapping[str, Any]) -> Optional[tuple[int, int]]:
    """Level-0 grid step (x, y) from CLAM attributes: ``patch_size`` * ``downsample`` (1 if absent); None without ``patch_size``."""
    if "patch_size" not in attrs:
        return None
    size = float(np.asarray(attrs["patch_size"]).reshape(-1)[0])
    downsample = np.asarray(attrs.get("downsample", 1.0), dtype=np.float64).reshape(-1)
    ds_x, ds_y = (downsample[0], downsample[0]) if downsample.size == 1 else (downsample[0], downsample[1])
    return max(1, round(size * ds_x)), max(1, round(size * ds_y))


def _axis_step(values: np.ndarray) -> Optional[tuple[int, int]]:
    """(GCD of offsets, most common spacing) of one coordinate axis; None when all values are equal."""
    distinct = np.unique(values)
    if distinct.size < 2:
        return None
    gcd = int(np.gcd.reduce(distinct - distinct[0]))
    spacings = Counter(np.diff(distinct).tolist())
    return gcd, int(spacings.most_common(1)[0][0])


def infer_patch_step(coords_px: Tensor, slide_id: str) -> tuple[int, int]:
    """Grid step (x, y) from the coordinate GCD per axis (the other axis's step when one axis has a
    single value; 1 for a single cell). Raises SlideDataError when the GCD is not the most common
    spacing (irregular coordinates: pass ``GridOptions.patch_step``)."""
    steps = []
    for axis, name in ((0, "x"), (1, "y")):
        found = _axis_step(coords_px[:, axis].numpy())
        if found is not None and found[0] != found[1]:
            raise SlideDataError(
                f"slide {slide_id!r}: {name} coordinates are not on a regular grid (GCD of offsets {found[0]} px, "
                f"most common spacing {found[1]} px); set the patch step explicitly (GridOptions.patch_step)")
        steps.append(None if found is None else found[0])
    if steps[0] is None and steps[1] is None:
        return 1, 1
    return steps[0] or steps[1], steps[1] or steps[0]


def place_on_grid(coords_px: Tensor, *, slide_id: str = "?", step: Union[int, tuple[int, int]],
                  placement: str = "crop", canvas_size: Optional[tuple[int, int]] = None) -> GridPlacement:
    """Pixel coords (n, 2) (x, y) -> grid positions (n, 2) (col, row) = coords // step, shifted to the
    tissue bounding box (``placement="crop"``) or kept (``"absolute"``, on ``canvas_size`` if given)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    step_x, step_y = _as_pair(step)
    cells = torch.div(coords_px, torch.tensor([step_x, step_y]), rounding_mode="floor")
    if placement == "crop":
        low = cells.min(dim=0).values
        cells = cells - low
        origin = (int(low[0]) * step_x, int(low[1]) * step_y)
    else:
        origin = (0, 0)
    needed = (int(cells[:, 1].max()) + 1, int(cells[:, 0].max()) + 1)
    if needed[0] * needed[1] > MAX_GRID_CELLS:
        far = coords_px[cells.sum(dim=1).argmax()].tolist()
        raise SlideDataError(
            f"slide {slide_id!r}: patches span a grid of (H, W) = {needed} cells at step ({step_x}, {step_y}) px "
            f"(e.g. a patch at (x, y) = ({far[0]}, {far[1]}) px), beyond the grid limit of {MAX_GRID_CELLS} cells; "
            "the coordinates are wrong (or the patch step is)")
    grid = needed
    if canvas_size is not None:
        grid = (int(canvas_size[0]), int(canvas_size[1]))
        if needed[0] > grid[0] or needed[1] > grid[1]:
            raise SlideDataError(f"slide {slide_id!r}: patches reach grid (H, W) = {needed}, beyond the fixed "
                                 f"canvas_size {grid}")
    return GridPlacement(cells, grid, origin, (step_x, step_y))


def grid_to_pixels(coords: Tensor, origin_px: tuple[int, int], step_px: tuple[int, int]) -> Tensor:
    """Grid positions (n, 2) -> level-0 pixel (x, y) of each cell's top-left corner (n, 2)."""
    return coords * torch.tensor(step_px) + torch.tensor(origin_px)


def merge_duplicates(features: Tensor, coords: Tensor, grid: tuple[int, int], policy: str,
                     slide_id: str) -> tuple[Tensor, Tensor]:
    """Resolve patches sharing a cell: ``"error"`` raises, ``"mean"`` averages, ``"last"`` keeps the
    last file row. (n, F), (n, 2) -> (m, F), (m, 2) with distinct cells (row-major cell order when
    merged; unchanged when no cell is shared)."""
    index = coords[:, 1] * grid[1] + coords[:, 0]
    unique, inverse, counts = torch.unique(index, return_inverse=True, return_counts=True)
    if unique.numel() == index.numel():
        return features, coords
    if policy == "error":
        cell = int(unique[counts > 1][0])
        raise SlideDataError(
            f"slide {slide_id!r}: {int((counts > 1).sum())} grid cell(s) hold more than one patch (e.g. col "
            f"{cell % grid[1]}, row {cell // grid[1]}); check the patch step (overlapping patches: patch_step = "
            "their spacing) or set GridOptions.duplicates")
    cell_coords = torch.stack([unique % grid[1], unique // grid[1]], dim=1)
    if policy == "mean":
        sums = features.new_zeros(unique.numel(), features.shape[1]).index_add_(0, inverse, features)
        return sums / counts.unsqueeze(1).to(features.dtype), cell_coords
    last_row = torch.zeros(unique.numel(), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(index.numel()), reduce="amax")
    return features[last_row], cell_coords


def pool_2x2(features: Tensor, coords: Tensor) -> tuple[Tensor, Tensor, tuple[int, int]]:
    """Mean of the occupied cells of each 2 x 2 block: (n, F), (n, 2) -> (m, F), (m, 2), grid (H', W')."""
    pooled = torch.div(coords, 2, rounding_mode="floor")
    width = int(pooled[:, 0].max()) + 1
    height = int(pooled[:, 1].max()) + 1
    features, pooled = merge_duplicates(features, pooled, (height, width), "mean", "")
    return features, pooled, (height, width)


def _window_shape(grid: tuple[int, int], max_cells: int) -> tuple[int, int]:
    side = max(1, math.isqrt(max_cells))
    height = min(grid[0], side)
    return height, min(grid[1], max_cells // height)


def _best_window(occupied: Tensor, shape: tuple[int, int]) -> tuple[int, int]:
    """Top-left (row, col) of the ``shape`` window holding the most tissue cells (first in raster order on ties)."""
    summed = torch.nn.functional.avg_pool2d(occupied[None, None].double(), shape, stride=1)[0, 0]
    flat = int(torch.argmax(summed))
    return flat // summed.shape[1], flat % summed.shape[1]


def crop_window(features: Tensor, coords: Tensor, grid: tuple[int, int], max_cells: int,
                generator: Optional[torch.Generator]) -> tuple[Tensor, Tensor, tuple[int, int], tuple[int, int]]:
    """Keep the patches inside a window of at most ``max_cells`` cells, re-cropped to their bounding box.

    With a ``generator`` (training) the window is centred on a random tissue cell (clamped to the
    grid); without, it is the window holding the most tissue. Returns (features, coords, grid, shift)
    where ``shift`` = (col, row) of the new grid's origin in the old grid.
    """
    height, width = _window_shape(grid, max_cells)
    if generator is not None:
        centre = coords[int(torch.randint(coords.shape[0], (1,), generator=generator))]
        top = min(max(int(centre[1]) - height // 2, 0), grid[0] - height)
        left = min(max(int(centre[0]) - width // 2, 0), grid[1] - width)
    else:
        occupied = torch.zeros(grid, dtype=torch.bool)
        occupied[coords[:, 1], coords[:, 0]] = True
        top, left = _best_window(occupied, (height, width))
    inside = ((coords[:, 1] >= top) & (coords[:, 1] < top + height)
              & (coords[:, 0] >= left) & (coords[:, 0] < left + width))
    kept = coords[inside]
    low = kept.min(dim=0).values
    kept = kept - low
    new_grid = (int(kept[:, 1].max()) + 1, int(kept[:, 0].max()) + 1)
    return features[inside], kept, new_grid, (int(low[0]), int(low[1]))


def prepare_slide(raw: RawSlide, options: GridOptions = GridOptions(), *,
                  generator: Optional[torch.Generator] = None) -> tuple[Tensor, GridPlacement]:
    """Place a read slide on its grid: step, placement, duplicates, cap. Returns (features (m, F), placement).

    ``generator`` is used by ``cap="crop"`` in training (random window); None = deterministic.
    """
    step = (_as_pair(options.patch_step) if options.patch_step is not None
            else patch_step_from_attrs(raw.attrs) or infer_patch_step(raw.coords_px, raw.slide_id))
    placement = place_on_grid(raw.coords_px, slide_id=raw.slide_id, step=step, placement=options.placement,
                              canvas_size=options.canvas_size)
    features, coords = merge_duplicates(raw.features, placement.coords, placement.grid, options.duplicates,
                                        raw.slide_id)
    grid, origin, step_px = placement.grid, placement.origin_px, placement.step_px
    if options.max_cells is not None and grid[0] * grid[1] > options.max_cells:
        if options.cap == "pool":
            while grid[0] * grid[1] > options.max_cells:
                features, coords, grid = pool_2x2(features, coords)
                step_px = (step_px[0] * 2, step_px[1] * 2)
        else:
            features, coords, grid, shift = crop_window(features, coords, grid, options.max_cells, generator)
            origin = (origin[0] + shift[0] * step_px[0], origin[1] + shift[1] * step_px[1])
    return features, GridPlacement(coords, grid, origin, step_px)


# ---------------------------------------------------------------------------------------- tables

def _clean_id(value: str, strip_suffixes: Sequence[str]) -> str:
    value = value.strip()
    for suffix in strip_suffixes:
        if value.lower().endswith(suffix):
            return value[: -len(suffix)]
    return value


def _read_rows(path: PathLike, required: Sequence[str]) -> list[dict[str, str]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"table not found: {path}")
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            missing = [c for c in required if c not in columns]
            if missing:
                raise SlideDataError(f"{path}: missing column(s) {missing}; found {columns}")
            return list(reader)
    except UnicodeDecodeError as error:
        raise SlideDataError(f"{path}: not a UTF-8 text CSV table (byte {error.start}: "
                             f"{error.reason})") from None


def _normalise_split(value: Optional[str], path: Path, line: int) -> Optional[str]:
    if value is None or not value.strip():
        return None
    split = value.strip().lower()
    split = {"validation": "val", "valid": "val"}.get(split, split)
    if split not in SPLIT_NAMES:
        raise SlideDataError(f"{path} line {line}: split {value!r} is not one of {SPLIT_NAMES}")
    return split


def read_label_csv(path: PathLike, *, label_map: Optional[Mapping[str, int]] = None,
                   slide_column: str = "slide_id", label_column: str = "label",
                   split_column: Optional[str] = "split", drop_unmapped: bool = False,
                   strip_suffixes: Sequence[str] = SLIDE_SUFFIXES) -> tuple[list[SlideEntry], dict[str, int]]:
    """Classification table -> (entries, label_map).

    ``label_map`` maps the label column's text to class indices; None = the sorted distinct labels
    numbered 0..C-1 (integers sort numerically). A label not in the map raises SlideDataError
    naming the row, unless ``drop_unmapped=True`` (e.g. TCGA-BRCA keeps IDC / ILC and drops the
    other codes) leaves such rows out; an empty slide id or a repeated one raises. ``split_column=None`` or a missing
    column leaves ``split`` None; split values are train / val / test (any case; "validation" ok).
    File suffixes such as ``.svs`` are removed from slide ids (whole suffix, not characters).
    """
    path = Path(path)
    rows = _read_rows(path, [slide_column, label_column])
    texts = [row[label_column].strip() for row in rows]
    if label_map is None:
        distinct = sorted({t for t in texts if t}, key=lambda t: (0, int(t), "") if t.lstrip("-").isdigit() else (1, 0, t))
        label_map = {t: i for i, t in enumerate(distinct)}
    label_map = {str(k): int(v) for k, v in label_map.items()}
    entries, seen = [], set()
    for line, (row, text) in enumerate(zip(rows, texts), start=2):
        slide_id = _clean_id(row[slide_column], strip_suffixes)
        if not slide_id:
            raise SlideDataError(f"{path} line {line}: empty {slide_column!r}")
        if slide_id in seen:
            raise SlideDataError(f"{path} line {line}: slide {slide_id!r} is listed twice")
        seen.add(slide_id)
        if text not in label_map:
            if drop_unmapped:
                continue
            raise SlideDataError(f"{path} line {line}: slide {slide_id!r} has label {text!r}, not in the label map "
                                 f"{sorted(label_map)}")
        split = _normalise_split(row.get(split_column) if split_column else None, path, line)
        entries.append(SlideEntry(slide_id, label=label_map[text], split=split, slide_ids=(slide_id,)))
    return entries, label_map


def read_survival_csv(path: PathLike, *, case_column: str = "case_id", slide_column: str = "slide_id",
                      censorship_column: str = "censorship", time_column: str = "survival_months",
                      strip_suffixes: Sequence[str] = SLIDE_SUFFIXES) -> list[SlideEntry]:
    """Survival table (one row per slide) -> one entry per patient, in first-appearance order.

    Each entry has ``case_id``, ``time``, ``censorship`` (1 = censored, 0 = event), ``slide_ids`` (all
    the patient's slides, file order) and ``slide_id`` = the first of them (the slide that is loaded,
    as in the official code); ``label`` is None until the caller assigns time bins. Rows of one
    patient with different times or censorship, censorship not 0/1, or a non-finite / negative time
    raise SlideDataError naming the row.
    """
    path = Path(path)
    rows = _read_rows(path, [case_column, slide_column, censorship_column, time_column])
    patients: dict[str, dict[str, Any]] = {}
    for line, row in enumerate(rows, start=2):
        case_id = row[case_column].strip()
        slide_id = _clean_id(row[slide_column], strip_suffixes)
        if not case_id or not slide_id:
            raise SlideDataError(f"{path} line {line}: empty {case_column!r} or {slide_column!r}")
        try:
            time = float(row[time_column])
            censorship = int(float(row[censorship_column]))
        except ValueError as error:
            raise SlideDataError(f"{path} line {line} (case {case_id!r}): unreadable time / censorship: {error}") from error
        if not math.isfinite(time) or time < 0:
            raise SlideDataError(f"{path} line {line} (case {case_id!r}): survival time {time} must be finite and >= 0")
        if censorship not in (0, 1):
            raise SlideDataError(f"{path} line {line} (case {case_id!r}): censorship must be 0 or 1, got {censorship}")
        patient = patients.setdefault(case_id, dict(time=time, censorship=censorship, slides=[]))
        if (patient["time"], patient["censorship"]) != (time, censorship):
            raise SlideDataError(f"{path} line {line}: case {case_id!r} has rows with different survival time / censorship")
        if slide_id not in patient["slides"]:
            patient["slides"].append(slide_id)
    return [SlideEntry(p["slides"][0], case_id=case_id, time=p["time"], censorship=p["censorship"],
                       slide_ids=tuple(p["slides"])) for case_id, p in patients.items()]


def read_split_csv(path: PathLike, *, strip_suffixes: Sequence[str] = SLIDE_SUFFIXES) -> dict[str, list[str]]:
    """Split table with columns ``train``, ``val``, ``test`` (any may be absent or short; blank cells
    ignored; an unnamed index column is skipped) -> {split: ids in order, repeats removed}."""
    path = Path(path)
    rows = _read_rows(path, [])
    columns = [c for c in (rows[0].keys() if rows else []) if c and c.strip().lower() in ("train", "val", "test")]
    if not columns:
        raise SlideDataError(f"{path}: needs at least one of the columns train, val, test")
    splits: dict[str, list[str]] = {}
    for column in columns:
        ids = [_clean_id(row[column] or "", strip_suffixes) for row in rows]
        splits[column.strip().lower()] = list(dict.fromkeys(i for i in ids if i))
    return splits


def select_split(entries: Iterable[SlideEntry], ids: Iterable[str], *, by: str = "slide_id",
                 exclude: Iterable[str] = ()) -> list[SlideEntry]:
    """The entries whose ``by`` field (``"slide_id"`` or ``"case_id"``) is in ``ids``, in the order of
    ``ids``, minus those in ``exclude`` (e.g. patients also in the training split; docs/mil.md).
    An id with no entry raises SlideDataError."""
    if by not in ("slide_id", "case_id"):
        raise ValueError(f"by must be 'slide_id' or 'case_id', got {by!r}")
    lookup = {getattr(e, by): e for e in entries}
    excluded = set(exclude)
    missing = [i for i in ids if i not in lookup]
    if missing:
        raise SlideDataError(f"{len(missing)} split id(s) have no table entry (by {by}), e.g. {missing[:3]}")
    return [lookup[i] for i in dict.fromkeys(ids) if i not in excluded]


# --------------------------------------------------------------------------------------- dataset

class SlideDataset(Dataset):
    """Slides of ``entries`` read from ``feature_dir`` and placed on their grids (one ``SlideRecord`` each).

    Args:
        entries: SlideEntry list (from the table readers, possibly with survival bins as labels).
        feature_dir: folder of ``<slide_id>.h5`` / ``.pt`` files (or CLAM's h5_files / pt_files).
        grid: GridOptions.
        in_dim: expected feature size F (None = not checked).
        label_required: raise if an entry has no label (training / evaluation sets).
        train: training mode (random crop windows for ``cap="crop"``; reseed with ``set_epoch``).
        seed: base seed of the crop windows.
    Missing files are reported for all entries at construction (FileNotFoundError listing them).
    """

    def __init__(self, entries: Sequence[SlideEntry], feature_dir: PathLike, *, grid: GridOptions = GridOptions(),
                 in_dim: Optional[int] = None, label_required: bool = True, train: bool = False,
                 seed: int = 0) -> None:
        self.entries = list(entries)
        self.grid_options = grid
        self.in_dim = in_dim
        self.train = train
        self.seed = seed
        self.epoch = 0
        if label_required:
            unlabelled = [e.slide_id for e in self.entries if e.label is None]
            if unlabelled:
                raise SlideDataError(f"{len(unlabelled)} slide(s) have no label, e.g. {unlabelled[:3]}")
        self.paths, missing = [], []
        for entry in self.entries:
            try:
                self.paths.append(find_slide_file(feature_dir, entry.slide_id))
            except FileNotFoundError:
                missing.append(entry.slide_id)
        if missing:
            raise FileNotFoundError(f"{len(missing)} slide(s) have no .h5 / .pt file under {feature_dir}: "
                                    f"{missing[:5]}{' ...' if len(missing) > 5 else ''}")

    def __len__(self) -> int:
        return len(self.entries)

    def set_epoch(self, epoch: int) -> None:
        """Reseed the training crop windows for ``epoch`` (deterministic given seed and epoch)."""
        self.epoch = epoch

    def check_all(self) -> None:
        """Read and place every slide once; raise one SlideDataError listing every unusable slide."""
        problems = []
        for index in range(len(self)):
            try:
                self[index]
            except (SlideDataError, FileNotFoundError) as error:
                problems.append(str(error))
        if problems:
            raise SlideDataError(f"{len(problems)} of {len(self)} slide(s) are unusable:\n  " + "\n  ".join(problems))

    def __getitem__(self, index: int) -> SlideRecord:
        entry = self.entries[index]
        raw = read_slide_file(self.paths[index], entry.slide_id)
        if self.in_dim is not None and raw.features.shape[1] != self.in_dim:
            raise SlideDataError(f"slide {entry.slide_id!r}: features have F={raw.features.shape[1]}, expected "
                                 f"in_dim={self.in_dim}")
        generator = None
        if self.train:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 10_007 + index)
        features, placement = prepare_slide(raw, self.grid_options, generator=generator)
        return SlideRecord(entry.slide_id, features, placement.coords, placement.grid, placement.origin_px,
                           placement.step_px, label=entry.label, case_id=entry.case_id, time=entry.time,
                           censorship=entry.censorship)
