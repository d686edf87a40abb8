"""The exception types the command-line tools turn into a one-line error message."""
from __future__ import annotations


class UsageError(ValueError):
    """Bad user input (paths, model names, checkpoints, options): reported, exit code 2."""


class BadImageError(UsageError):
    """An image file of the data set cannot be read (message names the file)."""


class DataTransformError(RuntimeError):
    """A data transform (augmentation, resizing, ...) raised on an image: reported, exit code 1.

    ``failures``: one line per failed sample of the batch, each naming the sample's index and
    file, the transform step and the error. ``split``: ``"train"`` or ``"val"``. ``epoch``:
    0-based epoch of the pass, when the loader knows it.
    """

    def __init__(self, failures: list[str], split: str, epoch: int | None = None) -> None:
        self.failures = list(failures)
        self.split = split
        self.epoch = epoch
        where = f"{split} pass" + ("" if epoch is None else f" of epoch {epoch + 1}")
        more = f" (+{len(self.failures) - 1} more in the batch)" if len(self.failures) > 1 else ""
        super().__init__(f"a data transform failed in the {where}: {self.failures[0]}{more}")
