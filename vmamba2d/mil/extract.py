"""Patch features from whole-slide images, in CLAM's ``.h5`` format (docs/mil.md#from-slides).

    python -m vmamba2d.mil.extract SLIDES... OUT --encoder NAME (--weights FILE | --random-init)
        [--patch-size 512] [--magnification 20 | --mpp M] [--input-size PX] [--batch-size 64]
        [--workers 4] [--device auto] [--amp none|bf16|fp16] [--slide-mpp M] [tissue options]

Per slide: tissue detection, patching, the encoder on every patch; written to
``OUT/h5_files/<slide_id>.h5`` (``features`` (n, F) float32, ``coords`` (n, 2) int64 level-0 (x, y);
attributes ``patch_size`` / ``patch_level`` / ``downsample`` as CLAM, plus the encoder, the
pixel sizes and the settings) through a hidden temporary file renamed into place, and a thumbnail
with the tissue outline and the patch grid to ``OUT/thumbnails/<slide_id>.png``. ``OUT/extract.json``
records the settings (``vmamba2d.mil.predict`` extracts new slides with them). A rerun skips the
slides whose ``.h5`` verifies against the settings and redoes the others. A slide that cannot be
used (unreadable, no pixel size, no tissue) is reported and skipped; the run then exits with 1
after a summary (also in ``OUT/extract_summary.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from ..runs.options import autocast
from .encoders import Encoder, build_encoder
from .slides.patching import PatchGrid, PatchOptions, patch_grid, read_patch
from .slides.reader import Slide, SlideError, find_slides, open_slide, slide_id_of
from .slides.thumbnail import draw_thumbnail
from .slides.tissue import TissueMask, TissueOptions, detect_tissue

FORMAT = "vmamba2d-extract-1"


@dataclass(frozen=True)
class SlideOptions:
    """How slides are opened: backend (``auto`` / ``openslide`` / ``tiffslide``), slide_mpp
    (micrometres per pixel for slides whose metadata has none)."""

    backend: str = "auto"
    slide_mpp: Optional[float] = None


def settings_record(encoder: Encoder, patches: PatchOptions, tissue: TissueOptions, slides: SlideOptions,
                    seed: int) -> dict[str, Any]:
    """What determines a slide's features; stored in ``extract.json`` and in each ``.h5``."""
    return {"format": FORMAT, "encoder": encoder.name,
            "weights": None if encoder.weights is None else Path(encoder.weights).name,
            "weights_sha256": encoder.weights_sha256, "random_init_seed": None if encoder.weights else seed,
            "input_size": encoder.input_size, "feature_dim": encoder.dim, "patches": asdict(patches),
            "tissue": asdict(tissue), "slides": asdict(slides)}


class PatchDataset(Dataset):
    """The patches of one slide as uint8 (3, S, S) tensors, S = the encoder's input size; each
    DataLoader worker opens the slide itself."""

    def __init__(self, path: Path, slides: SlideOptions, grid: PatchGrid, input_size: int) -> None:
        self.path, self.slides, self.grid, self.input_size = path, slides, grid, input_size
        self._slide: Optional[Slide] = None

    def __len__(self) -> int:
        return len(self.grid.coords)

    def __getitem__(self, index: int) -> torch.Tensor:
        if self._slide is None:
            self._slide = open_slide(self.path, mpp=self.slides.slide_mpp, backend=self.slides.backend)
        return patch_tensor(self._slide, self.grid, index, self.input_size)


def patch_tensor(slide: Slide, grid: PatchGrid, index: int, input_size: int) -> torch.Tensor:
    """Patch ``index`` of ``grid`` resized to the encoder's input: (3, input_size, input_size) uint8."""
    pixels = read_patch(slide, grid.coords[index], grid.level, grid.read_size, grid.patch_size)
    if input_size != grid.patch_size:
        from PIL import Image

        pixels = np.asarray(Image.fromarray(pixels).resize((input_size, input_size), Image.BILINEAR))
    return torch.from_numpy(np.array(pixels, dtype=np.uint8)).permute(2, 0, 1)


def encode_batch(encoder: Encoder, images: torch.Tensor, device: torch.device, amp: str) -> torch.Tensor:
    """uint8 images (B, 3, S, S) -> float32 features (B, F) on the CPU."""
    mean = torch.tensor(encoder.mean, device=device).view(1, 3, 1, 1)
    std = torch.tensor(encoder.std, device=device).view(1, 3, 1, 1)
    x = (images.to(device).float() / 255.0 - mean) / std
    with torch.no_grad(), autocast(device, amp):
        return encoder.module(x).float().cpu()


@dataclass
class SlidePatches:
    """One slide cut into patches: its slide, tissue mask and patch grid."""

    slide: Slide
    tissue: TissueMask
    grid: PatchGrid


def cut_slide(path: Path, patches: PatchOptions, tissue: TissueOptions, slides: SlideOptions) -> SlidePatches:
    """Open a slide, find its tissue and its patches; SlideError (naming the slide) when it cannot be
    read, has no pixel size, or has no tissue patch."""
    slide = open_slide(path, mpp=slides.slide_mpp, backend=slides.backend)
    try:
        mask = detect_tissue(slide, tissue)
        grid = patch_grid(slide, mask, patches)
    except SlideError:
        slide.close()
        raise
    except Exception as error:  # a damaged level or tile surfaces while reading
        slide.close()
        raise SlideError(slide.slide_id, f"cannot be read: {type(error).__name__}: {error}") from error
    if len(grid.coords) == 0:
        slide.close()
        raise SlideError(slide.slide_id, f"no tissue patch found ({mask.regions} tissue regions, saturation "
                                         f"threshold {mask.threshold:g})")
    return SlidePatches(slide, mask, grid)


def slide_features(cut: SlidePatches, encoder: Encoder, *, slides: SlideOptions, batch_size: int, workers: int,
                   device: torch.device, amp: str, progress: bool) -> np.ndarray:
    """The encoder on every patch of a cut slide: (n, F) float32."""
    dataset = PatchDataset(cut.slide.path, slides, cut.grid, encoder.input_size)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=False,
                        persistent_workers=False)
    chunks = []
    with tqdm(total=len(dataset), desc=cut.slide.slide_id, unit="patch", disable=not progress, leave=False,
              dynamic_ncols=True) as bar:
        for images in loader:
            chunks.append(encode_batch(encoder, images, device, amp))
            bar.update(len(images))
    return torch.cat(chunks).numpy()


def write_features(path: Path, features: np.ndarray, grid: PatchGrid, slide: Slide, settings: dict[str, Any]) -> None:
    """Write a CLAM-format ``.h5`` atomically (hidden temporary file in the same folder, fsync, rename)."""
    import h5py

    temporary = path.with_name(f".{path.name}.partial")
    downsample = grid.step / grid.read_size
    attrs = {"patch_size": grid.read_size, "patch_level": grid.level, "downsample": [downsample, downsample],
             "level_downsample": grid.level_downsample, "level_dim": list(slide.level_dimensions[grid.level]),
             "name": slide.slide_id, "step": grid.step, "output_patch_size": grid.patch_size,
             "mpp": grid.target_mpp, "slide_mpp": slide.mpp, "encoder": settings["encoder"],
             "settings": json.dumps(settings, sort_keys=True)}
    with h5py.File(temporary, "w") as handle:
        handle.create_dataset("features", data=features.astype(np.float32))
        coords = handle.create_dataset("coords", data=grid.coords.astype(np.int64))
        for key, value in attrs.items():
            coords.attrs[key] = value
            handle.attrs[key] = value
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def verify_features(path: Path, settings: dict[str, Any]) -> Optional[str]:
    """None when ``path`` is a finished ``.h5`` of these settings, else why it is not."""
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            if handle.attrs.get("settings") != json.dumps(settings, sort_keys=True):
                return "written with other settings"
            features, coords = handle["features"], handle["coords"]
            if features.ndim != 2 or features.shape[1] != settings["feature_dim"] or features.shape[0] < 1:
                return f"features have shape {features.shape}"
            if coords.shape != (features.shape[0], 2):
                return f"coords have shape {coords.shape} for {features.shape[0]} features"
            if not np.isfinite(features[()]).all():
                return "features hold non-finite values"
    except (OSError, KeyError) as error:
        return f"unreadable ({type(error).__name__}: {error})"
    return None


def write_image(image: Any, path: Path) -> None:
    """Save a PIL image atomically."""
    temporary = path.with_name(f".{path.name}.partial")
    image.save(temporary, format="PNG")
    os.replace(temporary, path)


def _write_json(value: Any, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.partial")
    temporary.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return torch.device(name)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vmamba2d.mil.extract",
        description="Tissue patches of whole-slide images -> patch features in CLAM's .h5 format "
                    "(OUT/h5_files), thumbnails (OUT/thumbnails), settings (OUT/extract.json).",
        epilog="Example: python -m vmamba2d.mil.extract slides/ features/ --encoder resnet50_trunc "
               "--weights resnet50.safetensors --magnification 20 --patch-size 512")
    p.add_argument("slides", nargs="+", type=Path, help="slide files or folders of them")
    p.add_argument("out", type=Path, help="output folder")
    p.add_argument("--encoder", required=True,
                   help="timm model name (vit_large_patch16_224 = UNI's architecture) or resnet50_trunc "
                        "(ResNet50 after stage 3 + average pooling, CLAM's 1024-d preset)")
    weights = p.add_mutually_exclusive_group(required=True)
    weights.add_argument("--weights", type=Path, help="the encoder's weights: .safetensors or a weights-only torch file")
    weights.add_argument("--random-init", action="store_true", help="random weights (seeded by --seed): for tests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--patch-size", type=int, default=512, help="patch side in pixels at the target pixel size")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--magnification", type=float, default=None, help="target magnification (default 20)")
    target.add_argument("--mpp", type=float, default=None, help="target micrometres per pixel")
    p.add_argument("--input-size", type=int, default=None,
                   help="patches are resized to this for the encoder (default: the encoder's, e.g. 224)")
    p.add_argument("--tissue-fraction", type=float, default=PatchOptions.tissue_fraction)
    p.add_argument("--slide-mpp", type=float, default=None,
                   help="micrometres per level-0 pixel of slides whose metadata has none")
    p.add_argument("--backend", choices=("auto", "openslide", "tiffslide"), default="auto")
    defaults = TissueOptions()
    p.add_argument("--seg-downsample", type=float, default=defaults.seg_downsample)
    p.add_argument("--median-kernel", type=int, default=defaults.median_kernel)
    p.add_argument("--close-kernel", type=int, default=defaults.close_kernel)
    p.add_argument("--saturation-threshold", type=float, default=None, help="default: Otsu's")
    p.add_argument("--min-saturation", type=float, default=defaults.min_saturation)
    p.add_argument("--min-tissue-area", type=float, default=defaults.min_tissue_area, help="mm^2")
    p.add_argument("--min-hole-area", type=float, default=defaults.min_hole_area, help="mm^2")
    p.add_argument("--max-holes", type=int, default=defaults.max_holes)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none")
    p.add_argument("--no-progress", action="store_true")
    return p


def options_from_args(args: argparse.Namespace) -> tuple[PatchOptions, TissueOptions, SlideOptions]:
    magnification = None if args.mpp is not None else (args.magnification or 20.0)
    patches = PatchOptions(patch_size=args.patch_size, magnification=magnification,
                           mpp=args.mpp, tissue_fraction=args.tissue_fraction)
    tissue = TissueOptions(seg_downsample=args.seg_downsample, median_kernel=args.median_kernel,
                           close_kernel=args.close_kernel, saturation_threshold=args.saturation_threshold,
                           min_saturation=args.min_saturation, min_tissue_area=args.min_tissue_area,
                           min_hole_area=args.min_hole_area, max_holes=args.max_holes)
    if args.slide_mpp is not None and not args.slide_mpp > 0:
        raise ValueError(f"--slide-mpp must be a positive number of micrometres per pixel, got {args.slide_mpp}")
    return patches, tissue, SlideOptions(backend=args.backend, slide_mpp=args.slide_mpp)


def extract(slide_paths: Sequence[Path], out: Path, encoder: Encoder, patches: PatchOptions, tissue: TissueOptions,
            slides: SlideOptions, *, seed: int = 0, batch_size: int = 64, workers: int = 0,
            device: torch.device = torch.device("cpu"), amp: str = "none", progress: bool = False) -> dict[str, Any]:
    """Extract every slide not already done; returns the summary ``{"done", "skipped", "failed":
    [[slide, reason], ...]}`` (also written to ``OUT/extract_summary.json``)."""
    settings = settings_record(encoder, patches, tissue, slides, seed)
    h5_dir, thumb_dir = out / "h5_files", out / "thumbnails"
    h5_dir.mkdir(parents=True, exist_ok=True)
    thumb_dir.mkdir(parents=True, exist_ok=True)
    for stale in h5_dir.glob(".*.partial"):
        stale.unlink()
    _write_json(settings, out / "extract.json")
    encoder.module.to(device)
    summary: dict[str, Any] = {"done": [], "skipped": [], "failed": []}
    for path in tqdm(slide_paths, desc="slides", unit="slide", disable=not progress, dynamic_ncols=True):
        slide_id = slide_id_of(path)
        target = h5_dir / f"{slide_id}.h5"
        if target.exists():
            problem = verify_features(target, settings)
            if problem is None:
                summary["skipped"].append(slide_id)
                continue
            print(f"slide {slide_id}: redoing {target.name}: {problem}", file=sys.stderr)
        try:
            cut = cut_slide(path, patches, tissue, slides)
        except SlideError as error:
            summary["failed"].append([slide_id, error.reason])
            print(f"skipped: {error}", file=sys.stderr)
            continue
        with cut.slide:
            write_image(draw_thumbnail(cut.slide, cut.tissue, cut.grid), thumb_dir / f"{slide_id}.png")
            try:
                features = slide_features(cut, encoder, slides=slides, batch_size=batch_size, workers=workers,
                                          device=device, amp=amp, progress=progress)
            except SlideError as error:
                summary["failed"].append([slide_id, error.reason])
                print(f"skipped: {error}", file=sys.stderr)
                continue
            except Exception as error:  # a damaged tile surfaces while reading patches
                reason = f"cannot read its patches: {type(error).__name__}: {str(error).strip().splitlines()[0]}"
                summary["failed"].append([slide_id, reason])
                print(f"skipped: slide {slide_id}: {reason}", file=sys.stderr)
                continue
            write_features(target, features, cut.grid, cut.slide, settings)
        summary["done"].append(slide_id)
    _write_json(summary, out / "extract_summary.json")
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        patches, tissue, slides = options_from_args(args)
        for name in ("batch_size", "workers"):
            if getattr(args, name) < (1 if name == "batch_size" else 0):
                raise ValueError(f"--{name.replace('_', '-')} must be >= {1 if name == 'batch_size' else 0}")
        paths = find_slides(args.slides)
        if not paths:
            raise ValueError(f"no slide files ({', '.join(s for s in ('.svs', '.tif', '.tiff', '.ndpi'))} ...) in "
                             f"{', '.join(map(str, args.slides))}")
        device = resolve_device(args.device)
        encoder = build_encoder(args.encoder, weights=args.weights, random_init=args.random_init, seed=args.seed,
                                input_size=args.input_size)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    summary = extract(paths, args.out, encoder, patches, tissue, slides, seed=args.seed, batch_size=args.batch_size,
                      workers=args.workers, device=device, amp=args.amp, progress=not args.no_progress)
    print(f"{len(summary['done'])} extracted, {len(summary['skipped'])} already done, "
          f"{len(summary['failed'])} failed (OUT/h5_files: {args.out / 'h5_files'})")
    for slide_id, reason in summary["failed"]:
        print(f"  failed: {slide_id}: {reason}")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
