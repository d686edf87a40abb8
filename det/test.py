"""Evaluate a detector checkpoint: box and mask AP on COCO (pycocotools' COCOeval via mmdet's CocoMetric).

Single process:   python det/test.py CONFIG CHECKPOINT [--work-dir DIR]
Multi-GPU:        torchrun --nproc_per_node=8 det/test.py CONFIG CHECKPOINT --launcher pytorch

The checkpoint is loaded with ``weights_only=True`` on every torch
(vmamba2d.openmmlab.checkpoint_safety). Bad input (missing files, a refused or unreadable checkpoint)
is reported in one line on stderr, exit code 2.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vmamba2d.det.commands import TEST  # noqa: E402  (imports vmamba2d.det first: mmcv-lite compatibility, backbone)

parse_args, evaluate, main = TEST.parse_args, TEST.evaluate, TEST.main

if __name__ == "__main__":
    sys.exit(main())
