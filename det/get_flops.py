"""Parameters and FLOPs of a whole detector (fvcore, one multiply-add = one flop).

    python det/get_flops.py configs/det/mask-rcnn_vmamba2d-tiny_fpn_1x_coco.py --shape 1280 800

FLOPs are those of mmdet's ``mode='tensor'`` forward on one image (backbone, neck, RPN head and the
RoI heads on the RPN's proposals; VMamba reports Mask R-CNN FLOPs this way at 1280 x 800), counted
by vmamba2d.flops.flops_by_operator: each selective scan is one custom-op node with its own FLOP
handle, which needs the compiled CPU kernel. The RoI-head share depends on the number of proposals,
which is printed too.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import vmamba2d.det  # noqa: E402,F401  (mmcv-lite compatibility, backbone registration)
from mmdet.registry import MODELS  # noqa: E402
from mmdet.utils import register_all_modules  # noqa: E402
from mmengine.config import DictAction  # noqa: E402

from vmamba2d.det.complexity import detector_complexity  # noqa: E402
from vmamba2d.openmmlab.runtime import load_config  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Parameters and FLOPs of a detector.")
    parser.add_argument("config", help="config file")
    parser.add_argument("--shape", type=int, nargs="+", default=[1280, 800],
                        help="input height and width (one value: square)")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, default=None,
                        help="override config entries")
    args = parser.parse_args(argv)
    if len(args.shape) not in (1, 2) or min(args.shape) < 1:
        parser.error(f"--shape takes one or two positive ints, got {args.shape}")
    return args


def main(argv=None) -> dict:
    """Print and return :func:`vmamba2d.det.complexity.detector_complexity` for the config."""
    args = parse_args(argv)
    shape = (args.shape[0], args.shape[-1])
    cfg = load_config(args.config, args.cfg_options)
    register_all_modules()
    model = MODELS.build(cfg.model)
    start = time.perf_counter()
    result = detector_complexity(model, shape)
    elapsed = time.perf_counter() - start
    print("| config | input | params (M) | FLOPs (G) | backbone FLOPs (G) | RPN proposals |")
    print("|---|---|---|---|---|---|")
    print(f"| {os.path.basename(args.config)} | 1x3x{shape[0]}x{shape[1]} | {result['params'] / 1e6:.2f} "
          f"| {result['flops'] / 1e9:.1f} | {result['backbone_flops'] / 1e9:.1f} | {result['proposals']} |")
    print(f"(traced in {elapsed:.1f} s)")
    return result


if __name__ == "__main__":
    main()
