"""Train a detector (mmdetection 3.x config) with mmengine's Runner.

Single process:   python det/train.py CONFIG [--work-dir DIR] [--amp] [--resume [CKPT]] [--from-scratch]
Multi-GPU:        torchrun --nproc_per_node=8 det/train.py CONFIG --launcher pytorch
Slurm:            srun ... python det/train.py CONFIG --launcher slurm

Checkpoints are written crash-safe and ``--resume`` follows the rules of seg/train.py
(vmamba2d.openmmlab.safe_checkpoints, vmamba2d.openmmlab.work_dir). Bad input (missing files,
unreadable checkpoints, a work dir that cannot be started or resumed as asked) is reported in one
line on stderr, exit code 2.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import vmamba2d.det  # noqa: E402,F401  (mmcv-lite compatibility, checkpoint allow-list, backbone)
from mmengine.logging import print_log  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from vmamba2d.det.runtime import check_coco_paths  # noqa: E402
from vmamba2d.openmmlab.errors import InputError  # noqa: E402
from vmamba2d.openmmlab.runtime import (  # noqa: E402
    add_runner_arguments,
    check_backbone_weights,
    enable_amp,
    load_config,
    parse_runner_args,
)
from vmamba2d.openmmlab.work_dir import prepare_work_dir  # noqa: E402
from vmamba2d.training import RunFolderError  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a detector (mmdet config).")
    parser.add_argument("config", help="config file, e.g. configs/det/mask-rcnn_vmamba2d-tiny_fpn_1x_coco.py")
    parser.add_argument("--work-dir", help="folder for logs and checkpoints (default ./work_dirs/<config name>)")
    parser.add_argument("--resume", nargs="?", const="auto", default=None, metavar="CKPT",
                        help="resume: without a value from the work dir's last complete checkpoint "
                             "(last_checkpoint), or from CKPT; a truncated / unreadable checkpoint is "
                             "reported, never loaded")
    parser.add_argument("--amp", action="store_true", help="mixed-precision training (CUDA)")
    parser.add_argument("--from-scratch", action="store_true",
                        help="train the backbone from random weights; without it the config's ImageNet "
                             "checkpoint (pretrained/<model>_in1k.pth) must exist")
    parser.add_argument("--auto-scale-lr", action="store_true",
                        help="scale the learning rate by total batch / auto_scale_lr.base_batch_size")
    add_runner_arguments(parser, "train_dataloader.batch_size=2")
    return parse_runner_args(parser, argv)


def train(argv=None) -> None:
    """Check the inputs, prepare the work dir, build mmengine's Runner and train; raises on bad input."""
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options, args.launcher, args.work_dir)
    check_backbone_weights(cfg, from_scratch=args.from_scratch)
    check_coco_paths(cfg, ("train_dataloader", "val_dataloader"))
    if args.amp:
        enable_amp(cfg)
    if args.auto_scale_lr:
        if cfg.get("auto_scale_lr") is None:
            raise InputError("--auto-scale-lr: the config defines no auto_scale_lr=dict(base_batch_size=...)")
        cfg.auto_scale_lr.enable = True
    for note in prepare_work_dir(cfg, args.resume):  # atomic checkpoints; resume checks and repair
        print_log(note, logger="current", level=logging.WARNING)
    runner = Runner.from_cfg(cfg) if "runner_type" not in cfg else RUNNERS.build(cfg)
    runner.train()


def main(argv=None) -> int:
    """CLI entry point; returns the exit code (2 for bad input, reported in one line on stderr)."""
    try:
        train(argv)
    except (InputError, RunFolderError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
