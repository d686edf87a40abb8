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

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vmamba2d.det.commands import TRAIN  # noqa: E402  (imports vmamba2d.det first: mmcv-lite compatibility, backbone)

parse_args, train, main = TRAIN.parse_args, TRAIN.train, TRAIN.main

if __name__ == "__main__":
    sys.exit(main())
