"""Config preparation shared by the OpenMMLab entry points (seg/ and det/ train.py, test.py)."""
from __future__ import annotations

import argparse
import inspect
import json
import math
import numbers
import os
import os.path as osp
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional

import torch
from mmengine.config import Config, DictAction
from mmengine.logging import print_log

from .errors import BadDataError, InputError, MissingFileError

_FOLDER_KINDS = ("img_path", "seg_map_path", "img", "seg")
FULL_JSON_CHECK_BYTES = 64 << 20
"""Annotation files up to this size are parsed before training; larger ones only have their ends checked."""


def add_runner_arguments(parser: argparse.ArgumentParser, cfg_options_example: str) -> None:
    """Add the options every seg / det entry point shares: --cfg-options, --launcher, --local-rank."""
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
    """Read an mmseg / mmdet config, merge ``--cfg-options`` and set the launcher and work_dir.

    The work_dir is, in order: ``work_dir``, the config's ``work_dir``, ``./work_dirs/<config name>``.
    """
    if not osp.isfile(path):
        raise MissingFileError(f"config file not found: {path}")
    # yapf formatting of the config text (for logs and the dumped copy) is cosmetic and costs seconds
    try:
        cfg = Config.fromfile(path, format_python_code=False)
    except SyntaxError as error:
        detail = " ".join(str(error).split())
        raise InputError(f"config file {path} is not valid Python: {detail}") from None
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cfg.launcher = launcher
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get("work_dir") is None:
        cfg.work_dir = osp.join("./work_dirs", osp.splitext(osp.basename(path))[0])
    return cfg


def check_dataset_paths(cfg: Config, dataloaders: Iterable[str], layout: str) -> None:
    """Fail before any model is built when a dataset folder or annotation file is missing.

    Checks, for every dataset of the given dataloaders (those present in ``cfg``; a
    ``ConcatDataset`` / ``RepeatDataset`` is checked through its inner datasets),
    ``data_root/data_prefix[...]`` folders (``img_path``, ``seg_map_path``, ``img``, ``seg``) and the
    ``data_root/ann_file`` annotation file when the config names one.

    Args:
        cfg: the config.
        dataloaders: names such as ``"train_dataloader"``.
        layout: the expected dataset layout and how to point elsewhere, appended to the message.

    Also refuses, naming the file, an empty (0-byte) file in those folders and an annotation ``.json``
    that is not JSON (:func:`check_json_file`): what can be checked before anything is written.

    Raises:
        MissingFileError (a FileNotFoundError) naming the dataloader, the path and ``layout``;
        BadDataError naming an empty or truncated file.
    """
    for name in dataloaders:
        loader = cfg.get(name)
        if not loader:
            continue
        for dataset in leaf_datasets(loader.get("dataset") or {}):
            data_root = dataset.get("data_root") or ""
            for kind, folder in (dataset.get("data_prefix") or {}).items():
                if kind not in _FOLDER_KINDS or not folder:
                    continue
                full = Path(data_root, folder)
                if not full.is_dir():
                    raise MissingFileError(f"{name}: dataset folder {full} does not exist (data_root={data_root!r}, "
                                           f"data_prefix.{kind}={folder!r}). {layout}")
                _check_no_empty_files(name, full)
            ann_file = dataset.get("ann_file")
            if ann_file and not Path(data_root, ann_file).is_file():
                raise MissingFileError(f"{name}: annotation file {Path(data_root, ann_file)} does not exist "
                                       f"(data_root={data_root!r}, ann_file={ann_file!r}). {layout}")
            if ann_file and str(ann_file).endswith(".json"):
                check_json_file(name, Path(data_root, ann_file))


def _check_no_empty_files(name: str, folder: Path) -> None:
    """BadDataError naming the first empty (0-byte) file of ``folder`` (sizes only: nothing is read)."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_file() and entry.stat().st_size == 0:
                raise BadDataError(f"{name}: {entry.path} is empty (0 bytes); restore or remove it")


def check_json_file(name: str, path: Path, parse_limit: int = FULL_JSON_CHECK_BYTES) -> None:
    """BadDataError naming ``path`` when it is not JSON: parsed in full up to ``parse_limit`` bytes; a
    larger file (COCO's train annotations: 450 MB) only has to start with ``{`` / ``[`` and end with the
    matching bracket, which catches a truncated copy."""
    size = path.stat().st_size
    if size <= parse_limit:
        try:
            json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError) as error:
            raise BadDataError(f"{name}: annotation file {path} ({size} bytes) is not valid JSON "
                               f"({error}); restore it (a truncated copy?)") from None
        return
    with open(path, "rb") as handle:
        head = handle.read(64).lstrip()[:1]
        handle.seek(max(size - 64, 0))
        tail = handle.read().rstrip()[-1:]
    if (head, tail) not in ((b"{", b"}"), (b"[", b"]")):
        raise BadDataError(f"{name}: annotation file {path} ({size} bytes) does not end its JSON "
                           f"{'object' if head == b'{' else 'text'}; it is truncated or not JSON: restore it")


def check_training_options(cfg: Config) -> None:
    """InputError in one line, before anything is built or written, for training options mmengine
    would fail on with a traceback (batch size 0, a NaN learning rate) or silently run without
    training (``max_iters=-1``), and for backbone arguments VMamba2DBackbone does not take."""
    batch_size = (cfg.get("train_dataloader") or {}).get("batch_size")
    if batch_size is not None and not _positive_int(batch_size):
        raise InputError(f"train_dataloader.batch_size must be a positive int, got {batch_size!r}")
    lr = ((cfg.get("optim_wrapper") or {}).get("optimizer") or {}).get("lr")
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, numbers.Real)
                           or not math.isfinite(lr) or lr < 0):
        raise InputError(f"optim_wrapper.optimizer.lr must be a finite number >= 0, got {lr!r}")
    train_cfg = cfg.get("train_cfg") or {}
    for key in ("max_iters", "max_epochs"):
        if key in train_cfg and not _positive_int(train_cfg[key]):
            raise InputError(f"train_cfg.{key} must be a positive int, got {train_cfg[key]!r}")
    backbone = (cfg.get("model") or {}).get("backbone") or {}
    if str(backbone.get("type", "")).split(".")[-1] == "VMamba2DBackbone":
        from .backbone import VMamba2DBackbone

        accepted = set(inspect.signature(VMamba2DBackbone).parameters)
        unknown = sorted(set(backbone) - accepted - {"type"})
        if unknown:
            raise InputError(f"model.backbone: VMamba2DBackbone takes no {', '.join(unknown)} (it takes "
                             f"{', '.join(sorted(accepted))}; timm model options go in model_kwargs)")


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def leaf_datasets(dataset: Mapping) -> List[Mapping]:
    """The dataset configs inside wrappers (``dataset=`` of RepeatDataset, ``datasets=`` of ConcatDataset)."""
    if isinstance(dataset.get("dataset"), Mapping):
        return leaf_datasets(dataset["dataset"])
    if isinstance(dataset.get("datasets"), (list, tuple)):
        return [leaf for inner in dataset["datasets"] for leaf in leaf_datasets(inner)]
    return [dataset]


def enable_amp(cfg: Config) -> None:
    """Switch the optimizer wrapper to mixed precision (dynamic loss scaling); needs CUDA."""
    if not torch.cuda.is_available():
        raise InputError("--amp needs a CUDA device (torch.cuda.is_available() is False)")
    wrapper = cfg.optim_wrapper.get("type", "OptimWrapper")
    if wrapper == "AmpOptimWrapper":
        return
    if wrapper != "OptimWrapper":
        raise InputError(f"--amp: optim_wrapper.type must be OptimWrapper or AmpOptimWrapper, got {wrapper!r}")
    cfg.optim_wrapper.type = "AmpOptimWrapper"
    cfg.optim_wrapper.loss_scale = "dynamic"


def use_multiscale_flip_test(cfg: Config) -> None:
    """Replace the test pipeline and model by the config's ``tta_pipeline`` / ``tta_model``."""
    for key in ("tta_pipeline", "tta_model"):
        if cfg.get(key) is None:
            raise InputError(f"--tta: the config defines no {key}")
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


def metrics_summary(metrics: Mapping[str, object], digits: int = 2) -> str:
    """``'aAcc=81.20, mIoU=40.05, mAcc=52.10'`` from an evaluator's result (``digits`` decimals: 2 as
    mmseg for its percentages, 3 as mmdet for its COCO APs in [0, 1])."""
    scalars = scalar_metrics(metrics)
    if not scalars:
        raise ValueError(f"the evaluator returned no scalar metric (keys: {sorted(metrics)})")
    return ", ".join(f"{key}={value:.{digits}f}" for key, value in scalars.items())


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
        MissingFileError (a FileNotFoundError) naming the file and the three ways out (put it there,
        point elsewhere, train from scratch).
    """
    if from_scratch:
        cfg.model.backbone.init_cfg = None
        cfg.model.backbone.pop("pretrained", None)
        if cfg.model.get("pretrained") is not None:  # mmseg's EncoderDecoder has one; mmdet's detectors do not
            cfg.model.pretrained = None
        print_log("--from-scratch: the backbone starts from random weights (no ImageNet initialisation); "
                  "expect clearly lower accuracy (mIoU, mAP) than with ImageNet weights", logger="current", level=30)
        return
    checkpoint = backbone_checkpoint(cfg)
    if checkpoint is not None and not osp.isfile(osp.expanduser(checkpoint)):
        raise MissingFileError(
            f"backbone ImageNet-1K weights not found: {checkpoint} (model.backbone.init_cfg.checkpoint, relative "
            f"to {os.getcwd()}). Either write it there from a downloaded VMamba v2 ImageNet checkpoint (or one of "
            f"ours) with `vmamba2d-weights {osp.basename(cfg.filename or 'CONFIG')} --from FILE`, point to one "
            "with --cfg-options model.backbone.init_cfg.checkpoint=PATH, or train the backbone from scratch with "
            "--from-scratch.")
