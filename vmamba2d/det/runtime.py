"""Config checks of the detection entry points (det/train.py, det/test.py); the shared helpers are in
:mod:`vmamba2d.openmmlab.runtime`."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from mmengine.config import Config

from vmamba2d.openmmlab.errors import MissingFileError
from vmamba2d.openmmlab.runtime import check_dataset_paths

COCO_LAYOUT = ("COCO 2017 is expected as <data_root>/train2017/*.jpg, <data_root>/val2017/*.jpg and "
               "<data_root>/annotations/instances_{train,val}2017.json (data_root data/coco/ as in "
               "mmdetection's configs); point elsewhere with --cfg-options "
               "train_dataloader.dataset.data_root=... val_dataloader.dataset.data_root=... "
               "test_dataloader.dataset.data_root=... val_evaluator.ann_file=... test_evaluator.ann_file=...")
_EVALUATORS = {"val_dataloader": "val_evaluator", "test_dataloader": "test_evaluator"}


def check_coco_paths(cfg: Config, dataloaders: Iterable[str]) -> None:
    """Fail before any model is built when a dataset folder, an annotation file or a CocoMetric
    ``ann_file`` of the given dataloaders is missing.

    Raises:
        MissingFileError (a FileNotFoundError) naming the path and the expected COCO layout.
    """
    dataloaders = list(dataloaders)
    check_dataset_paths(cfg, dataloaders, COCO_LAYOUT)
    for loader in dataloaders:
        name = _EVALUATORS.get(loader)
        evaluators = cfg.get(name) if name and cfg.get(loader) else None
        for evaluator in evaluators if isinstance(evaluators, (list, tuple)) else [evaluators]:
            ann_file = (evaluator or {}).get("ann_file")
            if ann_file and not Path(ann_file).is_file():
                raise MissingFileError(f"{name}: annotation file {ann_file} does not exist. {COCO_LAYOUT}")
