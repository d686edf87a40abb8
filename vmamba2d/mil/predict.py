"""Predictions and attention heatmaps of a trained MIL run on new slides (docs/mil.md#from-slides).

    python -m vmamba2d.mil.predict RUN_DIR SLIDES_OR_H5... [--out DIR] [--weights FILE]

RUN_DIR: a ``mil/train.py`` run folder (its ``best.pth``, or the ``best.pth`` of one of its
``seedN`` / ``foldK-seedN`` sub-runs: the first in sorted order unless ``--run`` names one), or a
checkpoint file. Inputs: feature files (``.h5`` / ``.pt``) or slides; slides are first extracted
into ``OUT/h5_files`` with the settings the training features were extracted with (the
``extract.json`` beside the run's feature folder, or ``--extract-settings``; the encoder's weights
file by ``--weights``, checked against the recorded SHA-256).

Writes ``OUT/predictions.csv`` (slide_id, predicted class and one probability column per class;
for survival the risk -sum(S) and S per time bin) and, for models with attention,
``OUT/heatmaps/<slide_id>.png``: the attention over the slide thumbnail (slides) or on its grid
(feature files).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from .config import FIELD_NAMES, MILConfig
from .data.dataset import SlideRecord
from .data.errors import SlideDataError
from .data.grid import prepare_slide
from .data.slide_files import RawSlide, read_slide_file
from .heatmap import grid_heatmap, slide_attention, thumbnail_overlay
from .models import model_from_checkpoint
from .runner import grid_options

RUN_CHECKPOINT = "best.pth"
FEATURE_SUFFIXES = (".h5", ".pt")


def find_checkpoint(run: Path, sub_run: Optional[str] = None) -> Path:
    """The checkpoint of a run folder (see the module docstring)."""
    if run.is_file():
        return run
    if not run.is_dir():
        raise FileNotFoundError(f"run folder {run} does not exist")
    if sub_run is not None:
        path = run / sub_run / RUN_CHECKPOINT
        if not path.is_file():
            raise FileNotFoundError(f"--run {sub_run}: {path} not found")
        return path
    if (run / RUN_CHECKPOINT).is_file():
        return run / RUN_CHECKPOINT
    found = sorted(run.glob(f"*/{RUN_CHECKPOINT}"))
    if not found:
        raise FileNotFoundError(f"no {RUN_CHECKPOINT} in {run} or its sub-runs: is it a mil/train.py run folder?")
    return found[0]


def load_run(path: Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model (eval mode) and the checkpoint dict of a ``mil/train.py`` checkpoint."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or "model_config" not in checkpoint or "config" not in checkpoint:
        raise ValueError(f"{path} is not a mil/train.py checkpoint")
    return model_from_checkpoint(path).eval(), checkpoint


def split_inputs(paths: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    """(feature files, slide files) from files and folders (a folder's .h5 / .pt and slide files)."""
    from .slides.reader import SLIDE_SUFFIXES

    features, slides = [], []
    for path in paths:
        children = sorted(path.iterdir()) if path.is_dir() else [path]
        if not path.exists():
            raise FileNotFoundError(f"input {path} does not exist")
        for child in children:
            suffix = child.suffix.lower()
            if suffix in FEATURE_SUFFIXES:
                features.append(child)
            elif suffix in SLIDE_SUFFIXES:
                slides.append(child)
            elif not path.is_dir():
                raise ValueError(f"input {child}: expected a feature file ({', '.join(FEATURE_SUFFIXES)}) or a "
                                 f"slide ({', '.join(SLIDE_SUFFIXES)})")
    return features, slides


def record_of(raw: RawSlide, cfg: MILConfig) -> SlideRecord:
    """Place a read feature file on its grid as the run's training did (deterministic cap)."""
    features, placement = prepare_slide(raw, grid_options(cfg))
    return SlideRecord(raw.slide_id, features, placement.coords, placement.grid, placement.origin_px,
                       placement.step_px)


def prediction_row(slide_id: str, outputs: dict[str, torch.Tensor], checkpoint: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: classification -> predicted class name and p_<class>; survival -> risk and S_<bin>."""
    if "risk" in outputs:
        row: dict[str, Any] = {"slide_id": slide_id, "risk": float(outputs["risk"][0])}
        row.update({f"survival_{k}": float(v) for k, v in enumerate(outputs["survival"][0].tolist())})
        return row
    names = {index: name for name, index in (checkpoint.get("label_map") or {}).items()}
    probabilities = outputs["probabilities"][0].tolist()
    row = {"slide_id": slide_id, "predicted": names.get(int(torch.tensor(probabilities).argmax()),
                                                        int(torch.tensor(probabilities).argmax()))}
    row.update({f"p_{names.get(k, k)}": p for k, p in enumerate(probabilities)})
    return row


def extract_settings_path(cfg: MILConfig, given: Optional[Path]) -> Path:
    if given is not None:
        return given
    return Path(cfg.feature_dir).parent / "extract.json"


def extract_slides(slides: list[Path], out: Path, settings_file: Path, weights: Optional[Path], *, device: str,
                   workers: int, batch_size: int) -> dict[str, Any]:
    """Extract ``slides`` into ``out/h5_files`` with the recorded settings; returns the summary."""
    from .encoders import build_encoder
    from .extract import SlideOptions, extract, resolve_device, settings_record
    from .slides.patching import PatchOptions
    from .slides.tissue import TissueOptions

    if not settings_file.is_file():
        raise FileNotFoundError(f"slides need the extraction settings of the training features: {settings_file} not "
                                "found (pass --extract-settings OUT/extract.json of vmamba2d.mil.extract)")
    settings = json.loads(settings_file.read_text())
    if settings.get("weights_sha256") and weights is None:
        raise ValueError(f"the features were extracted with --weights {settings['weights']}: pass --weights FILE")
    if not settings.get("weights_sha256") and weights is not None:
        raise ValueError("the features were extracted with --random-init: drop --weights")
    encoder = build_encoder(settings["encoder"], weights=weights, random_init=weights is None,
                            seed=settings.get("random_init_seed") or 0, input_size=settings["input_size"])
    if encoder.weights_sha256 != settings.get("weights_sha256"):
        raise ValueError(f"--weights {weights} is not the file the training features were extracted with "
                         f"(SHA-256 {settings.get('weights_sha256')})")
    patches = PatchOptions(**settings["patches"])
    tissue = TissueOptions(**settings["tissue"])
    slide_options = SlideOptions(**settings["slides"])
    seed = settings.get("random_init_seed") or 0
    if settings_record(encoder, patches, tissue, slide_options, seed) != settings:
        raise ValueError(f"{settings_file} does not match the encoder rebuilt from it")
    return extract(slides, out, encoder, patches, tissue, slide_options, seed=seed, batch_size=batch_size,
                   workers=workers, device=resolve_device(device), amp="none")


def write_heatmap(model: torch.nn.Module, record: SlideRecord, path: Path, slide_file: Optional[Path],
                  settings: Optional[dict[str, Any]]) -> None:
    """The attention of ``record`` over its slide's thumbnail (``slide_file``) or on its grid."""
    from .extract import write_image

    attention, tissue, _ = slide_attention(model, record)
    if slide_file is None:
        image = grid_heatmap(attention, tissue)
    else:
        from .slides.reader import open_slide
        from .slides.thumbnail import thumbnail_of

        options = (settings or {}).get("slides", {})
        with open_slide(slide_file, mpp=options.get("slide_mpp"), backend=options.get("backend", "auto")) as slide:
            thumbnail, downsample = thumbnail_of(slide)
        image = thumbnail_overlay(attention, tissue, thumbnail, origin_px=record.origin_px, step_px=record.step_px,
                                  downsample=downsample)
    write_image(image, path)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vmamba2d.mil.predict",
        description="Per-slide predictions (CSV) and attention heatmaps (PNG) of a trained MIL run on "
                    "slides or feature files.",
        epilog="Example: python -m vmamba2d.mil.predict runs/bracs new_slides/ --out predictions/ "
               "--weights resnet50.safetensors")
    p.add_argument("run", type=Path, help="mil/train.py run folder or checkpoint file")
    p.add_argument("inputs", nargs="+", type=Path, help="slides, feature files (.h5 / .pt) or folders of them")
    p.add_argument("--out", type=Path, default=Path("predictions"))
    p.add_argument("--run", dest="sub_run", default=None, help="sub-run of RUN_DIR to use, e.g. seed0")
    p.add_argument("--extract-settings", type=Path, default=None,
                   help="extract.json of the training features (default: beside the run's feature folder)")
    p.add_argument("--weights", type=Path, default=None, help="the encoder weights file (slides only)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--no-heatmaps", action="store_true")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    from .extract import resolve_device

    try:
        checkpoint_path = find_checkpoint(args.run, args.sub_run)
        model, checkpoint = load_run(checkpoint_path)
        cfg = MILConfig(**{k: v for k, v in checkpoint["config"].items() if k in FIELD_NAMES})
        device = resolve_device(args.device)
        feature_files, slide_files = split_inputs(args.inputs)
        args.out.mkdir(parents=True, exist_ok=True)
        failed: list[tuple[str, str]] = []
        slide_of: dict[str, Path] = {}
        settings = None
        if slide_files:
            settings_file = extract_settings_path(cfg, args.extract_settings)
            summary = extract_slides(slide_files, args.out, settings_file, args.weights, device=args.device,
                                     workers=args.workers, batch_size=args.batch_size)
            settings = json.loads(settings_file.read_text())
            failed += [(slide_id, reason) for slide_id, reason in summary["failed"]]
            for path in slide_files:
                h5 = args.out / "h5_files" / f"{path.stem}.h5"
                if h5.is_file() and path.stem not in dict(failed):
                    feature_files.append(h5)
                    slide_of[path.stem] = path
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model.to(device)
    rows = []
    heatmaps = args.out / "heatmaps"
    for path in feature_files:
        try:
            raw = read_slide_file(path)
            if raw.features.shape[1] != model.in_dim:
                raise SlideDataError(f"slide {raw.slide_id!r}: features have {raw.features.shape[1]} dimensions, the "
                                     f"model takes {model.in_dim}")
            record = record_of(raw, cfg).to(device)
        except SlideDataError as error:
            failed.append((path.stem, str(error)))
            continue
        with torch.no_grad():
            outputs = model(record.features, record.coords, grid_size=record.grid)
        rows.append(prediction_row(record.slide_id, {k: v.float().cpu() for k, v in outputs.items()}, checkpoint))
        if model.has_attention and not args.no_heatmaps:
            heatmaps.mkdir(exist_ok=True)
            write_heatmap(model, record, heatmaps / f"{record.slide_id}.png", slide_of.get(record.slide_id), settings)
    if rows:
        with open(args.out / "predictions.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    print(f"{len(rows)} slides predicted with {checkpoint_path} -> {args.out / 'predictions.csv'}"
          + (f"; {len(failed)} failed" if failed else ""))
    for slide_id, reason in failed:
        print(f"  failed: {slide_id}: {reason}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
