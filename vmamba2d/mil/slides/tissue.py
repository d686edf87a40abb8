"""Tissue detection as CLAM does it: a low-resolution level -> saturation channel -> median blur ->
Otsu threshold -> morphological closing -> tissue regions above a minimum area, holes above a
minimum area excluded (the largest ``max_holes`` per region).

CLAM traces the regions with OpenCV contours; here the same regions are found as connected
components of the mask (8-connected tissue, 4-connected holes, as contours and their holes are),
so no OpenCV is needed. Areas are physical (mm^2 of the slide), so they mean the same at any scan
magnification.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from .reader import Slide


@dataclass(frozen=True)
class TissueOptions:
    """Tissue detection parameters.

    seg_downsample: detect on the level with the largest downsample not above this (CLAM: 64).
    median_kernel: side of the median blur (odd; CLAM's ``mthresh`` 7).
    close_kernel: side of the square closing element in pixels of that level (CLAM's ``close``; 0 = none).
    saturation_threshold: fixed threshold on the 0-255 saturation; None = Otsu's threshold of the
        blurred saturation, not below ``min_saturation`` (so a blank slide's noise is no tissue).
    min_saturation: floor of Otsu's threshold (CLAM's fixed ``sthresh`` is 8).
    min_tissue_area: mm^2; smaller regions (their area less their kept holes) are dropped.
    min_hole_area: mm^2; smaller holes count as tissue.
    max_holes: the largest holes kept per region (CLAM's ``max_n_holes`` 8).
    """

    seg_downsample: float = 64.0
    median_kernel: int = 7
    close_kernel: int = 4
    saturation_threshold: float | None = None
    min_saturation: float = 8.0
    min_tissue_area: float = 0.05
    min_hole_area: float = 0.01
    max_holes: int = 8

    def __post_init__(self) -> None:
        if not self.seg_downsample >= 1:
            raise ValueError(f"seg_downsample must be >= 1, got {self.seg_downsample!r}")
        if self.median_kernel < 1 or self.median_kernel % 2 == 0:
            raise ValueError(f"median_kernel must be a positive odd number of pixels, got {self.median_kernel!r}")
        if self.close_kernel < 0:
            raise ValueError(f"close_kernel must be >= 0 pixels, got {self.close_kernel!r}")
        if self.saturation_threshold is not None and not 0 <= self.saturation_threshold <= 255:
            raise ValueError(f"saturation_threshold must be in [0, 255] or None (Otsu), got {self.saturation_threshold!r}")
        for name in ("min_tissue_area", "min_hole_area", "min_saturation"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.max_holes < 0:
            raise ValueError(f"max_holes must be >= 0, got {self.max_holes!r}")


@dataclass
class TissueMask:
    """mask (h, w) bool at pyramid ``level``; ``downsample`` (x, y) level-0 pixels per mask pixel;
    ``threshold`` the saturation threshold used; ``regions`` the number of tissue regions kept."""

    mask: np.ndarray
    level: int
    downsample: tuple[float, float]
    threshold: float
    regions: int

    def fraction(self, x0: float, y0: float, x1: float, y1: float) -> float:
        """Tissue fraction of the level-0 box [x0, x1) x [y0, y1): the share of mask pixels whose
        centres fall inside it (0 when none does)."""
        ds_x, ds_y = self.downsample
        cols = slice(max(0, int(np.ceil(x0 / ds_x - 0.5))), max(0, int(np.ceil(x1 / ds_x - 0.5))))
        rows = slice(max(0, int(np.ceil(y0 / ds_y - 0.5))), max(0, int(np.ceil(y1 / ds_y - 0.5))))
        window = self.mask[rows, cols]
        return float(window.mean()) if window.size else 0.0


def otsu_threshold(values: np.ndarray) -> float:
    """Otsu's threshold of uint8 values: the t maximising the between-class variance of
    {v <= t} and {v > t}; the middle of the best run of equal maxima; 0 for constant input."""
    counts = np.bincount(np.asarray(values, dtype=np.uint8).ravel(), minlength=256).astype(np.float64)
    levels = np.arange(256, dtype=np.float64)
    weight0 = np.cumsum(counts)
    weight1 = weight0[-1] - weight0
    sum0 = np.cumsum(counts * levels)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean0 = sum0 / weight0
        mean1 = (sum0[-1] - sum0) / weight1
        between = weight0 * weight1 * (mean0 - mean1) ** 2
    between = np.nan_to_num(between, nan=-1.0)
    if between.max() <= 0:
        return 0.0
    best = np.flatnonzero(between >= between.max() * (1 - 1e-12))
    return float(best[len(best) // 2])


def _saturation(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).convert("HSV"))[:, :, 1]


def tissue_from_rgb(rgb: np.ndarray, options: TissueOptions, pixel_area_mm2: float) -> tuple[np.ndarray, float, int]:
    """Tissue mask of an RGB image (h, w, 3) uint8 whose pixels cover ``pixel_area_mm2`` each ->
    (mask (h, w) bool, threshold, number of regions)."""
    from scipy import ndimage

    blurred = ndimage.median_filter(_saturation(rgb), size=options.median_kernel, mode="nearest")
    if options.saturation_threshold is None:
        threshold = max(otsu_threshold(blurred), options.min_saturation)
    else:
        threshold = float(options.saturation_threshold)
    mask = blurred > threshold
    if options.close_kernel > 0:
        pad = options.close_kernel
        structure = np.ones((options.close_kernel, options.close_kernel), dtype=bool)
        mask = ndimage.binary_closing(np.pad(mask, pad), structure=structure)[pad:-pad, pad:-pad]
    filled = ndimage.binary_fill_holes(mask)
    regions, count = ndimage.label(filled, structure=np.ones((3, 3), dtype=bool))
    holes, _ = ndimage.label(filled & ~mask)
    hole_sizes = np.bincount(holes.ravel())
    tissue = np.zeros_like(mask)
    kept = 0
    for region in range(1, count + 1):
        inside = regions == region
        ids, sizes = np.unique(holes[inside], return_counts=True)
        big = [(hole_sizes[i], i) for i in ids if i != 0 and hole_sizes[i] * pixel_area_mm2 >= options.min_hole_area]
        big = [i for _, i in sorted(big, reverse=True)[: options.max_holes]]
        body = inside & ~np.isin(holes, big) if big else inside
        if body.sum() * pixel_area_mm2 >= options.min_tissue_area and body.any():
            tissue |= body
            kept += 1
    return tissue, threshold, kept


def detect_tissue(slide: Slide, options: TissueOptions = TissueOptions()) -> TissueMask:
    """The slide's tissue mask at the level chosen by ``options.seg_downsample``."""
    level = slide.level_for_downsample(options.seg_downsample)
    rgb = slide.read_level(level)
    width0, height0 = slide.dimensions
    downsample = (width0 / rgb.shape[1], height0 / rgb.shape[0])
    pixel_area_mm2 = downsample[0] * downsample[1] * (slide.mpp / 1000.0) ** 2
    mask, threshold, regions = tissue_from_rgb(rgb, options, pixel_area_mm2)
    return TissueMask(mask, level, downsample, threshold, regions)
