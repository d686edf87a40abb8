"""Console logging, a JSON-lines metrics file and optional TensorBoard, all on rank 0 only."""
from __future__ import annotations

import json
import logging
import sys
import time
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


class MetricsWriter:
    """Appends one JSON object per line to ``<output>/metrics.jsonl``; mirrors scalars to
    TensorBoard (``<output>/tensorboard``) when the ``tensorboard`` package is installed."""

    def __init__(self, output: Path, enabled: bool, logger: logging.Logger) -> None:
        self.enabled = enabled
        self.path = Path(output) / "metrics.jsonl"
        self.tensorboard = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            logger.info("tensorboard is not installed; metrics go to %s only", self.path)
        else:
            self.tensorboard = SummaryWriter(log_dir=str(Path(output) / "tensorboard"))

    def write(self, record: dict[str, Any], step: int) -> None:
        """Append ``record`` (+ wall time); numeric fields also go to TensorBoard at ``step``."""
        if not self.enabled:
            return
        line = dict(record, time=time.time())
        with open(self.path, "a") as handle:
            handle.write(json.dumps(line) + "\n")
        if self.tensorboard is not None:
            kind = record.get("type", "metrics")
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.tensorboard.add_scalar(f"{kind}/{key}", value, step)
            self.tensorboard.flush()

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file, in order."""
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]
