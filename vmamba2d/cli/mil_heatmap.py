"""Draw a MIL model's attention over one slide as a PNG (grid view, or over a thumbnail).

Examples:

    vmamba2d-mil-heatmap --checkpoint run/best.pt --slide feats/h5_files/S1.h5 --out S1.png
    vmamba2d-mil-heatmap --checkpoint run/best.pt --slide feats/h5_files/S1.h5 --out S1.png \
        --thumbnail S1_thumb.png --downsample 64

The checkpoint is a dict with ``model_config`` and ``model`` (``vmamba2d.mil.models.model_from_checkpoint``)
and optionally the training ``GridOptions`` as a dict (``grid_options``, or ``config["grid"]`` as
``vmamba2d-mil-train`` saves it), used unless overridden by
--patch-step, --placement, --duplicates, --max-cells, --cap.
Without --downsample, the thumbnail scale comes from --slide-size (level-0 width height) or the
file's CLAM attributes (``level_dim`` x ``downsample``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vmamba2d.mil.data.dataset import SlideRecord
from vmamba2d.mil.data.grid import CAPS, DUPLICATE_POLICIES, PLACEMENTS, GridOptions, prepare_slide
from vmamba2d.mil.data.slide_files import read_slide_file
from vmamba2d.mil.heatmap import (
    READABLE_PX, SCALES, grid_heatmap, readable_cell_px, slide_attention, thumbnail_overlay, with_colour_bar,
)
from vmamba2d.mil.models import model_from_checkpoint


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, type=Path, help="MIL checkpoint (.pt with model_config and model)")
    parser.add_argument("--slide", required=True, type=Path, help="the slide's feature file (.h5 or .pt)")
    parser.add_argument("--out", required=True, type=Path, help="output PNG")
    parser.add_argument("--thumbnail", type=Path, help="slide thumbnail image to draw over")
    parser.add_argument("--downsample", type=float, help="level-0 pixels per thumbnail pixel")
    parser.add_argument("--slide-size", type=int, nargs=2, metavar=("WIDTH", "HEIGHT"), help="level-0 slide size in pixels")
    parser.add_argument("--alpha", type=float, default=0.5, help="heatmap opacity over the thumbnail")
    parser.add_argument("--cell-px", type=int, default=None,
                        help=f"pixels per grid cell in the grid view (default: the longer side at least {READABLE_PX} px)")
    parser.add_argument("--no-colour-bar", dest="colour_bar", action="store_false",
                        help="save the heatmap alone (default: with a labelled colour bar and the prediction as title)")
    parser.add_argument("--scale", choices=SCALES, default="rank")
    parser.add_argument("--cmap", default="jet", help="matplotlib colormap")
    parser.add_argument("--patch-step", type=int, help="level-0 pixels between neighbouring patches (default: from the file)")
    parser.add_argument("--placement", choices=PLACEMENTS, help="default: the checkpoint's, else crop")
    parser.add_argument("--duplicates", choices=DUPLICATE_POLICIES, help="default: the checkpoint's, else error")
    parser.add_argument("--max-cells", type=int, help="cap on grid cells (default: the checkpoint's, else none)")
    parser.add_argument("--cap", choices=CAPS, help="default: the checkpoint's, else pool")
    parser.add_argument("--save-array", type=Path, help="also save the (H, W) attention as .npy")
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def thumbnail_downsample(args: argparse.Namespace, attrs: dict, thumbnail: Image.Image) -> float:
    """Level-0 pixels per thumbnail pixel from --downsample, --slide-size or the CLAM attributes."""
    if args.downsample is not None:
        return args.downsample
    if args.slide_size is not None:
        return args.slide_size[0] / thumbnail.width
    if "level_dim" in attrs:
        level_width = float(np.asarray(attrs["level_dim"]).reshape(-1)[0])
        factor = float(np.asarray(attrs.get("downsample", 1.0), dtype=np.float64).reshape(-1)[0])
        return level_width * factor / thumbnail.width
    raise SystemExit("error: the thumbnail's scale is unknown; pass --downsample or --slide-size "
                     "(the slide file has no CLAM 'level_dim' attribute)")


def grid_options(args: argparse.Namespace) -> GridOptions:
    """The checkpoint's ``grid_options`` (if any) with the command line's overrides."""
    checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    stored = checkpoint.get("grid_options") or (checkpoint.get("config") or {}).get("grid") or {}
    given = dict(patch_step=args.patch_step, placement=args.placement, duplicates=args.duplicates,
                 max_cells=args.max_cells, cap=args.cap)
    merged = {**stored, **{k: v for k, v in given.items() if v is not None}}
    for key in ("patch_step", "canvas_size"):
        if isinstance(merged.get(key), list):
            merged[key] = tuple(merged[key])
    return GridOptions(**merged)


def main(argv=None) -> None:
    args = parse_args(argv)
    model = model_from_checkpoint(args.checkpoint).to(args.device)
    raw = read_slide_file(args.slide)
    features, placement = prepare_slide(raw, grid_options(args))
    record = SlideRecord(raw.slide_id, features, placement.coords, placement.grid, placement.origin_px,
                         placement.step_px)
    attention, tissue, outputs = slide_attention(model, record)
    if args.thumbnail is not None:
        thumbnail = Image.open(args.thumbnail)
        image = thumbnail_overlay(attention, tissue, thumbnail, origin_px=record.origin_px, step_px=record.step_px,
                                  downsample=thumbnail_downsample(args, raw.attrs, thumbnail), alpha=args.alpha,
                                  scale=args.scale, cmap=args.cmap)
    else:
        cell_px = args.cell_px if args.cell_px is not None else readable_cell_px(record.grid)
        image = grid_heatmap(attention, tissue, cell_px=cell_px, scale=args.scale, cmap=args.cmap)
    summary = ("risk {:.4f}".format(float(outputs["risk"][0])) if "risk" in outputs else
               "class {} (p = {:.3f})".format(int(outputs["probabilities"].argmax()), float(outputs["probabilities"].max())))
    if args.colour_bar:
        image = with_colour_bar(image, scale=args.scale, cmap=args.cmap, title=f"{raw.slide_id}: {summary}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    image.save(args.out)
    if args.save_array is not None:
        np.save(args.save_array, attention.numpy())
    print(f"{raw.slide_id}: grid {record.grid[0]}x{record.grid[1]}, {features.shape[0]} patches, {summary} -> {args.out}")


if __name__ == "__main__":
    main()
