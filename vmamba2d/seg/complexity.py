"""Parameters / FLOPs and the scan's FLOP handle for mmengine's counter.

Moved to :mod:`vmamba2d.openmmlab.complexity` (shared with :mod:`vmamba2d.det`); re-exported here so
that ``vmamba2d.seg.complexity`` keeps working.
"""
from vmamba2d.openmmlab.complexity import (
    register_mmengine_flop_handles,
    segmentor_complexity,
    warn_if_scans_untraceable,
)

__all__ = ["register_mmengine_flop_handles", "segmentor_complexity", "warn_if_scans_untraceable"]
