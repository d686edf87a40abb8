"""Command-line entry points behind ``mil/train.py`` and ``mil/eval.py``."""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from ..runs.checkpoint import storage_error_message
from .config import FIELD_NAMES, MILConfig, UsageError, resolve_train_config
from .data.dataset import SlideDataset
from .data.errors import SlideDataError
from .data.tables import SlideEntry, read_survival_csv
from .engine import evaluate
from .models import model_from_checkpoint
from .runner import (CHECKPOINT_FORMAT, LOGGER, grid_options, resolve_device, setup_logging,
                     train, write_predictions)
from .slide_check import check_slides, describe_bad_slides
from .splits import SPLITS, classification_entries, run_splits
from .survival import assign_survival_bins


def train_main(argv: Optional[Sequence[str]] = None) -> int:
    """``mil/train.py``: returns the exit code (2 for bad input, nothing written then; 1 for a
    diverged run, whose last checkpoint stays intact)."""
    setup_logging()
    cfg = None
    try:
        cfg = resolve_train_config(argv)
        train(cfg)
    except UsageError as error:
        print(f"mil/train.py: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        message = storage_error_message(error, cfg.output) if cfg is not None else None
        if message is None:
            raise
        print(f"mil/train.py: error: {message} (--resume)", file=sys.stderr)
        return 2
    except FloatingPointError as error:
        print(f"mil/train.py: error: {error}. Lower --lr or train with --amp none, then continue "
              "with --resume", file=sys.stderr)
        return 1
    return 0


def build_eval_parser() -> argparse.ArgumentParser:
    """CLI of mil/eval.py."""
    p = argparse.ArgumentParser(
        description="Evaluate a MIL checkpoint (best.pth / last.pth of a mil/train.py run) on a "
                    "split of its data, or on every row of another label table.",
        epilog="example:\n  vmamba2d-mil-eval --checkpoint runs/mil/seed0/best.pth --split test "
               "--predictions preds.csv",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="best.pth or last.pth of a run folder")
    p.add_argument("--split", default="test", choices=(*SPLITS, "all"),
                   help="split of the run's tables, or 'all' rows of --label-csv")
    p.add_argument("--feature-dir", help="override the run's feature folder")
    p.add_argument("--label-csv", help="override the run's label / survival table")
    p.add_argument("--split-csv", help="override the run's split table")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--predictions", help="write per-slide predictions to this CSV")
    p.add_argument("--skip-bad-slides", action="store_true",
                   help="evaluate without the slides whose files are unusable (default: list "
                        "them all and stop)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    return p


def _load_checkpoint(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UsageError(f"--checkpoint {path} not found")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unreadable / truncated / foreign pickles
        raise UsageError(f"--checkpoint {path} cannot be read: {_load_error_cause(error)}; "
                         "nothing of it was run") from error
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise UsageError(f"--checkpoint {path} was not written by mil/train.py")
    return checkpoint


def _load_error_cause(error: Exception) -> str:
    """One line of a failed ``torch.load``: the cause of a weights_only refusal (``Unsupported
    global: ...``) without torch's advice around it, else the type and first line."""
    advice = ("Weights only load failed", "Check the documentation", "Please file an issue",
              "(1)", "(2)")
    lines = [line.split("WeightsUnpickler error:", 1)[-1].strip()
             for line in str(error).splitlines()]
    causes = [line for line in lines if line and not line.startswith(advice)]
    cause = re.split(r"\. Please ", causes[0], maxsplit=1)[0].rstrip(".") if causes else ""
    return f"{type(error).__name__}: {cause}".rstrip(": ")


def check_predictions_path(path: Path) -> None:
    """UsageError, before anything is evaluated, when ``--predictions`` cannot be written."""
    if path.is_dir():
        raise UsageError(f"--predictions {path} is a folder; give a CSV file name")
    if not path.parent.is_dir():
        raise UsageError(f"--predictions {path}: folder {path.parent} does not exist")


def _eval_entries(cfg: MILConfig, checkpoint: dict[str, Any], split: str):
    """Entries to evaluate, labelled with the checkpoint's label map / training bin edges."""
    if split == "all":
        if cfg.task == "survival":
            entries = read_survival_csv(cfg.label_csv)
        else:
            entries = classification_entries(cfg)[0]
    else:  # the run's splits, without the slides its training skipped
        entries = run_splits(replace(cfg, select="last"), checkpoint["fold"],
                             frozenset(checkpoint.get("skipped_slides", []))).split(split)
    if cfg.task == "survival":  # bins of the training patients the model was trained with
        bins = assign_survival_bins([e.time for e in entries], checkpoint["bin_edges"])
        entries = [replace(e, label=int(b)) for e, b in zip(entries, bins)]
    return entries


def usable_entries(entries: list[SlideEntry], cfg: MILConfig, in_dim: int, split: str,
                   skip: bool) -> tuple[list[SlideEntry], list[str]]:
    """Read every slide to evaluate once: (entries without unusable slides, their ids) with
    ``skip``, else a UsageError listing every unusable slide."""
    uses = {entry.slide_id: [split] for entry in entries}
    _, bad = check_slides(uses, cfg.feature_dir, grid_options(cfg), in_dim)
    if not bad:
        return entries, []
    report = describe_bad_slides(bad, len(uses))
    if not skip:
        raise UsageError(f"{report}\nFix or remove these files, or pass --skip-bad-slides to "
                         "evaluate without them")
    LOGGER.warning("%s\nskipped (--skip-bad-slides)", report)
    skipped = {b.slide_id for b in bad}
    kept = [entry for entry in entries if entry.slide_id not in skipped]
    if not kept:
        raise UsageError(f"--split {split}: every slide is unusable")
    return kept, sorted(skipped)


def eval_main(argv: Optional[Sequence[str]] = None) -> int:
    """``mil/eval.py``: prints the metrics as JSON; returns the exit code."""
    setup_logging()
    args = build_eval_parser().parse_args(argv)
    try:
        if args.predictions:
            check_predictions_path(Path(args.predictions))
        checkpoint = _load_checkpoint(Path(args.checkpoint))
        saved = {k: v for k, v in checkpoint["config"].items() if k in FIELD_NAMES}
        overrides = {k: getattr(args, k) for k in ("feature_dir", "label_csv", "split_csv")
                     if getattr(args, k)}
        cfg = MILConfig(**{**saved, **overrides, "label_map": checkpoint["label_map"]})
        if args.label_csv and args.split != "all" and not args.split_csv:
            raise UsageError("--label-csv of another cohort: pass --split all (or --split-csv)")
        device = resolve_device(args.device)
        try:
            entries = _eval_entries(cfg, checkpoint, args.split)
            if not entries:
                raise UsageError(f"--split {args.split}: no slides to evaluate")
            entries, skipped = usable_entries(entries, cfg, checkpoint["in_dim"], args.split,
                                              args.skip_bad_slides)
            dataset = SlideDataset(entries, cfg.feature_dir, grid=grid_options(cfg),
                                   in_dim=checkpoint["in_dim"])
        except (SlideDataError, FileNotFoundError) as error:
            raise UsageError(str(error)) from error
        model = model_from_checkpoint(Path(args.checkpoint)).to(device)
        metrics, rows = evaluate(model, dataset, task=cfg.task,
                                 num_classes=checkpoint["model_config"]["num_classes"],
                                 alpha=cfg.alpha, device=device, amp="none",
                                 workers=args.workers, progress=args.progress, desc=args.split)
    except UsageError as error:
        print(f"mil/eval.py: error: {error}", file=sys.stderr)
        return 2
    if args.predictions:
        write_predictions(Path(args.predictions), rows)
    print(json.dumps({"checkpoint": args.checkpoint, "epoch": checkpoint["epoch"],
                      "split": args.split, **metrics,
                      "skipped_bad_slides": {"count": len(skipped), "slide_ids": skipped}},
                     indent=2))
    return 0


COMMANDS = {"train": train_main, "eval": eval_main}
USAGE = ("usage: python -m vmamba2d.mil.cli {train,eval} [options]   (installed: vmamba2d-mil-train, "
         "vmamba2d-mil-eval; each with --help)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m vmamba2d.mil.cli train|eval ...``: the two commands; usage for ``--help``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        return COMMANDS[args[0]](args[1:])
    asked = args[:1] in (["-h"], ["--help"])
    print(USAGE, file=sys.stdout if asked else sys.stderr)
    return 0 if asked else 2


if __name__ == "__main__":
    sys.exit(main())
