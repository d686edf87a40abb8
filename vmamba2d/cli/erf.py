"""Effective receptive fields of one or several timm backbones, side by side (RepLKNet's ERF).

Example (the paper's comparison, trained weights, 50 ImageNet validation images at 1024x1024):

    vmamba2d-erf --models swin_tiny_patch4_window7_224 vmamba_tiny vmamba2d_tiny \
        --checkpoints swin.pth vmamba_t.pth vmamba2d_t.pth --data /data/imagenet/val --out out/erf

Writes to --out: erf_grid.png (titled heatmaps of log10(map + 1) / max), <model>.npy (the raw
mean maps, (S, S) float64), area_ratios.csv / area_ratios.md (high-contribution area ratios at
t = 0.2 / 0.3 / 0.5 / 0.99, images used, NaN maps skipped).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from vmamba2d import erf

NO_CHECKPOINT = "-"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", required=True, help="timm model names")
    parser.add_argument("--checkpoints", nargs="+", default=None,
                        help=f"one weights file per model ('{NO_CHECKPOINT}' for none)")
    parser.add_argument("--random-init", action="store_true",
                        help="untrained weights for models without a checkpoint (default: timm's "
                             "pretrained weights)")
    parser.add_argument("--data", default=None, help="image folder (default: synthetic 1/f images)")
    parser.add_argument("--num-images", type=int, default=50)
    parser.add_argument("--input-size", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic images and init")
    parser.add_argument("--model-kwargs", nargs="+", default=[], metavar="KEY=VALUE",
                        help="extra timm.create_model arguments for every model, e.g. routes=corners")
    parser.add_argument("--out", default="out/erf", help="output folder")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.checkpoints is not None and len(args.checkpoints) != len(args.models):
        parser.error(f"--checkpoints needs one entry per model ({len(args.models)}), "
                     f"got {len(args.checkpoints)}")
    if args.data is not None and not Path(args.data).is_dir():
        parser.error(f"--data must be an existing folder of images, got {args.data!r}")
    malformed = [item for item in args.model_kwargs if "=" not in item or item.startswith("=")]
    if malformed:
        parser.error(f"--model-kwargs takes KEY=VALUE items, got {malformed}")
    args.model_kwargs = dict(item.split("=", 1) for item in args.model_kwargs)
    if args.num_images < 1 or args.input_size < 32:
        parser.error("--num-images must be >= 1 and --input-size >= 32")
    return args


def run(args: argparse.Namespace) -> dict[str, erf.ERFResult]:
    """Computes, saves and tabulates the ERF of every model in ``args.models``."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = args.checkpoints or [NO_CHECKPOINT] * len(args.models)
    results: dict[str, erf.ERFResult] = {}
    titles = []
    for name, checkpoint in zip(args.models, checkpoints):
        checkpoint = None if checkpoint == NO_CHECKPOINT else checkpoint
        torch.manual_seed(args.seed)
        model = erf.create_feature_model(name, args.input_size, checkpoint=checkpoint,
                                         pretrained=checkpoint is None and not args.random_init,
                                         model_kwargs=args.model_kwargs)
        images = (erf.folder_images(args.data, args.num_images, args.input_size) if args.data
                  else erf.synthetic_images(args.num_images, args.input_size, seed=args.seed))
        results[name] = erf.compute_erf(model, images, device=args.device, batch_size=args.batch_size,
                                        progress=name, total=args.num_images)
        np.save(out / f"{name}.npy", results[name].mean_map)
        if results[name].num_nan:
            print(f"{name}: skipped {results[name].num_nan} NaN maps")
        weights = "checkpoint" if checkpoint else "random init" if args.random_init else "pretrained"
        titles.append(f"{name}\n({weights}, {args.input_size}px, {results[name].num_used} img)")
        del model
    grid = erf.plot_erf_grid([erf.normalized_heatmap(r.mean_map) for r in results.values()], titles,
                             out / "erf_grid.png")
    rows = erf.area_ratio_rows(results)
    csv_path, md_path = erf.write_tables(rows, out)
    print(erf.markdown_table(rows))
    print(f"wrote {grid}, {csv_path}, {md_path} and {len(results)} .npy maps")
    return results


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
