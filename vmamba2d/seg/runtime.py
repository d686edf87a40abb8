"""The ADE20K dataset check of the segmentation entry points (seg/train.py, seg/test.py); the shared
config helpers are in :mod:`vmamba2d.openmmlab.runtime`."""
from __future__ import annotations

from typing import Iterable

from mmengine.config import Config

from vmamba2d.openmmlab.runtime import check_dataset_paths

_DATALOADERS = ("train_dataloader", "val_dataloader", "test_dataloader")
ADE20K_LAYOUT = ("ADE20K is expected as <data_root>/images/{training,validation}/*.jpg and "
                 "<data_root>/annotations/{training,validation}/*.png; set the root with --cfg-options "
                 "train_dataloader.dataset.data_root=... val_dataloader.dataset.data_root=... "
                 "test_dataloader.dataset.data_root=...")


def check_dataset_folders(cfg: Config, dataloaders: Iterable[str] = _DATALOADERS) -> None:
    """Raise :class:`~vmamba2d.openmmlab.errors.MissingFileError` (a FileNotFoundError) naming the
    folder and the expected ADE20K layout when a dataset folder (``data_root/data_prefix[img_path|seg_map_path]``)
    of the given dataloaders is missing; see :func:`vmamba2d.openmmlab.runtime.check_dataset_paths`."""
    check_dataset_paths(cfg, dataloaders, ADE20K_LAYOUT)
