"""Synthetic whole-slide MIL task where only the 2D arrangement of tumour patches carries the
label ("stacked vs. scattered runs", docs/mil.md#synthetic-task).

Every slide is an H x W grid (H, W drawn independently from U{min_size..max_size}) holding an
elliptic tissue region (the ellipse spans 85-100 % of the box); cells outside it are not patches.
Tissue patches are "normal" (p0 + 0.3 eps) except 9 "tumour" patches (p1 + 0.3 eps) that form
three horizontal runs of length 3 on three different rows:

- positive (label 1): the runs are on consecutive rows and column-aligned (a 3 x 3 square);
- negative (label 0), alternating between two kinds:
  * ``staircase``: consecutive rows, each run shifted 4-6 columns from the previous one, both
    shifts in the same direction;
  * ``row_gap``: column-aligned runs on every second row (rows r, r + 2, r + 4).

So the token multiset and the horizontal run statistics are the same in both classes: a bag
model cannot beat chance, and a raster (1D) scan meets the vertical neighbour W tokens back with W
varying per slide. Geometries where one of the three motifs (with the drawn staircase shifts)
would not fit inside the tissue are redrawn before the class is looked at, so the slide-size and
tissue-shape distributions do not depend on the label. Labels alternate, so classes are balanced.

Coordinates are CLAM-style top-left pixel positions (col, row) * patch_size, rows shuffled.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

POSITIVE_KIND = "square"
NEGATIVE_KINDS = ("staircase", "row_gap")
RUN_LENGTH = 3
NOISE_STD = 0.3
TISSUE_FILL = (0.85, 1.0)
STAIRCASE_SHIFTS = (4, 6)
LABEL_NAMES = ("negative", "positive")  # label index 0, 1
MAX_GEOMETRY_DRAWS = 2_000


@dataclass
class SyntheticSlide:
    """One generated slide.

    Attributes:
        slide_id: unique name.
        features: (n, in_dim) float32 patch features, rows in shuffled order.
        coords: (n, 2) int64 top-left pixel (x, y) = (col, row) * patch_size, same order.
        label: 1 = positive (aligned square), 0 = negative.
        kind: ``square``, ``staircase`` or ``row_gap``.
        height, width: the slide's grid box (H, W); tissue lies inside it.
        tumour_cells: (9, 2) int64 (row, col) of the tumour patches.
    """

    slide_id: str
    features: np.ndarray
    coords: np.ndarray
    label: int
    kind: str
    height: int
    width: int
    tumour_cells: np.ndarray


def tumour_prototypes(in_dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The fixed normal / tumour feature centres p0, p1 ~ N(0, I) (in_dim,), shared by all
    splits generated with the same ``seed``."""
    rng = np.random.default_rng([seed, 7919])
    p0, p1 = rng.standard_normal((2, in_dim))
    return p0, p1


def ellipse_tissue(height: int, width: int, fill: float) -> np.ndarray:
    """(H, W) bool mask of the centred ellipse whose axes are ``fill`` times the box's."""
    rows = (np.arange(height) + 0.5 - height / 2) / (fill * height / 2)
    cols = (np.arange(width) + 0.5 - width / 2) / (fill * width / 2)
    return rows[:, None] ** 2 + cols[None, :] ** 2 <= 1.0


def motif_offsets(kind: str, shifts: tuple[int, int], direction: int) -> np.ndarray:
    """(9, 2) (row, col) offsets of the tumour cells of a motif, relative to its first run's
    left end; columns may be negative for a leftward staircase."""
    run = np.arange(RUN_LENGTH)
    if kind == POSITIVE_KIND:
        starts = [(0, 0), (1, 0), (2, 0)]
    elif kind == "row_gap":
        starts = [(0, 0), (2, 0), (4, 0)]
    elif kind == "staircase":
        starts = [(0, 0), (1, direction * shifts[0]), (2, direction * (shifts[0] + shifts[1]))]
    else:
        raise ValueError(f"unknown motif kind {kind!r}; expected {POSITIVE_KIND!r} or one of "
                         f"{NEGATIVE_KINDS}")
    return np.array([(r, c + k) for r, c in starts for k in run], dtype=np.int64)


def motif_anchors(tissue: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(m, 2) (row, col) anchors at which every cell of ``offsets`` lies inside ``tissue``."""
    height, width = tissue.shape
    anchors = np.stack(np.meshgrid(np.arange(height), np.arange(width), indexing="ij"),
                       axis=-1).reshape(-1, 2)
    cells = anchors[:, None, :] + offsets[None, :, :]
    inside = ((cells[..., 0] >= 0) & (cells[..., 0] < height)
              & (cells[..., 1] >= 0) & (cells[..., 1] < width))
    rows = np.clip(cells[..., 0], 0, height - 1)
    cols = np.clip(cells[..., 1], 0, width - 1)
    ok = (inside & tissue[rows, cols]).all(axis=1)
    return anchors[ok]


def _draw_geometry(rng: np.random.Generator, min_size: int, max_size: int):
    """Box, tissue and staircase shifts under which all three motif kinds fit."""
    widest = RUN_LENGTH + 2 * STAIRCASE_SHIFTS[0]  # the narrowest staircase
    if max_size < widest:
        raise ValueError(f"grid sizes U{{{min_size}..{max_size}}} are too small to hold the motifs: "
                         f"the staircase needs at least {widest} tissue columns")
    for _ in range(MAX_GEOMETRY_DRAWS):
        height, width = (int(v) for v in rng.integers(min_size, max_size + 1, size=2))
        tissue = ellipse_tissue(height, width, float(rng.uniform(*TISSUE_FILL)))
        shifts = tuple(int(v) for v in rng.integers(STAIRCASE_SHIFTS[0], STAIRCASE_SHIFTS[1] + 1,
                                                    size=2))
        direction = 1 if rng.random() < 0.5 else -1
        anchors = {kind: motif_anchors(tissue, motif_offsets(kind, shifts, direction))
                   for kind in (POSITIVE_KIND, *NEGATIVE_KINDS)}
        if all(len(a) for a in anchors.values()):
            return height, width, tissue, anchors, shifts, direction
    raise ValueError(f"grid sizes U{{{min_size}..{max_size}}} are too small to hold the motifs "
                     f"(the staircase needs about {3 + 2 * STAIRCASE_SHIFTS[1]} tissue columns)")


def make_synthetic_slides(count: int, *, min_size: int = 16, max_size: int = 40,
                          in_dim: int = 32, seed: int = 0, prototype_seed: int = 0,
                          patch_size: int = 512, prefix: str = "slide",
                          first_label: int = 1) -> list[SyntheticSlide]:
    """Generate ``count`` slides (labels alternate starting with ``first_label``; negatives
    alternate between the staircase and the row-gap motif).

    Args:
        count: number of slides.
        min_size, max_size: inclusive range of H and W (each drawn independently).
        in_dim: feature dimension F.
        seed: seed of this set (geometry, placement, noise, row order).
        prototype_seed: seed of p0 / p1; use the same value for every split of one task.
        patch_size: pixel step between neighbouring patches in ``coords``.
        prefix: slide ids are ``f"{prefix}_{index:05d}"``.

    Returns:
        The slides, in generation order.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 1 <= min_size <= max_size:
        raise ValueError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")
    if in_dim < 1 or patch_size < 1:
        raise ValueError(f"in_dim and patch_size must be >= 1, got {in_dim}, {patch_size}")
    if first_label not in (0, 1):
        raise ValueError(f"first_label must be 0 or 1, got {first_label}")
    p0, p1 = tumour_prototypes(in_dim, prototype_seed)
    # Separate streams: the geometry sequence does not depend on the labels or the placements.
    geometry_rng = np.random.default_rng([seed, 104729])
    rng = np.random.default_rng([seed, 1299709])
    slides = []
    negatives = 0
    for index in range(count):
        height, width, tissue, anchors, shifts, direction = _draw_geometry(geometry_rng, min_size, max_size)
        label = (first_label + index) % 2
        if label == 1:
            kind = POSITIVE_KIND
        else:
            kind = NEGATIVE_KINDS[negatives % len(NEGATIVE_KINDS)]
            negatives += 1
        candidates = anchors[kind]
        anchor = candidates[rng.integers(len(candidates))]
        tumour_cells = anchor[None, :] + motif_offsets(kind, shifts, direction)
        is_tumour = np.zeros_like(tissue)
        is_tumour[tumour_cells[:, 0], tumour_cells[:, 1]] = True
        cells = np.argwhere(tissue)  # (n, 2) row, col
        cells = cells[rng.permutation(len(cells))]
        tumour = is_tumour[cells[:, 0], cells[:, 1]]
        centres = np.where(tumour[:, None], p1[None, :], p0[None, :])
        features = centres + NOISE_STD * rng.standard_normal((len(cells), in_dim))
        coords = cells[:, ::-1].astype(np.int64) * patch_size  # (x, y) = (col, row) * step
        slides.append(SyntheticSlide(
            slide_id=f"{prefix}_{index:05d}", features=features.astype(np.float32),
            coords=coords, label=label, kind=kind, height=height, width=width,
            tumour_cells=tumour_cells))
    return slides


def shuffle_cells(slide: SyntheticSlide, seed: int, patch_size: int = 512) -> SyntheticSlide:
    """Control: the same patches on the same tissue cells, but every patch moved to a random
    cell of its slide, which destroys the motif: the label then carries no signal."""
    rng = np.random.default_rng([seed, 15485863])
    cells = slide.coords[:, ::-1] // patch_size  # (row, col) per patch
    is_tumour = (cells[:, None, :] == slide.tumour_cells[None, :, :]).all(-1).any(1)
    coords = slide.coords[rng.permutation(len(slide.coords))]
    tumour_cells = coords[is_tumour][:, ::-1] // patch_size
    return replace(slide, coords=coords, tumour_cells=tumour_cells.astype(np.int64))


def write_slide_file(slide: SyntheticSlide, folder: Path, fmt: str = "h5",
                     patch_size: int = 512) -> Path:
    """Write one slide as ``<folder>/<slide_id>.h5`` (CLAM layout: datasets ``features`` and
    ``coords``, ``coords.attrs['patch_size']``) or ``.pt`` (a dict with the same two tensors)."""
    folder = Path(folder)
    if fmt == "h5":
        import h5py

        path = folder / f"{slide.slide_id}.h5"
        with h5py.File(path, "w") as handle:
            handle.create_dataset("features", data=slide.features)
            coords = handle.create_dataset("coords", data=slide.coords)
            coords.attrs["patch_size"] = patch_size
            coords.attrs["patch_level"] = 0
        return path
    if fmt == "pt":
        import torch

        path = folder / f"{slide.slide_id}.pt"
        torch.save({"features": torch.from_numpy(slide.features),
                    "coords": torch.from_numpy(slide.coords)}, path)
        return path
    raise ValueError(f"fmt must be 'h5' or 'pt', got {fmt!r}")


def write_synthetic_dataset(root: Path, split_sizes: dict[str, int], *, min_size: int = 16,
                            max_size: int = 40, in_dim: int = 32, seed: int = 0,
                            fmt: str = "h5", patch_size: int = 512,
                            shuffled_cells: bool = False) -> Path:
    """Write a labelled synthetic dataset to disk, in the layout the MIL CLI reads.

    ``root/features/<slide_id>.<fmt>`` per slide and ``root/labels.csv`` with the columns
    ``slide_id,label,split`` (labels ``negative`` / ``positive``). Each split gets its own
    random stream; all share the prototypes. ``shuffled_cells`` writes the control set of
    :func:`shuffle_cells` (labels kept, arrangement destroyed).

    Args:
        root: output folder (created).
        split_sizes: e.g. ``{"train": 400, "val": 100, "test": 200}``.

    Returns:
        The path of the labels CSV.
    """
    root = Path(root)
    feature_dir = root / "features"
    feature_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for split_index, (split, count) in enumerate(split_sizes.items()):
        slides = make_synthetic_slides(count, min_size=min_size, max_size=max_size,
                                       in_dim=in_dim, seed=seed * 1000 + split_index,
                                       prototype_seed=seed, patch_size=patch_size, prefix=split)
        for slide in slides:
            if shuffled_cells:
                slide = shuffle_cells(slide, seed * 1000 + split_index, patch_size)
            write_slide_file(slide, feature_dir, fmt, patch_size)
            rows.append((slide.slide_id, LABEL_NAMES[slide.label], split))
    labels = root / "labels.csv"
    with open(labels, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("slide_id", "label", "split"))
        writer.writerows(rows)
    return labels


def horizontal_runs(cells: Iterable[Sequence[int]]) -> list[int]:
    """Lengths of maximal horizontal runs among (row, col) cells, sorted."""
    by_row: dict[int, list[int]] = {}
    for row, col in cells:
        by_row.setdefault(int(row), []).append(int(col))
    lengths = []
    for cols in by_row.values():
        cols = sorted(cols)
        length = 1
        for left, right in zip(cols, cols[1:]):
            if right == left + 1:
                length += 1
            else:
                lengths.append(length)
                length = 1
        lengths.append(length)
    return sorted(lengths)


def slide_grid(slide: SyntheticSlide, patch_size: int = 512) -> np.ndarray:
    """(H, W) int map of a slide: -1 outside tissue, 0 normal, 1 tumour (for plots and tests)."""
    grid = -np.ones((slide.height, slide.width), dtype=np.int64)
    rows = slide.coords[:, 1] // patch_size
    cols = slide.coords[:, 0] // patch_size
    grid[rows, cols] = 0
    grid[slide.tumour_cells[:, 0], slide.tumour_cells[:, 1]] = 1
    return grid
