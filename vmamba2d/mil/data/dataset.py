"""The MIL dataset: table entries -> slides read and placed on their grids, one record each.

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

Every error names the slide.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
from torch.utils.data import Dataset

from .errors import SlideDataError
from .grid import GridOptions, prepare_slide
from .slide_files import find_slide_file, read_slide_file
from .tables import SlideEntry

Tensor = torch.Tensor
PathLike = Union[str, Path]


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
