"""A read slide's patches on their grid: step, cells, duplicates and the size cap.

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

Every error names the slide.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from .errors import SlideDataError
from .slide_files import RawSlide

Tensor = torch.Tensor

PLACEMENTS = ("crop", "absolute")
DUPLICATE_POLICIES = ("error", "mean", "last")
CAPS = ("pool", "crop")
MAX_GRID_CELLS = 2**31
"""Grid limit: a slide's patches may span at most this many cells (H * W). A whole-slide image at
its patch step spans about 10^5 - 10^6; far beyond that the coordinates are wrong, and the cell index
row * W + col would overflow int64 before the canvas could be allocated."""


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
class GridPlacement:
    """Grid positions of a slide's patches: coords (n, 2) int64 (x = col, y = row) on an (H, W) grid;
    cell (col, row) has its top-left corner at ``origin_px + (col, row) * step_px`` (level-0 pixels)."""

    coords: Tensor
    grid: tuple[int, int]
    origin_px: tuple[int, int]
    step_px: tuple[int, int]


def _as_pair(value: Union[int, Sequence[int]]) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value), int(value)
    pair = tuple(value)
    if len(pair) != 2:
        raise ValueError(f"expected an int or an (x, y) pair, got {value!r}")
    return pair[0], pair[1]


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
