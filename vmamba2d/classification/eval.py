"""Top-1 / top-5 accuracy and throughput of a registered timm model + checkpoint on a val folder.

    python classification/eval.py --model vmamba2d_tiny --checkpoint RUN/best.pth \
        --data-dir /data/imagenet [--use-ema]

Accepts our training checkpoints, official VMamba checkpoints (``model`` / ``model_ema``), timm
checkpoints and plain state dicts (.pth or .safetensors). The transform is the training run's
eval transform: resize to img_size / crop_pct, centre crop img_size, normalise. Runs under
torchrun too (every image is counted once).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from vmamba2d.machine import available_cores

from .checkpoint import load_checkpoint_file
from .config import AMP_CHOICES, DEVICE_CHOICES, parse_model_kwargs
from .data import (eval_loader, eval_transform, list_classes, make_image_folder,
                   model_data_config, resolve_val_dir)
from .distributed import DistContext, init_distributed, shutdown_distributed
from .engine import BadImages, evaluate
from .errors import DataTransformError, UsageError
from .logging_utils import setup_logger
from .models import check_model_name, load_model_for_eval


DEFAULT_IMG_SIZE = 224
DEFAULT_WORKERS = 8


def trained_img_size(checkpoint_path: Path, trust: bool = False) -> int:
    """The ``img_size`` of the run that wrote ``checkpoint_path`` (our training checkpoints record
    their config), else :data:`DEFAULT_IMG_SIZE`; a missing file is left to the model loading that
    follows, which reports it."""
    if not checkpoint_path.is_file():
        return DEFAULT_IMG_SIZE
    checkpoint = load_checkpoint_file(checkpoint_path, trust=trust)
    config = checkpoint.get("config") if isinstance(checkpoint, dict) else None
    size = config.get("img_size") if isinstance(config, dict) else None
    return size if isinstance(size, int) and size > 0 else DEFAULT_IMG_SIZE


def build_eval_parser() -> argparse.ArgumentParser:
    """CLI of classification/eval.py."""
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="example:\n  vmamba2d-eval --model vmamba2d_tiny --checkpoint runs/tiny/best.pth "
               "--data-dir data/tiny/imagenet --use-ema",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="timm model name, e.g. vmamba2d_tiny")
    p.add_argument("--checkpoint", required=True, help=".pth / .safetensors weights")
    p.add_argument("--data-dir", required=True,
                   help="folder with val/<class>/* (or the class folders directly)")
    p.add_argument("--model-kwargs", nargs="+", metavar="KEY=VALUE", default=None,
                   help="extra model arguments (default: those stored in our training checkpoints)")
    p.add_argument("--use-ema", action="store_true", help="evaluate the EMA weights")
    p.add_argument("--img-size", type=int, default=None,
                   help=f"input size (default: the size the checkpoint's run trained at, else {DEFAULT_IMG_SIZE})")
    p.add_argument("--crop-pct", type=float, default=None,
                   help="eval crop fraction (default: the model's pretrained cfg)")
    p.add_argument("--interpolation", default=None, choices=("bilinear", "bicubic", "nearest"),
                   help="resize interpolation (default: the model's pretrained cfg)")
    p.add_argument("--batch-size", type=int, default=128, help="images per process")
    p.add_argument("--workers", type=int, default=None,
                   help=f"data-loading processes (default: {DEFAULT_WORKERS}, at most the available cores)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument("--amp", choices=AMP_CHOICES, default="none")
    p.add_argument("--skip-bad-images", action="store_true",
                   help="leave unreadable images out (counted as bad_images) instead of stopping")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="load with full unpickling (only for files you trust)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--output-json", default=None, help="also write the results to this file")
    return p


def run_eval(args: argparse.Namespace, ctx: DistContext) -> dict[str, Any]:
    """Evaluate; returns top1, top5, loss, images, img_per_s (+ model, checkpoint, ema)."""
    logger = setup_logger(ctx.is_main)
    if args.img_size is None:
        args.img_size = trained_img_size(Path(args.checkpoint), args.trust_checkpoint)
    if args.workers is None:
        args.workers = min(DEFAULT_WORKERS, available_cores())
    if args.batch_size < 1 or args.img_size < 1 or args.workers < 0:
        raise UsageError("--batch-size and --img-size must be >= 1 and --workers >= 0")
    if args.crop_pct is not None and not 0 < args.crop_pct <= 1:
        raise UsageError(f"--crop-pct must be in (0, 1], got {args.crop_pct}")
    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        raise UsageError(f"--data-dir: folder not found: {data_dir}")
    val_dir = resolve_val_dir(data_dir)
    classes = list_classes(val_dir, "--data-dir")
    check_model_name(args.model)
    model_kwargs = parse_model_kwargs(args.model_kwargs) if args.model_kwargs else None
    model = load_model_for_eval(args.model, Path(args.checkpoint), len(classes), args.use_ema,
                                args.trust_checkpoint, model_kwargs).to(ctx.device)
    data_config = model_data_config(model, args.img_size, args.interpolation, args.crop_pct)
    dataset = make_image_folder(val_dir, eval_transform(data_config), classes)
    loader = eval_loader(dataset, batch_size=args.batch_size, rank=ctx.rank,
                         world_size=ctx.world_size, workers=args.workers,
                         pin_memory=ctx.device.type == "cuda")
    logger.info("evaluating %s (%s weights from %s) on %d images, %d classes; input %s, crop_pct "
                "%.3f, %s", args.model, "EMA" if args.use_ema else "model", args.checkpoint,
                len(dataset), len(classes), data_config["input_size"], data_config["crop_pct"],
                data_config["interpolation"])
    results = evaluate(model, loader, ctx, args.amp, args.progress,
                       bad_images=BadImages(skip=args.skip_bad_images))
    results.update(model=args.model, checkpoint=str(args.checkpoint), ema=args.use_ema,
                   img_size=args.img_size, crop_pct=data_config["crop_pct"])
    if ctx.is_main:
        logger.info("top-1 %.3f  top-5 %.3f  loss %.4f  (%d images, %.1f img/s)", results["top1"],
                    results["top5"], results["loss"], results["images"], results["img_per_s"])
        print(json.dumps(results))
        if args.output_json:
            Path(args.output_json).write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; returns the process exit code (2 for bad input, 1 for a data transform
    that raised)."""
    args = build_eval_parser().parse_args(argv)
    try:
        ctx = init_distributed(args.device)
        try:
            run_eval(args, ctx)
        finally:
            shutdown_distributed()
    except UsageError as error:
        print(f"eval.py: error: {error}", file=sys.stderr)
        return 2
    except DataTransformError as error:
        print(f"eval.py: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
