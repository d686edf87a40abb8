"""Console / file logging and optional TensorBoard scalars, on rank 0 only."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Optional

LOGGER_NAME = "vmamba2d.classification"


def setup_logger(is_main: bool, log_file: Optional[Path] = None) -> logging.Logger:
    """Logger printing to stderr (and ``log_file``) on rank 0; warnings only on other ranks."""
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(logging.INFO if is_main else logging.WARNING)
    logger.propagate = False
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(formatter)
    logger.addHandler(console)
    if is_main and log_file is not None:
        file_handler = logging.FileHandler(log_file)
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
    return logger


class TensorBoardWriter:
    """Mirrors numeric metrics to TensorBoard (``<output>/tensorboard``) when the ``tensorboard``
    package is installed; rank 0 only. ``metrics.jsonl`` itself is written by the run folder's
    commit (``vmamba2d.runs.RunFolder``).

    ``purge_step``: when resuming, events at or after this step (written by an epoch that was
    killed before it was committed) are hidden by TensorBoard.
    """

    def __init__(self, output: Path, enabled: bool, logger: logging.Logger,
                 purge_step: Optional[int] = None) -> None:
        self.writer = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            logger.info("tensorboard is not installed; metrics go to %s only",
                        Path(output) / "metrics.jsonl")
        else:
            self.writer = SummaryWriter(log_dir=str(Path(output) / "tensorboard"),
                                        purge_step=purge_step)

    def write(self, record: dict[str, Any], step: int) -> None:
        """Numeric fields of ``record`` as scalars ``<type>/<key>`` at ``step``."""
        if self.writer is None:
            return
        kind = record.get("type", "metrics")
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"{kind}/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
