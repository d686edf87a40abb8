"""Top-1 / top-5 accuracy and throughput of a registered timm model + checkpoint on a val folder.

    python classification/eval.py --model vmamba2d_tiny --checkpoint RUN/best.pth \
        --data-dir /data/imagenet [--use-ema]

Options: ``python classification/eval.py --help``; the code is vmamba2d/classification/eval.py.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import vmamba2d from this checkout
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from vmamba2d.classification.eval import main

if __name__ == "__main__":
    sys.exit(main())
