"""Config preparation shared by the segmentation entry points (seg/train.py, seg/test.py)."""
from __future__ import annotations

import argparse
import numbers
import os
import os.path as osp
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional

import torch
from mmengine.config import Config, DictAction
from mmengine.logging import print_log

from .errors import SegInputError, SegMissingFileError

_DATALOADERS = ("train_dataloader", "val_dataloader", "test_dataloader")


def add_runner_arguments(parser: argparse.ArgumentParser, cfg_options_example: str) -> None:
    """Add the options every seg entry point shares: --cfg-options, --launcher, --local-rank."""
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, default=None,
                        help=f"override config entries, e.g. {cfg_options_example}")
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm", "mpi"], default="none",
                        help="job launcher (pytorch = torchrun)")
    parser.add_argument("--local-rank", "--local_rank", type=int, default=0, help=argparse.SUPPRESS)


def parse_runner_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse ``argv``; export LOCAL_RANK for launchers (torch.distributed.launch) that pass it as a flag."""
    args = parser.parse_args(argv)
    os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    return args


def load_config(path: str, cfg_options: Optional[dict] = None, launcher: str = "none",
                work_dir: Optional[str] = None) -> Config:
    """Read an mmseg config, merge ``--cfg-options`` and set the launcher and work_dir.

    The work_dir is, in order: ``work_dir``, the config's ``work_dir``, ``./work_dirs/<config name>``.
    """
    if not osp.isfile(path):
        raise SegMissingFileError(f"config file not found: {path}")
    # yapf formatting of the config text (for logs and the dumped copy) is cosmetic and costs seconds
    cfg = Config.fromfile(path, format_python_code=False)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cfg.launcher = launcher
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get("work_dir") is None:
        cfg.work_dir = osp.join("./work_dirs", osp.splitext(osp.basename(path))[0])
    return cfg


def check_dataset_folders(cfg: Config, dataloaders: Iterable[str] = _DATALOADERS) -> None:
    """Raise SegMissingFileError (a FileNotFoundError) naming the folder and the expected layout when a
    dataset is missing.

    Checks ``data_root/data_prefix[img_path|seg_map_path]`` of every dataset of the given
    dataloaders (those present in ``cfg``) before any model is built.
    """
    for name in dataloaders:
        loader = cfg.get(name)
        if not loader:
            continue
        dataset = loader.get("dataset", {})
        data_root = dataset.get("data_root") or ""
        for kind, folder in (dataset.get("data_prefix") or {}).items():
            if kind not in ("img_path", "seg_map_path") or not folder:
                continue
            full = Path(data_root, folder)
            if not full.is_dir():
                raise SegMissingFileError(
                    f"{name}: dataset folder {full} does not exist (data_root={data_root!r}, "
                    f"data_prefix.{kind}={folder!r}). ADE20K is expected as "
                    "<data_root>/images/{training,validation}/*.jpg and "
                    "<data_root>/annotations/{training,validation}/*.png; set the root with "
                    "--cfg-options train_dataloader.dataset.data_root=... "
                    "val_dataloader.dataset.data_root=... test_dataloader.dataset.data_root=...")


def enable_amp(cfg: Config) -> None:
    """Switch the optimizer wrapper to mixed precision (dynamic loss scaling); needs CUDA."""
    if not torch.cuda.is_available():
        raise SegInputError("--amp needs a CUDA device (torch.cuda.is_available() is False)")
    wrapper = cfg.optim_wrapper.get("type", "OptimWrapper")
    if wrapper == "AmpOptimWrapper":
        return
    if wrapper != "OptimWrapper":
        raise SegInputError(f"--amp: optim_wrapper.type must be OptimWrapper or AmpOptimWrapper, got {wrapper!r}")
    cfg.optim_wrapper.type = "AmpOptimWrapper"
    cfg.optim_wrapper.loss_scale = "dynamic"


def use_multiscale_flip_test(cfg: Config) -> None:
    """Replace the test pipeline and model by the config's ``tta_pipeline`` / ``tta_model``."""
    for key in ("tta_pipeline", "tta_model"):
        if cfg.get(key) is None:
            raise SegInputError(f"--tta: the config defines no {key}")
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
    cfg.tta_model.module = cfg.model
    cfg.model = cfg.tta_model


def scalar_metrics(metrics: Mapping[str, object]) -> Dict[str, float]:
    """The real-valued entries of an evaluator's result as Python floats.

    mmseg's IoUMetric returns numpy scalars (``np.float32``, not a ``float`` subclass); per-class
    tables and other non-numbers are left out.
    """
    return {key: float(value) for key, value in metrics.items()
            if isinstance(value, numbers.Real) and not isinstance(value, bool)}


def metrics_summary(metrics: Mapping[str, object]) -> str:
    """``'aAcc=81.20, mIoU=40.05, mAcc=52.10'`` from an evaluator's result (2 decimals, as mmseg)."""
    scalars = scalar_metrics(metrics)
    if not scalars:
        raise ValueError(f"the evaluator returned no scalar metric (keys: {sorted(metrics)})")
    return ", ".join(f"{key}={value:.2f}" for key, value in scalars.items())


def backbone_checkpoint(cfg: Config) -> Optional[str]:
    """The ImageNet checkpoint the config's backbone initialises from (``init_cfg.checkpoint`` or
    ``pretrained``), or None."""
    backbone = cfg.model.get("backbone") or {}
    init_cfg = backbone.get("init_cfg") or {}
    return init_cfg.get("checkpoint") or backbone.get("pretrained") or cfg.model.get("pretrained")


def check_backbone_weights(cfg: Config, from_scratch: bool = False) -> None:
    """Fail before anything is built when the backbone's ImageNet checkpoint is missing.

    Args:
        cfg: the training config.
        from_scratch: drop the backbone's ImageNet initialisation instead (random init).

    Raises:
        SegMissingFileError (a FileNotFoundError) naming the file and the three ways out (put it there,
        point elsewhere, train from scratch).
    """
    if from_scratch:
        cfg.model.backbone.init_cfg = None
        cfg.model.backbone.pop("pretrained", None)
        cfg.model.pretrained = None
        print_log("--from-scratch: the backbone starts from random weights (no ImageNet initialisation); "
                  "expect a clearly lower mIoU than with ImageNet weights", logger="current", level=30)
        return
    checkpoint = backbone_checkpoint(cfg)
    if checkpoint is not None and not osp.isfile(osp.expanduser(checkpoint)):
        raise SegMissingFileError(
            f"backbone ImageNet-1K weights not found: {checkpoint} (model.backbone.init_cfg.checkpoint, relative "
            f"to {os.getcwd()}). Either put the checkpoint there (our vmamba2d / vmamba classification "
            "checkpoints or official VMamba v2 ones), point to it with --cfg-options "
            "model.backbone.init_cfg.checkpoint=PATH, or train the backbone from scratch with --from-scratch.")
