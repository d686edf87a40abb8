"""Parameters and FLOPs of a whole segmentor (fvcore, one multiply-add = one flop).

    python seg/get_flops.py vmamba2d/configs/seg/upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512.py --shape 512 2048

FLOPs are those of inference on one image (backbone + decode head; the auxiliary head is
training-only), counted by vmamba2d.flops.flops_by_operator: each selective scan is one custom-op
node with its own FLOP handle, which needs the compiled CPU kernel.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vmamba2d.seg.commands import FLOPS  # noqa: E402  (imports vmamba2d.seg first: mmcv-lite compatibility, backbone)

parse_args, main = FLOPS.parse_args, FLOPS.main

if __name__ == "__main__":
    main()
