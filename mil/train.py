"""Train 2DMambaMIL or one of its baselines (--model) on per-slide feature files (classification or survival).

    python mil/train.py --config bracs --feature-dir FEATURES --output runs/bracs
    python mil/train.py --config bracs --feature-dir FEATURES --output runs/bracs --resume

Options: ``python mil/train.py --help``; configs under vmamba2d/configs/mil/. See vmamba2d/mil/runner.py
for the run-folder layout.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import vmamba2d from this checkout
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from vmamba2d.mil.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
