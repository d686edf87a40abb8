"""Name the data file behind an error raised while a sample is loaded or transformed.

mmengine datasets run their pipeline with ``mmengine.dataset.Compose``; a transform that fails on a
bad file (an image that does not decode, a garbage annotation PNG) raises whatever its library
raises (mmcv's ``AssertionError``, a PIL traceback) without naming the file, after the run's log
folder and checkpoints are written. :func:`name_files_of_failing_samples` wraps ``Compose.__call__``
so that such an error becomes :class:`BadSampleError`, one line naming the sample's files, which the
entry points report with exit code 2 (checkpoints committed so far stay usable for ``--resume``).
"""
from __future__ import annotations

from typing import Optional

from mmengine.dataset import Compose

from .errors import InputError

_FILE_KEYS = ("img_path", "seg_map_path", "ann_path")
_MARK = "BadSampleError: "


class BadSampleError(InputError):
    """A sample's files could not be loaded or transformed (message: the files and the cause)."""

    def __str__(self) -> str:
        text = super().__str__()
        if "\n" not in text:
            return text
        # re-raised by a DataLoader worker: the message is the worker's traceback; keep its last line
        lines = [line for line in text.splitlines() if _MARK in line]
        return lines[-1].split(_MARK, 1)[1] if lines else text.strip().splitlines()[-1]


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def name_files_of_failing_samples() -> None:
    """Make ``Compose`` raise :class:`BadSampleError` naming the sample's files (idempotent)."""
    if getattr(Compose.__call__, "_vmamba2d_names_files", False):
        return
    original = Compose.__call__

    def call(self: Compose, data: dict) -> Optional[dict]:
        try:
            return original(self, data)
        except BadSampleError:
            raise
        except Exception as error:  # any library's decode / transform failure on this sample
            files = [str(data[key]) for key in _FILE_KEYS if isinstance(data, dict) and data.get(key)]
            raise BadSampleError(
                f"bad sample {' + '.join(files) or '(no file named)'}: {type(error).__name__}: "
                f"{_first_line(error)}. Fix or remove the file; checkpoints already committed are kept "
                "(continue with --resume)") from error

    setattr(call, "_vmamba2d_names_files", True)
    Compose.__call__ = call
