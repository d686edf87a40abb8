"""Run one of mmdetection's own tools with mmcv-lite and this repository's configs.

    python det/mmdet_tool.py misc/print_config.py CONFIG
    python det/mmdet_tool.py analysis_tools/get_flops.py CONFIG
    python det/mmdet_tool.py analysis_tools/browse_dataset.py CONFIG --not-show --output-dir vis
    python det/mmdet_tool.py analysis_tools/benchmark.py CONFIG --checkpoint CHECKPOINT
    python det/mmdet_tool.py --list

Same as ``python -m vmamba2d.det.mmdet_tools ...`` (see that module).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vmamba2d.det.mmdet_tools import main  # noqa: E402

if __name__ == "__main__":
    main()
