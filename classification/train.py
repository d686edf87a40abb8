"""Train an image classifier on an ImageNet-layout folder (docs/training.md recipe by default).

    python classification/train.py --config vmamba2d_tiny --data-dir DATA --output RUN
    torchrun --nproc_per_node 8 classification/train.py --config vmamba2d_tiny ...
    python classification/train.py ... --resume auto

Options: ``python classification/train.py --help``; the training loop, run-folder commits and
resume rules are in vmamba2d/classification/train.py.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import vmamba2d from this checkout
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from vmamba2d.classification.train import main

if __name__ == "__main__":
    sys.exit(main())
