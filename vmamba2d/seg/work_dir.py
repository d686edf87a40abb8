"""Start / resume / repair of a run folder.

Moved to :mod:`vmamba2d.openmmlab.work_dir` (shared with :mod:`vmamba2d.det`); re-exported here so
that ``vmamba2d.seg.work_dir`` keeps working.
"""
from vmamba2d.openmmlab.work_dir import (
    UnreadableCheckpoint,
    prepare_work_dir,
    read_checkpoint_state,
    use_atomic_checkpoints,
)

__all__ = ["UnreadableCheckpoint", "prepare_work_dir", "read_checkpoint_state", "use_atomic_checkpoints"]
