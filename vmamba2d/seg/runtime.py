"""Config preparation of the segmentation entry points (seg/train.py, seg/test.py): the shared
helpers of :mod:`vmamba2d.openmmlab.runtime` and the ADE20K dataset check."""
from __future__ import annotations

from typing import Iterable

from mmengine.config import Config

from vmamba2d.openmmlab.runtime import (
    add_runner_arguments,
    backbone_checkpoint,
    check_backbone_weights,
    check_dataset_paths,
    enable_amp,
    load_config,
    metrics_summary,
    parse_runner_args,
    scalar_metrics,
    use_multiscale_flip_test,
)

__all__ = ["add_runner_arguments", "backbone_checkpoint", "check_backbone_weights", "check_dataset_folders",
           "enable_amp", "load_config", "metrics_summary", "parse_runner_args", "scalar_metrics",
           "use_multiscale_flip_test"]

_DATALOADERS = ("train_dataloader", "val_dataloader", "test_dataloader")
ADE20K_LAYOUT = ("ADE20K is expected as <data_root>/images/{training,validation}/*.jpg and "
                 "<data_root>/annotations/{training,validation}/*.png; set the root with --cfg-options "
                 "train_dataloader.dataset.data_root=... val_dataloader.dataset.data_root=... "
                 "test_dataloader.dataset.data_root=...")


def check_dataset_folders(cfg: Config, dataloaders: Iterable[str] = _DATALOADERS) -> None:
    """Raise SegMissingFileError (a FileNotFoundError) naming the folder and the expected ADE20K layout
    when a dataset folder (``data_root/data_prefix[img_path|seg_map_path]``) of the given dataloaders is
    missing; see :func:`vmamba2d.openmmlab.runtime.check_dataset_paths`."""
    check_dataset_paths(cfg, dataloaders, ADE20K_LAYOUT)
