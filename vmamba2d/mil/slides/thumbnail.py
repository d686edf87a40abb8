"""A slide thumbnail with the tissue outline and the patch grid drawn, for checking the tissue
detection and the patching by eye."""
from __future__ import annotations

from typing import Optional

import numpy as np
from PIL import Image, ImageDraw

from .patching import PatchGrid
from .reader import Slide
from .tissue import TissueMask

OUTLINE = (0, 170, 0)
GRID = (30, 60, 230)


def thumbnail_of(slide: Slide, max_side: int = 1024) -> tuple[Image.Image, tuple[float, float]]:
    """The slide at the coarsest level at least ``max_side`` wide or high (or level 0), resized so its
    longer side is at most ``max_side`` -> (RGB image, level-0 pixels per thumbnail pixel (x, y))."""
    level = 0
    for index, (width, height) in enumerate(slide.level_dimensions):
        if max(width, height) >= max_side:
            level = index
    image = Image.fromarray(slide.read_level(level))
    scale = min(1.0, max_side / max(image.size))
    if scale < 1.0:
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.BILINEAR)
    width0, height0 = slide.dimensions
    return image, (width0 / image.width, height0 / image.height)


def tissue_outline(mask: np.ndarray) -> np.ndarray:
    """Boundary pixels of a bool mask (h, w): tissue pixels with a 4-neighbour outside the tissue."""
    padded = np.pad(mask, 1)
    inner = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    return mask & ~inner


def draw_thumbnail(slide: Slide, tissue: TissueMask, grid: Optional[PatchGrid] = None,
                   max_side: int = 1024) -> Image.Image:
    """The thumbnail with the tissue outline (green) and each kept patch's square (blue)."""
    image, (ds_x, ds_y) = thumbnail_of(slide, max_side)
    mask = Image.fromarray(tissue.mask.astype(np.uint8) * 255).resize(image.size, Image.NEAREST)
    outline = tissue_outline(np.asarray(mask) > 0)
    pixels = np.array(image)
    pixels[outline] = OUTLINE
    image = Image.fromarray(pixels)
    if grid is not None:
        draw = ImageDraw.Draw(image)
        for x, y in grid.coords:
            draw.rectangle([x / ds_x, y / ds_y, (x + grid.step) / ds_x - 1, (y + grid.step) / ds_y - 1], outline=GRID)
    return image
