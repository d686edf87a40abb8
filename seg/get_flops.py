"""Parameters and FLOPs of a whole segmentor (fvcore, one multiply-add = one flop).

    python seg/get_flops.py configs/seg/upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512.py --shape 512 2048

FLOPs are those of inference on one image (backbone + decode head; the auxiliary head is
training-only), counted by vmamba2d.flops.flops_by_operator: each selective scan is one custom-op
node with its own FLOP handle, which needs the compiled CPU kernel.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import vmamba2d.seg  # noqa: E402,F401  (mmcv-lite compatibility, backbone registration)
from mmengine.config import DictAction  # noqa: E402
from mmseg.registry import MODELS  # noqa: E402
from mmseg.utils import register_all_modules  # noqa: E402

from vmamba2d.seg.complexity import segmentor_complexity  # noqa: E402
from vmamba2d.seg.runtime import load_config  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Parameters and FLOPs of a segmentor.")
    parser.add_argument("config", help="config file")
    parser.add_argument("--shape", type=int, nargs="+", default=[512, 2048],
                        help="input height and width (one value: square)")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, default=None,
                        help="override config entries")
    args = parser.parse_args(argv)
    if len(args.shape) not in (1, 2) or min(args.shape) < 1:
        parser.error(f"--shape takes one or two positive ints, got {args.shape}")
    return args


def main(argv=None) -> dict:
    """Print and return :func:`vmamba2d.seg.complexity.segmentor_complexity` for the config."""
    args = parse_args(argv)
    shape = (args.shape[0], args.shape[-1])
    cfg = load_config(args.config, args.cfg_options)
    register_all_modules()
    model = MODELS.build(cfg.model)
    start = time.perf_counter()
    result = segmentor_complexity(model, shape)
    elapsed = time.perf_counter() - start
    print("| config | input | params (M) | params w/o aux head (M) | FLOPs (G) |")
    print("|---|---|---|---|---|")
    print(f"| {os.path.basename(args.config)} | 1x3x{shape[0]}x{shape[1]} | {result['params'] / 1e6:.2f} "
          f"| {result['params_inference'] / 1e6:.2f} | {result['flops'] / 1e9:.1f} |")
    print(f"(traced in {elapsed:.1f} s)")
    return result


if __name__ == "__main__":
    main()
