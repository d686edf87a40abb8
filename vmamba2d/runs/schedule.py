"""Learning-rate schedule rules shared by the training scripts."""
from __future__ import annotations

from typing import Optional


def clamp_warmup(warmup: int, length: int, *, unit: str = "epochs",
                 option: str = "--warmup-epochs") -> tuple[int, Optional[str]]:
    """A warm-up that fits a run of ``length`` units, and a warning when it had to be shortened.

    A recipe's warm-up (e.g. 20 of 300 epochs) may not fit a shorter run (``--epochs 5``). The
    warm-up is then clamped to ``length - 1`` units, so the last unit runs at the schedule's own
    (non-warm-up) rate; a 1-unit run has no warm-up.

    Returns:
        (warm-up to use, warning text or None when ``warmup`` fits as it is).
    """
    if length < 1:
        raise ValueError(f"run length must be >= 1 {unit}, got {length}")
    if warmup < 0:
        raise ValueError(f"{option} must be >= 0, got {warmup}")
    if warmup < length:
        return warmup, None
    clamped = length - 1
    return clamped, (f"{option} {warmup} does not fit a run of {length} {unit}: the warm-up is "
                     f"clamped to {clamped} {unit}")
