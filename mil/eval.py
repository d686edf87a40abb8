"""Evaluate a checkpoint written by mil/train.py on a split (or on every row of another table).

    python mil/eval.py --checkpoint runs/bracs/seed0/best.pth --split test --predictions preds.csv
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import vmamba2d from this checkout
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from vmamba2d.mil.cli import eval_main

if __name__ == "__main__":
    sys.exit(eval_main())
