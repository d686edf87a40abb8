"""Generate a tiny, learnable ImageNet-layout folder for the classification tests.

Each class is a distinct base colour plus per-pixel noise, at random sizes between 16 and 32
pixels, so a small network separates the classes within a few epochs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

CLASS_COLOURS = {
    "blue": (30, 40, 220),
    "green": (30, 200, 40),
    "red": (220, 30, 40),
    "yellow": (230, 220, 30),
}


def write_split(split_dir: Path, classes: list[str], per_class: int, rng: np.random.Generator
                ) -> None:
    """``per_class`` PNGs per class under ``split_dir/<class>/``."""
    for name in classes:
        folder = split_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        base = np.array(CLASS_COLOURS[name], dtype=np.float64)
        for index in range(per_class):
            height, width = rng.integers(16, 33, size=2)
            pixels = base + rng.normal(0.0, 25.0, size=(height, width, 3))
            image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
            image.save(folder / f"{name}_{index:03d}.png")


def make_tiny_imagefolder(root: Path, classes: tuple[str, ...] = ("blue", "green", "red"),
                          train_per_class: int = 8, val_per_class: int = 4, seed: int = 0) -> Path:
    """Create ``root/train/<class>/*.png`` and ``root/val/<class>/*.png``; returns ``root``."""
    rng = np.random.default_rng(seed)
    write_split(root / "train", list(classes), train_per_class, rng)
    write_split(root / "val", list(classes), val_per_class, rng)
    return root
