"""Train 2DMambaMIL / MambaMIL / ABMIL on per-slide feature files (classification or survival).

    python mil/train.py --config bracs --feature-dir FEATURES --output runs/bracs
    python mil/train.py --config bracs --feature-dir FEATURES --output runs/bracs --resume

Options: ``python mil/train.py --help``; configs under configs/mil/. See vmamba2d/mil/runner.py
for the run-folder layout.
"""
import sys

from vmamba2d.mil.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
