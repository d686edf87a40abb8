"""Config checks of the detection entry points (det/train.py, det/test.py); the shared helpers are in
:mod:`vmamba2d.openmmlab.runtime`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

from mmengine.config import Config

from vmamba2d.openmmlab.errors import InputError, MissingFileError
from vmamba2d.openmmlab.runtime import check_dataset_paths, leaf_datasets

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
    check_coco_classes(cfg, dataloaders)


def coco_category_names(path: Path) -> List[str]:
    """The ``name`` of each entry of a COCO annotation file's ``categories`` list (read without
    decoding the images and annotations: the list closes COCO's files)."""
    text = Path(path).read_text(encoding="utf-8")
    at = text.rfind('"categories"')
    start = text.find(":", at) + 1 if at >= 0 else -1
    while 0 < start < len(text) and text[start].isspace():
        start += 1
    try:
        categories, _ = json.JSONDecoder().raw_decode(text, start) if at >= 0 else (None, 0)
    except ValueError:
        categories = None
    if not isinstance(categories, list):
        raise InputError(f"{path}: no 'categories' list; not a COCO instances annotation file")
    return [str(c.get("name")) for c in categories if isinstance(c, dict)]


def _config_classes(dataset: dict) -> Optional[Sequence[str]]:
    """The class names a COCO dataset config trains / tests on: its ``metainfo.classes``, else
    mmdet's 80 COCO classes; None for another dataset type."""
    classes = (dataset.get("metainfo") or {}).get("classes")
    if classes is not None:
        return list(classes)
    if dataset.get("type") != "CocoDataset":
        return None
    from mmdet.datasets import CocoDataset

    return list(CocoDataset.METAINFO["classes"])


def check_coco_classes(cfg: Config, dataloaders: Iterable[str]) -> None:
    """Fail in one line when a COCO annotation file lacks classes the config has (mmdet would map
    its categories onto the first labels and stop later with an IndexError in the COCO metric).

    Raises:
        InputError naming the file, both counts, the missing names and how to set the classes.
    """
    for loader in dataloaders:
        if not cfg.get(loader):
            continue
        for dataset in leaf_datasets(cfg[loader].get("dataset") or {}):
            classes, ann_file = _config_classes(dataset), dataset.get("ann_file")
            if classes is None or not ann_file:
                continue
            path = Path(dataset.get("data_root") or "", ann_file)
            names = set(coco_category_names(path))
            missing = [name for name in classes if name not in names]
            if missing:
                shown = ", ".join(missing[:5]) + (f", ... ({len(missing) - 5} more)" if len(missing) > 5 else "")
                raise InputError(
                    f"{loader}: {path} has {len(classes) - len(missing)} of the config's {len(classes)} classes "
                    f"(its {len(names)} categories lack {shown}); list every class in the file, or train on its "
                    "classes: --cfg-options with the dataloaders' dataset.metainfo.classes=(...) and "
                    "model.roi_head.{bbox_head,mask_head}.num_classes=N")
