"""Utilities shared by the training scripts (classification, segmentation, MIL)."""
from .checkpoint import atomic_torch_save, capture_rng_state, restore_rng_state

__all__ = ["atomic_torch_save", "capture_rng_state", "restore_rng_state"]
