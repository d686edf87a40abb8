"""Crash-safe checkpoints (``AtomicCheckpointHook``).

Moved to :mod:`vmamba2d.openmmlab.safe_checkpoints` (shared with :mod:`vmamba2d.det`); re-exported here so
that ``vmamba2d.seg.safe_checkpoints`` keeps working.
"""
from vmamba2d.openmmlab.safe_checkpoints import (
    ATOMIC_BACKEND,
    LAST_CHECKPOINT_NAME,
    RNG_STATE_KEY,
    AtomicCheckpointHook,
    AtomicLocalBackend,
    register_atomic_backend,
    write_last_checkpoint,
)

__all__ = ["ATOMIC_BACKEND", "LAST_CHECKPOINT_NAME", "RNG_STATE_KEY", "AtomicCheckpointHook", "AtomicLocalBackend",
           "register_atomic_backend", "write_last_checkpoint"]
