"""Opening a whole-slide image: OpenSlide for the formats it reads (``openslide-python`` with the
``openslide-bin`` library), ``tiffslide`` for the plain pyramidal TIFFs it does not; the pixel size
(mpp, micrometres per level-0 pixel) from the slide's metadata or from the caller."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
from PIL import Image

from ...extras import require_extra

PathLike = Union[str, Path]

# Suffixes of the slide files a folder is searched for (OpenSlide's formats and plain TIFF).
SLIDE_SUFFIXES = (".svs", ".tif", ".tiff", ".ndpi", ".vms", ".vmu", ".scn", ".mrxs", ".svslide", ".bif")
BACKENDS = ("auto", "openslide", "tiffslide")


class SlideError(Exception):
    """A slide that cannot be used: ``slide`` (its id or path) and ``reason`` (one line)."""

    def __init__(self, slide: str, reason: str) -> None:
        super().__init__(f"slide {slide}: {reason}")
        self.slide = slide
        self.reason = reason


def slide_id_of(path: PathLike) -> str:
    """The slide id of a slide file: its name without the suffix."""
    return Path(path).stem


def find_slides(paths: Sequence[PathLike]) -> list[Path]:
    """Slide files from files and folders (a folder's files with a suffix in ``SLIDE_SUFFIXES``,
    not recursive), sorted, without duplicates. Raises FileNotFoundError naming a missing path and
    ValueError when two files share a slide id."""
    found: dict[Path, None] = {}
    for path in map(Path, paths):
        if path.is_dir():
            for child in sorted(path.iterdir()):
                if child.is_file() and child.suffix.lower() in SLIDE_SUFFIXES:
                    found[child] = None
        elif path.is_file():
            found[path] = None
        else:
            raise FileNotFoundError(f"slide path {path} does not exist")
    slides = sorted(found)
    ids: dict[str, Path] = {}
    for path in slides:
        if slide_id_of(path) in ids:
            raise ValueError(f"two slide files have the slide id {slide_id_of(path)!r}: {ids[slide_id_of(path)]} "
                             f"and {path}")
        ids[slide_id_of(path)] = path
    return slides


def _metadata_mpp(properties: Any) -> Optional[float]:
    for key in ("openslide.mpp-x", "tiffslide.mpp-x"):
        value = properties.get(key)
        try:
            mpp = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(mpp) and mpp > 0:
            return mpp
    return None


class Slide:
    """An open slide: ``slide_id``, ``path``, ``backend`` (``"openslide"`` / ``"tiffslide"``),
    ``mpp`` (micrometres per level-0 pixel), ``level_dimensions`` ((width, height) per level) and
    ``level_downsamples`` (level-0 pixels per level pixel)."""

    def __init__(self, handle: Any, path: Path, backend: str, mpp: float) -> None:
        self._handle = handle
        self.path = path
        self.slide_id = slide_id_of(path)
        self.backend = backend
        self.mpp = mpp
        self.level_dimensions: list[tuple[int, int]] = [tuple(map(int, d)) for d in handle.level_dimensions]
        self.level_downsamples: list[float] = [float(d) for d in handle.level_downsamples]

    @property
    def dimensions(self) -> tuple[int, int]:
        """Level-0 (width, height) in pixels."""
        return self.level_dimensions[0]

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int]) -> np.ndarray:
        """RGB pixels of a region: ``location`` (x, y) of its top-left corner in level-0 pixels, ``size``
        (width, height) in pixels of ``level`` -> (height, width, 3) uint8. Transparent pixels (outside
        the scanned area) are white."""
        region = self._handle.read_region((int(location[0]), int(location[1])), int(level),
                                          (int(size[0]), int(size[1])))
        if not isinstance(region, Image.Image):
            region = Image.fromarray(np.asarray(region))
        if region.mode == "RGBA":
            white = Image.new("RGBA", region.size, (255, 255, 255, 255))
            region = Image.alpha_composite(white, region)
        return np.asarray(region.convert("RGB"))

    def read_level(self, level: int) -> np.ndarray:
        """A whole pyramid level as RGB: (height, width, 3) uint8."""
        return self.read_region((0, 0), level, self.level_dimensions[level])

    def level_for_downsample(self, downsample: float) -> int:
        """The level with the largest downsample not above ``downsample`` (1% tolerance); level 0 if none."""
        best = 0
        for level, value in enumerate(self.level_downsamples):
            if value <= downsample * 1.01 and value > self.level_downsamples[best]:
                best = level
        return best

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "Slide":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_slide(path: PathLike, *, mpp: Optional[float] = None, backend: str = "auto") -> Slide:
    """Open a slide file.

    backend: ``"openslide"``, ``"tiffslide"`` or ``"auto"`` (OpenSlide when it recognises the file,
    tiffslide for other TIFFs). mpp: micrometres per level-0 pixel, used when the metadata has none
    (the metadata's value wins otherwise). Raises SlideError naming the slide when the file cannot be
    read, has no pixel size, or has an empty level 0.
    """
    path = Path(path)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if mpp is not None and not (isinstance(mpp, (int, float)) and math.isfinite(mpp) and mpp > 0):
        raise ValueError(f"mpp must be a positive number of micrometres per pixel, got {mpp!r}")
    require_extra("reading slides", ["openslide", "tiffslide"], "slides")
    import openslide
    import tiffslide

    name = str(path)
    if not path.is_file():
        raise SlideError(name, "file not found")
    chosen = backend
    if backend == "auto":
        try:
            chosen = "openslide" if openslide.OpenSlide.detect_format(str(path)) else "tiffslide"
        except Exception as error:  # detect_format raises on some damaged files
            raise SlideError(name, f"cannot be read: {_one_line(error)}") from error
    try:
        handle = openslide.OpenSlide(str(path)) if chosen == "openslide" else tiffslide.TiffSlide(str(path))
    except Exception as error:  # each library raises its own errors for unreadable files
        raise SlideError(name, f"cannot be read by {chosen}: {_one_line(error)}") from error
    try:  # both libraries parse the metadata and the levels lazily
        found = _metadata_mpp(handle.properties)
        slide = Slide(handle, path, chosen, found if found is not None else float(mpp or 0))
    except Exception as error:
        handle.close()
        raise SlideError(name, f"cannot be read by {chosen}: {_one_line(error)}") from error
    if found is None and mpp is None:
        handle.close()
        raise SlideError(name, "its metadata has no pixel size (mpp): pass the slide's micrometres per pixel "
                               "(--slide-mpp)")
    width, height = slide.dimensions
    if width < 1 or height < 1:
        handle.close()
        raise SlideError(name, f"level 0 is empty ({width} x {height} pixels)")
    return slide


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
