"""Small synthetic whole-slide images for tests and demos: a tiled pyramidal TIFF (written with
``tifffile``) of tissue-coloured ellipses on a white background, with the pixel size in its
resolution tags, so OpenSlide and tiffslide read it like a scanner's file."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import numpy as np

from ...extras import require_extra

PathLike = Union[str, Path]

# H&E-like colours (eosin pink, haematoxylin purple).
TISSUE_COLOURS = ((214, 120, 170), (150, 90, 170), (190, 110, 190))


@dataclass(frozen=True)
class Blob:
    """An ellipse of tissue in level-0 pixels: centre (cx, cy), half axes (rx, ry); ``hole`` an
    optional inner ellipse (cx, cy, rx, ry) left white."""

    cx: float
    cy: float
    rx: float
    ry: float
    hole: tuple[float, float, float, float] | None = None


def _ellipse(height: int, width: int, cx: float, cy: float, rx: float, ry: float) -> np.ndarray:
    rows = (np.arange(height) + 0.5)[:, None]
    cols = (np.arange(width) + 0.5)[None, :]
    return ((cols - cx) / rx) ** 2 + ((rows - cy) / ry) ** 2 <= 1.0


def drawn_tissue(size: tuple[int, int], blobs: Sequence[Blob]) -> np.ndarray:
    """The drawn tissue of a synthetic slide: (height, width) bool at level 0 (``size`` = (width, height))."""
    width, height = size
    mask = np.zeros((height, width), dtype=bool)
    for blob in blobs:
        body = _ellipse(height, width, blob.cx, blob.cy, blob.rx, blob.ry)
        if blob.hole is not None:
            body &= ~_ellipse(height, width, *blob.hole)
        mask |= body
    return mask


def synthetic_slide_pixels(size: tuple[int, int], blobs: Sequence[Blob], seed: int = 0) -> np.ndarray:
    """Level-0 RGB (height, width, 3) uint8: white with +-3 noise, the blobs in textured tissue colours."""
    rng = np.random.default_rng(seed)
    width, height = size
    pixels = np.clip(252 + rng.integers(-3, 4, size=(height, width, 3)), 0, 255).astype(np.uint8)
    for index, blob in enumerate(blobs):
        body = drawn_tissue(size, [blob])
        colour = np.asarray(TISSUE_COLOURS[index % len(TISSUE_COLOURS)], dtype=np.int16)
        texture = rng.integers(-25, 26, size=(int(body.sum()), 3))
        pixels[body] = np.clip(colour + texture, 0, 255).astype(np.uint8)
    return pixels


def write_pyramid(path: PathLike, pixels: np.ndarray, mpp: float | None, levels: int = 3, factor: int = 4,
                  tile: int = 128) -> None:
    """Write RGB ``pixels`` as a tiled pyramidal TIFF: ``levels`` pages, each ``factor`` times smaller
    (block means), resolution tags = ``mpp`` micrometres per level-0 pixel (none when None)."""
    require_extra("writing synthetic slides", ["tifffile"], "slides")
    import tifffile

    with tifffile.TiffWriter(str(path)) as writer:
        current = pixels
        for level in range(levels):
            scale = factor ** level
            options = dict(tile=(tile, tile), photometric="rgb", compression="zlib")
            if mpp is not None:
                pixels_per_cm = 1e4 / (mpp * scale)
                options.update(resolution=(pixels_per_cm, pixels_per_cm), resolutionunit="CENTIMETER")
            writer.write(current, subfiletype=0 if level == 0 else 1, **options)
            h, w = current.shape[0] // factor, current.shape[1] // factor
            if min(h, w) < 1:
                break
            current = current[: h * factor, : w * factor].reshape(h, factor, w, factor, 3).mean(axis=(1, 3))
            current = np.round(current).astype(np.uint8)


def write_synthetic_slide(path: PathLike, size: tuple[int, int] = (2048, 1536), blobs: Sequence[Blob] = (),
                          *, mpp: float | None = 0.5, levels: int = 3, seed: int = 0) -> np.ndarray:
    """Write a synthetic slide; returns its drawn tissue (height, width) bool at level 0."""
    write_pyramid(path, synthetic_slide_pixels(size, blobs, seed), mpp, levels)
    return drawn_tissue(size, blobs)
