"""Errors the segmentation entry points (seg/train.py, seg/test.py) report in one line, exit code 2.

The classes live in :mod:`vmamba2d.openmmlab.errors` (shared with :mod:`vmamba2d.det`); the names
below are the ones this package has always exported.
"""
from vmamba2d.openmmlab.errors import InputError, MissingFileError, RefusedCheckpointError

SegInputError = InputError
SegMissingFileError = MissingFileError

__all__ = ["RefusedCheckpointError", "SegInputError", "SegMissingFileError"]
