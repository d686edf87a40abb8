"""Errors the OpenMMLab entry points (seg/ and det/ train.py, test.py) report in one line, exit code 2."""


class InputError(ValueError):
    """Bad user input: a path, a checkpoint or an option (the message names it and what was expected)."""


class MissingFileError(InputError, FileNotFoundError):
    """A file or folder the user named (config, checkpoint, dataset folder) does not exist."""


class RefusedCheckpointError(InputError):
    """A checkpoint holds pickled Python objects that weights-only loading does not allow."""


class BadDataError(InputError):
    """A dataset file that cannot be used (empty, truncated, not what it should be); names the file."""
