"""Weights-only loading of mmengine checkpoints.

Moved to :mod:`vmamba2d.openmmlab.checkpoint_safety` (shared with :mod:`vmamba2d.det`); re-exported here so
that ``vmamba2d.seg.checkpoint_safety`` keeps working.
"""
from vmamba2d.openmmlab.checkpoint_safety import (
    allow_mmengine_checkpoint_globals,
    load_error_reason,
    load_from_local_file,
    mmengine_checkpoint_globals,
    use_weights_only_local_loader,
)

__all__ = ["allow_mmengine_checkpoint_globals", "load_error_reason", "load_from_local_file", "mmengine_checkpoint_globals",
           "use_weights_only_local_loader"]
