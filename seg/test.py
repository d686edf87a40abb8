"""Evaluate a segmentor checkpoint (mIoU), single-scale or multi-scale + flip (--tta).

Single process:   python seg/test.py CONFIG CHECKPOINT [--tta] [--work-dir DIR]
Multi-GPU:        torchrun --nproc_per_node=4 seg/test.py CONFIG CHECKPOINT --launcher pytorch

The checkpoint is loaded with ``weights_only=True`` on every torch (vmamba2d.seg.checkpoint_safety).
Bad input (missing files, a refused or unreadable checkpoint) is reported in one line on stderr,
exit code 2.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import vmamba2d.seg  # noqa: E402,F401  (mmcv-lite compatibility, checkpoint allow-list, backbone)
from mmengine.dist import get_rank  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from vmamba2d.seg.errors import SegInputError, SegMissingFileError  # noqa: E402
from vmamba2d.seg.runtime import (  # noqa: E402
    add_runner_arguments,
    check_dataset_folders,
    load_config,
    metrics_summary,
    parse_runner_args,
    use_multiscale_flip_test,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Evaluate a segmentor checkpoint (mIoU).")
    parser.add_argument("config", help="config file")
    parser.add_argument("checkpoint", help="checkpoint file (from seg/train.py)")
    parser.add_argument("--work-dir", help="folder for the evaluation log")
    parser.add_argument("--tta", action="store_true", help="multi-scale (0.5-1.75) + flip test")
    add_runner_arguments(parser, "test_dataloader.dataset.data_root=...")
    return parse_runner_args(parser, argv)


def evaluate(argv=None) -> dict:
    """Run the test loop; print and return the metrics (``mIoU``, ``aAcc``, ``mAcc``); raises on bad input."""
    args = parse_args(argv)
    if not os.path.isfile(args.checkpoint):
        raise SegMissingFileError(f"checkpoint not found: {args.checkpoint}")
    work_dir = args.work_dir
    if work_dir is None:
        config_name = os.path.splitext(os.path.basename(args.config))[0]
        work_dir = os.path.join("./work_dirs", config_name, "test" + ("_tta" if args.tta else ""))
    cfg = load_config(args.config, args.cfg_options, args.launcher, work_dir)
    check_dataset_folders(cfg, ("test_dataloader",))
    cfg.load_from = args.checkpoint
    if args.tta:
        use_multiscale_flip_test(cfg)
    runner = Runner.from_cfg(cfg) if "runner_type" not in cfg else RUNNERS.build(cfg)
    metrics = runner.test()
    if get_rank() == 0:
        mode = "multi-scale + flip" if args.tta else "single-scale"
        print(f"{os.path.basename(args.config)} ({mode}): {metrics_summary(metrics)}")
    return metrics


def main(argv=None) -> int:
    """CLI entry point; returns the exit code (2 for bad input, reported in one line on stderr)."""
    try:
        evaluate(argv)
    except SegInputError as error:
        print(f"test.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
