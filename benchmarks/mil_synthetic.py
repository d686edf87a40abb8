"""Synthetic MIL benchmark (docs/mil.md#synthetic-task): only the 2D arrangement of tumour patches carries the label.

Writes a synthetic dataset (h5 slide files + labels.csv), trains 2DMambaMIL, its blocks run on
the raster canvas as a 1D sequence (the 1D reference of docs/mil.md), the 1D MambaMIL (tissue
tokens) and the paper's other baselines (ABMIL, CLAM-SB, DSMIL, TransMIL, S4MIL, MambaMIL with
SRMamba) on it through the real training CLI (``mil/train.py`` options of
vmamba2d/configs/mil/synthetic.yaml), and writes a Markdown table: test AUC at the epoch chosen on val, the per-epoch test AUC curve,
the first epoch reaching 0.95 and the time per epoch.

    python benchmarks/mil_synthetic.py --out benchmarks/mil_synthetic.md --work out/mil_synthetic
    python benchmarks/mil_synthetic.py --min-size 8 --max-size 16 --out out/mil_synthetic_small.md
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from vmamba2d.mil.cli import train_main
from vmamba2d.mil.synthetic import write_synthetic_dataset

SSM_KWARGS = ["dim=32", "d_state=8", "expand=2", "num_blocks=1"]
# Rows: id (--models, run folder) -> (label, mil/train.py --model, --model-kwargs). "raster" is
# the 1D reference (docs/mil.md#the-1d-reference): the 2D model's blocks on the row-major canvas,
# pads included; "mambamil" is the paper's 1D baseline on the tissue tokens alone. Every model is
# 32 wide here (the synthetic features are 32-d); the other options are each model's defaults.
MODELS = {
    "mambamil2d": ("2D (MambaMIL2D)", "mambamil2d", SSM_KWARGS),
    "raster": ("1D, raster canvas (MambaMIL2D scan=raster)", "mambamil2d", [*SSM_KWARGS, "scan=raster"]),
    "mambamil": ("1D, tissue tokens (MambaMIL)", "mambamil", SSM_KWARGS),
    "abmil": ("bag (ABMIL)", "abmil", ["dim=32", "act=gelu", "init=xavier"]),
    "clam_sb": ("bag (CLAM-SB)", "clam_sb", ["dim=32", "attn_hidden=16"]),
    "dsmil": ("bag (DSMIL)", "dsmil", ["query_dim=32"]),
    "transmil": ("sequence (TransMIL)", "transmil", ["dim=32", "heads=4", "landmarks=16"]),
    "s4mil": ("sequence (S4MIL)", "s4mil", ["dim=32", "d_state=8"]),
    "mambamil_sr": ("1D, tissue tokens, SRMamba (MambaMIL, rate 10)", "mambamil_sr", SSM_KWARGS),
}
# Models with the Mamba init options that --reference-settings switches.
SSM_MODELS = ("mambamil2d", "mambamil", "mambamil_sr")
# vmamba2d/configs/mil/synthetic.yaml, spelled out so that the bag model gets only the options it has.
TRAINING = ["--task", "classification", "--label-map", "negative=0", "positive=1",
            "--lr", "1e-3", "--weight-decay", "1e-5", "--scheduler", "cosine", "--shuffle",
            "--select", "best", "--select-metric", "auc"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("out/mil_synthetic.md"), help="Markdown table")
    p.add_argument("--work", type=Path, default=Path("out/mil_synthetic"),
                   help="folder for the dataset and the run folders (must not hold old runs)")
    p.add_argument("--min-size", type=int, default=16)
    p.add_argument("--max-size", type=int, default=40)
    p.add_argument("--train", type=int, default=400)
    p.add_argument("--val", type=int, default=100)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="data and training seed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--reference-settings", action="store_true",
                   help="the Mamba rows with the model settings of the reference observations "
                        "(docs/mil.md#reference-observations): attention "
                        "pooling over pad cells too (mask_pad=false) and PyTorch's default Linear "
                        "init (init=mamba)")
    p.add_argument("--shuffled-cells", action="store_true",
                   help="control: move every patch to a random cell of its slide (no signal left)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False)
    return p.parse_args(argv)


def read_history(run: Path) -> list[dict]:
    with open(run / "metrics.jsonl") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def first_epoch_at(values: list[float], level: float) -> str:
    hits = [i for i, v in enumerate(values) if v >= level]
    return str(hits[0]) if hits else "never"


def main(argv=None) -> int:
    args = parse_args(argv)
    data = args.work / "data"
    if not (data / "labels.csv").is_file():
        try:
            write_synthetic_dataset(data, {"train": args.train, "val": args.val, "test": args.test},
                                    min_size=args.min_size, max_size=args.max_size, seed=args.seed,
                                    shuffled_cells=args.shuffled_cells)
        except ValueError as error:
            print(f"mil_synthetic.py: error: {error}", file=sys.stderr)
            return 2
    rows, curves = [], []
    for row_id, (label, model, model_kwargs) in MODELS.items():
        if row_id not in args.models:
            continue
        run = args.work / row_id
        if args.reference_settings and model in SSM_MODELS:
            model_kwargs = [*model_kwargs, "init=mamba"] + (["mask_pad=false"] if model == "mambamil2d" else [])
        argv_train = [*TRAINING, "--model", model, "--model-kwargs", *model_kwargs,
                      "--feature-dir", str(data / "features"), "--label-csv",
                      str(data / "labels.csv"), "--output", str(run), "--epochs", str(args.epochs),
                      "--seeds", str(args.seed), "--threads", str(args.threads),
                      "--device", args.device, "--resume",
                      "--progress" if args.progress else "--no-progress"]
        start = time.perf_counter()
        code = train_main(argv_train)
        if code != 0:
            return code
        wall = time.perf_counter() - start
        summary = json.loads((run / f"seed{args.seed}" / "summary.json").read_text())
        history = read_history(run / f"seed{args.seed}")
        test_auc = [r["test"]["auc"] for r in history]
        seconds = [r["train_seconds"] for r in history]
        rows.append((label, summary["reported"]["auc"], summary["selected_epoch"], max(test_auc),
                     test_auc[-1], first_epoch_at(test_auc, 0.95), sum(seconds) / len(seconds),
                     wall))
        curves.append((label, test_auc))
    write_table(args, rows, curves)
    print(args.out.read_text())
    return 0


def write_table(args, rows, curves) -> None:
    lines = [
        "# Synthetic MIL benchmark: stacked vs. scattered tumour runs (docs/mil.md#synthetic-task)",
        "",
        f"Written by `python benchmarks/mil_synthetic.py {' '.join(sys.argv[1:])}` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}.",
        "",
        f"Data: H, W ~ U{{{args.min_size}..{args.max_size}}}, {args.train} train / {args.val} val / "
        f"{args.test} test slides, 32-d features, balanced labels, data seed {args.seed}. "
        "Only the 2D arrangement of the 9 tumour patches differs between the classes "
        "(`vmamba2d/mil/synthetic.py`)." + (
            " Model settings of the reference observations (`--reference-settings`, "
            "docs/mil.md#reference-observations): attention pooling "
            "over pad cells too, PyTorch's default Linear init." if args.reference_settings else "") + (
            " CONTROL: every patch moved to a random cell of its slide (`--shuffled-cells`), so "
            "the labels carry no signal." if args.shuffled_cells else ""),
        f"Training: `vmamba2d/configs/mil/synthetic.yaml` (Mamba rows: D = 32, N = 8, E = 64, 1 block; the "
        f"other baselines 32 wide, options in `benchmarks/mil_synthetic.py`; AdamW lr 1e-3, "
        f"wd 1e-5, cosine, {args.epochs} epochs, one slide per step, shuffled), seed {args.seed}, "
        f"device {args.device}, {args.threads} torch thread(s), {platform.processor() or 'CPU'} "
        f"(shared machine: times are indicative). torch {torch.__version__}.",
        "",
        "| model | test AUC at the val-selected epoch (epoch) | max test AUC over epochs | "
        "test AUC, last epoch | first epoch with test AUC >= 0.95 | train s / epoch | "
        "wall time (train + eval) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, auc, epoch, best, last, first, per_epoch, wall in rows:
        lines.append(f"| {label} | {auc:.3f} ({epoch}) | {best:.3f} | {last:.3f} | {first} | "
                     f"{per_epoch:.1f} | {wall / 60:.1f} min |")
    lines += ["", "The max over epochs is descriptive only (it looks at the test set); the "
              "reported number is the first column.", "", "Test AUC per epoch (0-based):", "",
              "| model | " + " | ".join(str(i) for i in range(len(curves[0][1]))) + " |",
              "|---|" + "---|" * len(curves[0][1])]
    for label, values in curves:
        lines.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
