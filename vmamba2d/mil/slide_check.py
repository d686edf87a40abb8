"""Check every slide a MIL run (or evaluation) will load, before anything is written.

Each slide's file is found, read once and placed on its grid with the run's ``GridOptions``
(the same steps ``SlideDataset`` takes per item), so a truncated file, a feature / coords length
mismatch, NaN features, duplicate cells or a wrong feature size is reported up front - all bad
slides at once - instead of as a traceback in the middle of an epoch. Nothing is kept in memory
but each slide's feature size.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from .data.errors import SlideDataError
from .data.grid import GridOptions, prepare_slide
from .data.slide_files import find_slide_file, read_slide_file

PathLike = Union[str, Path]


@dataclass(frozen=True)
class BadSlide:
    """An unusable slide: its id, its file (None when there is none), what is wrong with it and
    where the run uses it (e.g. ``("train",)`` or ``("fold 0 train", "fold 1 val")``)."""

    slide_id: str
    file: Optional[str]
    problem: str
    uses: tuple[str, ...]

    def describe(self) -> str:
        """One line: ``<slide id> (<uses>) <file>: <problem>``."""
        return f"{self.slide_id} ({', '.join(self.uses)}) {self.file or '-'}: {self.problem}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable record for summaries."""
        return {"slide_id": self.slide_id, "file": self.file, "problem": self.problem,
                "uses": list(self.uses)}


def _problem(error: Exception, slide_id: str, path: Path) -> str:
    """The error's message without the ``slide '<id>': <path>: `` prefix of the data layer (the
    report names the slide and its file in columns of its own)."""
    return str(error).removeprefix(f"slide {slide_id!r}: ").removeprefix(f"{path}: ")


def check_slides(uses: Mapping[str, Sequence[str]], feature_dir: PathLike, grid: GridOptions,
                 in_dim: Optional[int] = None) -> tuple[Optional[int], list[BadSlide]]:
    """Read and place every slide of ``uses`` once.

    Args:
        uses: slide id -> where it is used (split names), in the order to check.
        feature_dir: folder of the slide files (see ``vmamba2d.mil.data.slide_files.find_slide_file``).
        grid: the run's placement options (duplicates, patch step, canvas).
        in_dim: expected feature size F; None = the most common F among the readable slides
            (the first slide's on ties).
    Returns:
        (in_dim, bad slides in the order of ``uses``); in_dim is None only when no slide could
        be read and none was given.
    """
    feature_dir = Path(feature_dir)
    bad: dict[str, BadSlide] = {}
    sizes: dict[str, tuple[str, int]] = {}  # slide id -> (file, F) of the readable slides
    for slide_id, where in uses.items():
        try:
            path = find_slide_file(feature_dir, slide_id)
        except FileNotFoundError:
            bad[slide_id] = BadSlide(slide_id, None, f"no .h5 / .pt file under {feature_dir}",
                                     tuple(where))
            continue
        try:
            raw = read_slide_file(path, slide_id)
            prepare_slide(raw, grid)
        except SlideDataError as error:
            bad[slide_id] = BadSlide(slide_id, str(path), _problem(error, slide_id, path),
                                     tuple(where))
            continue
        sizes[slide_id] = (str(path), int(raw.features.shape[1]))
    if in_dim is None and sizes:
        in_dim = Counter(f for _, f in sizes.values()).most_common(1)[0][0]
        source = "the feature size of most slides; set --in-dim to choose another"
    else:
        source = "--in-dim"
    for slide_id, (path, features) in sizes.items():
        if features != in_dim:
            bad[slide_id] = BadSlide(slide_id, path, f"features have F={features}, expected "
                                     f"in_dim={in_dim} ({source})", tuple(uses[slide_id]))
    order = {slide_id: i for i, slide_id in enumerate(uses)}
    return in_dim, sorted(bad.values(), key=lambda b: order[b.slide_id])


def describe_bad_slides(bad: Sequence[BadSlide], checked: int) -> str:
    """Multi-line report: a count line, then one line per bad slide."""
    return (f"{len(bad)} of {checked} slide(s) are unusable (slide (split) file: problem):\n  "
            + "\n  ".join(b.describe() for b in bad))
