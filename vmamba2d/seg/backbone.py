"""The VMamba-family backbone class.

Moved to :mod:`vmamba2d.openmmlab.backbone` (shared with :mod:`vmamba2d.det`); re-exported here so
that ``vmamba2d.seg.backbone`` keeps working.
"""
from vmamba2d.openmmlab.backbone import VMamba2DBackbone

__all__ = ["VMamba2DBackbone"]
