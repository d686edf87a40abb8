"""Cutting a slide's tissue into non-overlapping patches at a requested magnification or pixel size.

A patch of ``patch_size`` pixels at the target pixel size ``mpp_target`` covers
``step = round(patch_size * mpp_target / slide.mpp)`` level-0 pixels. The grid is anchored at the
level-0 origin (cell (i, j) starts at (i * step, j * step)), so every slide's coords are
multiples of the step, as the 2D model's grid placement wants. A cell is kept when its tissue
fraction (tissue mask pixels inside it) reaches ``tissue_fraction``. Patches are read from the
pyramid level with the largest downsample not above step / patch_size, at ``read_size`` pixels of
that level, and resized to ``patch_size``. Coordinates are the level-0 top-left corners (x, y),
as CLAM writes them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from PIL import Image

from .reader import Slide, SlideError
from .tissue import TissueMask


@dataclass(frozen=True)
class PatchOptions:
    """patch_size: output patch side in pixels (512). magnification: target objective power (20;
    mpp = 10 / magnification, the usual 20x = 0.5 um/px); mpp: target micrometres per pixel
    (overrides magnification). tissue_fraction: keep a cell from this tissue share on (0.25)."""

    patch_size: int = 512
    magnification: Optional[float] = 20.0
    mpp: Optional[float] = None
    tissue_fraction: float = 0.25

    def __post_init__(self) -> None:
        if isinstance(self.patch_size, bool) or not isinstance(self.patch_size, int) or self.patch_size < 1:
            raise ValueError(f"patch_size must be a positive int of pixels, got {self.patch_size!r}")
        if self.mpp is None and self.magnification is None:
            raise ValueError("give the target magnification or mpp")
        for name in ("mpp", "magnification"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not 0 <= self.tissue_fraction <= 1:
            raise ValueError(f"tissue_fraction must be in [0, 1], got {self.tissue_fraction!r}")

    @property
    def target_mpp(self) -> float:
        """Micrometres per pixel of the patches."""
        return float(self.mpp) if self.mpp is not None else 10.0 / float(self.magnification)


@dataclass
class PatchGrid:
    """coords (n, 2) int64 level-0 (x, y) of the kept patches, row-major; step level-0 pixels per
    patch; patch_size output pixels; level / read_size / level_downsample what is read;
    target_mpp the patches' pixel size."""

    coords: np.ndarray
    step: int
    patch_size: int
    level: int
    read_size: int
    level_downsample: float
    target_mpp: float

    def read_patch(self, slide: Slide, index: int) -> np.ndarray:
        """Patch ``index`` as RGB (patch_size, patch_size, 3) uint8."""
        return read_patch(slide, self.coords[index], self.level, self.read_size, self.patch_size)


def read_patch(slide: Slide, location: np.ndarray, level: int, read_size: int, patch_size: int) -> np.ndarray:
    """The square at level-0 ``location`` (x, y): ``read_size`` pixels of ``level`` resized
    (bilinear, antialiased) to ``patch_size`` -> (patch_size, patch_size, 3) uint8."""
    pixels = slide.read_region((int(location[0]), int(location[1])), level, (read_size, read_size))
    if read_size != patch_size:
        pixels = np.asarray(Image.fromarray(pixels).resize((patch_size, patch_size), Image.BILINEAR))
    return pixels


def patch_grid(slide: Slide, tissue: TissueMask, options: PatchOptions = PatchOptions()) -> PatchGrid:
    """The tissue patches of ``slide`` on the level-0-anchored grid. Raises SlideError when the
    slide is smaller than one patch at the target pixel size."""
    step = round(options.patch_size * options.target_mpp / slide.mpp)
    width, height = slide.dimensions
    if step < 1 or step > width or step > height:
        raise SlideError(slide.slide_id, f"a {options.patch_size} px patch at {options.target_mpp:g} um/px is "
                                         f"{step} level-0 px, the slide is {width} x {height}")
    level = slide.level_for_downsample(step / options.patch_size)
    level_downsample = slide.level_downsamples[level]
    read_size = max(1, round(step / level_downsample))
    kept = []
    for y in range(0, height - step + 1, step):
        for x in range(0, width - step + 1, step):
            if tissue.fraction(x, y, x + step, y + step) >= max(options.tissue_fraction, 1e-9):
                kept.append((x, y))
    coords = np.asarray(kept, dtype=np.int64).reshape(-1, 2)
    return PatchGrid(coords, step, options.patch_size, level, read_size, level_downsample, options.target_mpp)
