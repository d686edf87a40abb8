"""Defaults that fit the machine a run starts on: the recipes' GPU settings (bf16 autocast, 8
data-loading processes) are kept on a GPU; on a CPU autocast is off unless asked for, and the
data-loading processes never outnumber the cores this process may use."""
from __future__ import annotations

import os
from typing import Iterable


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def device_type(device: str) -> str:
    """``"cuda"`` or ``"cpu"`` for a ``--device`` value (``"auto"``: CUDA when available)."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def fit_to_machine(device: str, amp: str, workers: int, explicit: Iterable[str],
                   processes_per_node: int = 1) -> tuple[str, int]:
    """``(amp, workers)`` for this machine; options named in ``explicit`` (given on the command
    line) are kept as they are.

    Args:
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        amp: the recipe's autocast dtype (``"bf16"``, ``"fp16"``, ``"none"``).
        workers: the recipe's data-loading processes per training process.
        explicit: names of the options the user gave (``"amp"``, ``"workers"``).
        processes_per_node: training processes sharing this machine's cores.
    """
    explicit = set(explicit)
    if "amp" not in explicit and device_type(device) == "cpu":
        amp = "none"
    if "workers" not in explicit:
        workers = min(workers, max(1, available_cores() // max(1, processes_per_node)))
    return amp, workers
