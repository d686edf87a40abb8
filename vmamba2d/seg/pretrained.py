"""Reading ImageNet / whole-model checkpoints into the backbone.

Moved to :mod:`vmamba2d.openmmlab.pretrained` (shared with :mod:`vmamba2d.det`); re-exported here so
that ``vmamba2d.seg.pretrained`` keeps working.
"""
from vmamba2d.openmmlab.pretrained import (
    classification_weights,
    key_groups,
    load_matching_weights,
    read_checkpoint,
    strip_prefix,
)

__all__ = ["classification_weights", "key_groups", "load_matching_weights", "read_checkpoint", "strip_prefix"]
