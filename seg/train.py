"""Train a segmentor (mmsegmentation 1.x config) with mmengine's Runner.

Single process:   python seg/train.py CONFIG [--work-dir DIR] [--amp] [--resume [CKPT]] [--from-scratch]
Multi-GPU:        torchrun --nproc_per_node=4 seg/train.py CONFIG --launcher pytorch
Slurm:            srun ... python seg/train.py CONFIG --launcher slurm

Bad input (missing files, unreadable checkpoints, a work dir that cannot be started or resumed as
asked) is reported in one line on stderr, exit code 2.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vmamba2d.seg.commands import TRAIN  # noqa: E402  (imports vmamba2d.seg first: mmcv-lite compatibility, backbone)

parse_args, train, main = TRAIN.parse_args, TRAIN.train, TRAIN.main

if __name__ == "__main__":
    sys.exit(main())
