"""Parameters and FLOPs of a whole detector (fvcore, one multiply-add = one flop).

    python det/get_flops.py vmamba2d/configs/det/mask-rcnn_vmamba2d-tiny_fpn_1x_coco.py --shape 1280 800

FLOPs are those of mmdet's ``mode='tensor'`` forward on one image (backbone, neck, RPN head and the
RoI heads on the RPN's proposals; VMamba reports Mask R-CNN FLOPs this way at 1280 x 800), counted
by vmamba2d.flops.flops_by_operator: each selective scan is one custom-op node with its own FLOP
handle, which needs the compiled CPU kernel. The RoI-head share depends on the number of proposals,
which is printed too.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vmamba2d.det.commands import FLOPS  # noqa: E402  (imports vmamba2d.det first: mmcv-lite compatibility, backbone)

parse_args, main = FLOPS.parse_args, FLOPS.main

if __name__ == "__main__":
    main()
