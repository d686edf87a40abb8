"""Evaluate a segmentor checkpoint (mIoU), single-scale or multi-scale + flip (--tta).

Single process:   python seg/test.py CONFIG CHECKPOINT [--tta] [--work-dir DIR]
Multi-GPU:        torchrun --nproc_per_node=4 seg/test.py CONFIG CHECKPOINT --launcher pytorch

The checkpoint is loaded with ``weights_only=True`` on every torch (vmamba2d.openmmlab.checkpoint_safety).
Bad input (missing files, a refused or unreadable checkpoint) is reported in one line on stderr,
exit code 2.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vmamba2d.seg.commands import TEST  # noqa: E402  (imports vmamba2d.seg first: mmcv-lite compatibility, backbone)

parse_args, evaluate, main = TEST.parse_args, TEST.evaluate, TEST.main

if __name__ == "__main__":
    sys.exit(main())
