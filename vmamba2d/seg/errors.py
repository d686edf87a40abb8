"""Errors the segmentation entry points (seg/train.py, seg/test.py) report in one line, exit code 2."""


class SegInputError(ValueError):
    """Bad user input: a path, a checkpoint or an option (the message names it and what was expected)."""


class SegMissingFileError(SegInputError, FileNotFoundError):
    """A file or folder the user named (config, checkpoint, dataset folder) does not exist."""


class RefusedCheckpointError(SegInputError):
    """A checkpoint holds pickled Python objects that weights-only loading does not allow."""
