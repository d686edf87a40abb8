"""Config preparation shared by the segmentation entry points (seg/train.py, seg/test.py)."""
from __future__ import annotations

import argparse
import os
import os.path as osp
from pathlib import Path
from typing import Iterable, Optional

import torch
from mmengine.config import Config, DictAction

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
        raise FileNotFoundError(f"config file not found: {path}")
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
    """Raise FileNotFoundError naming the folder and the expected layout when a dataset is missing.

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
                raise FileNotFoundError(
                    f"{name}: dataset folder {full} does not exist (data_root={data_root!r}, "
                    f"data_prefix.{kind}={folder!r}). ADE20K is expected as "
                    "<data_root>/images/{training,validation}/*.jpg and "
                    "<data_root>/annotations/{training,validation}/*.png; set the root with "
                    "--cfg-options train_dataloader.dataset.data_root=... "
                    "val_dataloader.dataset.data_root=... test_dataloader.dataset.data_root=...")


def enable_amp(cfg: Config) -> None:
    """Switch the optimizer wrapper to mixed precision (dynamic loss scaling); needs CUDA."""
    if not torch.cuda.is_available():
        raise ValueError("--amp needs a CUDA device (torch.cuda.is_available() is False)")
    wrapper = cfg.optim_wrapper.get("type", "OptimWrapper")
    if wrapper == "AmpOptimWrapper":
        return
    if wrapper != "OptimWrapper":
        raise ValueError(f"--amp: optim_wrapper.type must be OptimWrapper or AmpOptimWrapper, got {wrapper!r}")
    cfg.optim_wrapper.type = "AmpOptimWrapper"
    cfg.optim_wrapper.loss_scale = "dynamic"


def set_resume(cfg: Config, resume: Optional[str]) -> None:
    """``resume='auto'``: continue from the work_dir's latest checkpoint (if any); a path: from it."""
    if resume is None:
        return
    if resume == "auto":
        cfg.resume = True
        cfg.load_from = None
        return
    if not osp.isfile(resume):
        raise FileNotFoundError(f"--resume: checkpoint not found: {resume}")
    cfg.resume = True
    cfg.load_from = resume


def use_multiscale_flip_test(cfg: Config) -> None:
    """Replace the test pipeline and model by the config's ``tta_pipeline`` / ``tta_model``."""
    for key in ("tta_pipeline", "tta_model"):
        if cfg.get(key) is None:
            raise ValueError(f"--tta: the config defines no {key}")
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
    cfg.tta_model.module = cfg.model
    cfg.model = cfg.tta_model
