"""Evaluate a detector checkpoint: box and mask AP on COCO (pycocotools' COCOeval via mmdet's CocoMetric).

Single process:   python det/test.py CONFIG CHECKPOINT [--work-dir DIR]
Multi-GPU:        torchrun --nproc_per_node=8 det/test.py CONFIG CHECKPOINT --launcher pytorch

The checkpoint is loaded with ``weights_only=True`` on every torch
(vmamba2d.openmmlab.checkpoint_safety). Bad input (missing files, a refused or unreadable checkpoint)
is reported in one line on stderr, exit code 2.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import vmamba2d.det  # noqa: E402,F401  (mmcv-lite compatibility, checkpoint allow-list, backbone)
from mmengine.dist import get_rank  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from vmamba2d.det.runtime import check_coco_paths  # noqa: E402
from vmamba2d.openmmlab.errors import InputError, MissingFileError  # noqa: E402
from vmamba2d.openmmlab.runtime import (  # noqa: E402
    add_runner_arguments,
    load_config,
    metrics_summary,
    parse_runner_args,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Evaluate a detector checkpoint (COCO box / mask AP).")
    parser.add_argument("config", help="config file")
    parser.add_argument("checkpoint", help="checkpoint file (from det/train.py)")
    parser.add_argument("--work-dir", help="folder for the evaluation log")
    add_runner_arguments(parser, "test_dataloader.dataset.data_root=... test_evaluator.ann_file=...")
    return parse_runner_args(parser, argv)


def evaluate(argv=None) -> dict:
    """Run the test loop; print and return the metrics (``coco/bbox_mAP``, ``coco/segm_mAP``, ...);
    raises on bad input."""
    args = parse_args(argv)
    if not os.path.isfile(args.checkpoint):
        raise MissingFileError(f"checkpoint not found: {args.checkpoint}")
    work_dir = args.work_dir
    if work_dir is None:
        work_dir = os.path.join("./work_dirs", os.path.splitext(os.path.basename(args.config))[0], "test")
    cfg = load_config(args.config, args.cfg_options, args.launcher, work_dir)
    check_coco_paths(cfg, ("test_dataloader",))
    cfg.load_from = args.checkpoint
    runner = Runner.from_cfg(cfg) if "runner_type" not in cfg else RUNNERS.build(cfg)
    metrics = runner.test()
    if get_rank() == 0:
        print(f"{os.path.basename(args.config)}: {metrics_summary(metrics, digits=3)}")
    return metrics


def main(argv=None) -> int:
    """CLI entry point; returns the exit code (2 for bad input, reported in one line on stderr)."""
    try:
        evaluate(argv)
    except InputError as error:
        print(f"test.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
