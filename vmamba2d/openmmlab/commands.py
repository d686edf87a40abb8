"""The command-line flows of the OpenMMLab entry points (seg/ and det/ train.py, test.py,
get_flops.py), written once and parameterised by what the toolkits differ in: help texts, the
dataset check, the metrics' decimals, multi-scale + flip testing, the registry scope and the
complexity count.

A toolkit package declares one command per entry point (:mod:`vmamba2d.seg.commands`,
:mod:`vmamba2d.det.commands`); the scripts only bind its methods. ``main`` of train and test
reports bad input (:class:`~vmamba2d.openmmlab.errors.InputError`, and for training
:class:`~vmamba2d.runs.RunFolderError`) in one line on stderr and returns exit code 2.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import os.path as osp
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, NamedTuple, Optional, Sequence, Tuple, Type

import torch
import torch.nn as nn
from mmengine.config import Config, DictAction
from mmengine.dist import get_rank
from mmengine.logging import print_log
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from vmamba2d.runs import RunFolderError, RunFolderLock
from vmamba2d.runs.checkpoint import storage_error_message

from .checkpoint_match import MIN_LOAD_FROM_SHARE, MIN_TEST_SHARE, check_checkpoint_covers
from .errors import InputError, MissingFileError
from .progress import quiet_evaluation
from .sample_errors import name_files_of_failing_samples
from .runtime import (
    add_runner_arguments,
    check_backbone_weights,
    check_training_options,
    enable_amp,
    load_config,
    metrics_summary,
    parse_runner_args,
    use_multiscale_flip_test,
)
from .work_dir import prepare_work_dir

Argv = Optional[Sequence[str]]
DatasetCheck = Callable[[Config, Iterable[str]], None]
"""``check(cfg, dataloader_names)``: raises MissingFileError before anything is built when a
dataset path of those dataloaders is missing."""


def _build_runner(cfg: Config) -> Runner:
    """mmengine's Runner, or the config's own ``runner_type``."""
    return Runner.from_cfg(cfg) if "runner_type" not in cfg else RUNNERS.build(cfg)


def _exit_code(program: str, run: Callable[[], object], reported: Tuple[Type[BaseException], ...]) -> int:
    """Call ``run()``: 0 when it returns, 2 after ``'<program>: error: <message>'`` on stderr when it
    raises one of ``reported`` (anything else propagates)."""
    try:
        run()
    except reported as error:
        print(f"{program}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # disk full / read-only: one line when the storage is the cause
        message = storage_error_message(error, osp.dirname(error.filename or "") or "the work dir")
        if message is None:
            raise
        print(f"{program}: error: {message} (--resume)", file=sys.stderr)
        return 2
    return 0


@dataclass(frozen=True)
class TrainCommand:
    """``train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp] [--from-scratch] [--auto-scale-lr]``.

    Args:
        description: the parser's description (``"Train a segmentor (mmseg config)."``).
        config_example: a config path shown in the help of ``config``.
        check_dataset: the toolkit's dataset check, run on the train and val dataloaders.
    """

    description: str
    config_example: str
    check_dataset: DatasetCheck

    def parse_args(self, argv: Argv = None) -> argparse.Namespace:
        """Parse the command line (``sys.argv[1:]`` when ``argv`` is None)."""
        parser = argparse.ArgumentParser(description=self.description,
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("config", help=f"config file, or the name of a config this package ships (--list prints them), e.g. {self.config_example}")
        parser.add_argument("--work-dir", help="folder for logs and checkpoints (default ./work_dirs/<config name>)")
        parser.add_argument("--resume", nargs="?", const="auto", default=None, metavar="CKPT",
                            help="resume: without a value from the work dir's last complete checkpoint "
                                 "(last_checkpoint), or from CKPT; a truncated / unreadable checkpoint is "
                                 "reported, never loaded")
        parser.add_argument("--amp", action="store_true", help="mixed-precision training (CUDA)")
        parser.add_argument("--from-scratch", action="store_true",
                            help="train the backbone from random weights; without it the config's ImageNet "
                                 "checkpoint (pretrained/<model>_in1k.pth) must exist")
        parser.add_argument("--auto-scale-lr", action="store_true",
                            help="scale the learning rate by total batch / auto_scale_lr.base_batch_size")
        add_runner_arguments(parser, "train_dataloader.batch_size=2")
        return parse_runner_args(parser, argv)

    def train(self, argv: Argv = None) -> None:
        """Check the inputs, prepare the work dir, build mmengine's Runner and train; raises on bad input."""
        args = self.parse_args(argv)
        name_files_of_failing_samples()  # a bad image / annotation met in training: one line naming it
        cfg = load_config(args.config, args.cfg_options, args.launcher, args.work_dir)
        check_training_options(cfg)
        check_backbone_weights(cfg, from_scratch=args.from_scratch)
        self.check_dataset(cfg, ("train_dataloader", "val_dataloader"))
        if args.amp:
            enable_amp(cfg)
        if args.auto_scale_lr:
            if cfg.get("auto_scale_lr") is None:
                raise InputError("--auto-scale-lr: the config defines no auto_scale_lr=dict(base_batch_size=...)")
            cfg.auto_scale_lr.enable = True
        load_from = cfg.get("load_from")
        if load_from and ("://" in str(load_from) or not os.path.isfile(os.path.expanduser(str(load_from)))):
            raise MissingFileError(f"load_from: checkpoint not found (only local files are loaded): {load_from}")
        # one run per work dir: rank 0 holds its lock until training ends (the kernel drops it on a kill)
        lock = RunFolderLock(cfg.work_dir, "--work-dir") if int(os.environ.get("RANK", "0")) == 0 else None
        with lock or contextlib.nullcontext():
            for note in prepare_work_dir(cfg, args.resume):  # atomic checkpoints; resume checks and repair
                print_log(note, logger="current", level=logging.WARNING)
            runner = _build_runner(cfg)
            if not cfg.resume and cfg.load_from:  # a new run starting from load_from's weights
                check_checkpoint_covers(runner.model, cfg.load_from, MIN_LOAD_FROM_SHARE, "load_from")
            runner.train()

    def main(self, argv: Argv = None) -> int:
        """CLI entry point; returns the exit code (2 for bad input, reported in one line on stderr)."""
        return _exit_code("train.py", lambda: self.train(argv), (InputError, RunFolderError))


@dataclass(frozen=True)
class EvaluateCommand:
    """``test.py CONFIG CHECKPOINT [--work-dir DIR] [--tta]``: the test loop on a checkpoint, loaded
    weights-only (:mod:`vmamba2d.openmmlab.checkpoint_safety`).

    Args:
        description: the parser's description.
        checkpoint_help: the help of ``checkpoint`` (where such checkpoints come from).
        cfg_options_example: ``--cfg-options`` shown in its help (how to point to the data).
        check_dataset: the toolkit's dataset check, run on the test dataloader.
        metric_digits: decimals of the printed metrics (:func:`~vmamba2d.openmmlab.runtime.metrics_summary`).
        offers_tta: add ``--tta`` (the config's ``tta_pipeline`` / ``tta_model``: multi-scale + flip) and
            name the mode in the printed line.
    """

    description: str
    checkpoint_help: str
    cfg_options_example: str
    check_dataset: DatasetCheck
    metric_digits: int
    offers_tta: bool

    def parse_args(self, argv: Argv = None) -> argparse.Namespace:
        """Parse the command line (``sys.argv[1:]`` when ``argv`` is None)."""
        parser = argparse.ArgumentParser(description=self.description,
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("config", help="config file, or the name of a config this package ships (--list prints them)")
        parser.add_argument("checkpoint", help=self.checkpoint_help)
        parser.add_argument("--work-dir", help="folder for the evaluation log")
        parser.add_argument("--verbose", action="store_true",
                            help="print mmengine's whole log (environment, config, every logged iteration) "
                                 "instead of a progress bar and the metrics")
        if self.offers_tta:
            parser.add_argument("--tta", action="store_true", help="multi-scale (0.5-1.75) + flip test")
        add_runner_arguments(parser, self.cfg_options_example)
        return parse_runner_args(parser, argv)

    def evaluate(self, argv: Argv = None) -> Dict[str, object]:
        """Run the test loop; print (rank 0) and return the evaluator's metrics; raises on bad input."""
        args = self.parse_args(argv)
        name_files_of_failing_samples()
        if not os.path.isfile(args.checkpoint):
            raise MissingFileError(f"checkpoint not found: {args.checkpoint}")
        tta = self.offers_tta and args.tta
        work_dir = args.work_dir
        if work_dir is None:
            config_name = os.path.splitext(os.path.basename(args.config))[0]
            work_dir = os.path.join("./work_dirs", config_name, "test_tta" if tta else "test")
        cfg = load_config(args.config, args.cfg_options, args.launcher, work_dir)
        self.check_dataset(cfg, ("test_dataloader",))
        cfg.load_from = args.checkpoint
        if not args.verbose:
            quiet_evaluation(cfg)
        if tta:
            use_multiscale_flip_test(cfg)
        runner = _build_runner(cfg)
        check_checkpoint_covers(runner.model, args.checkpoint, MIN_TEST_SHARE, "checkpoint")
        metrics = runner.test()
        if get_rank() == 0:
            name = os.path.basename(args.config)
            if self.offers_tta:
                name += " (multi-scale + flip)" if tta else " (single-scale)"
            print(f"{name}: {metrics_summary(metrics, digits=self.metric_digits)}")
        return metrics

    def main(self, argv: Argv = None) -> int:
        """CLI entry point; returns the exit code (2 for bad input, reported in one line on stderr)."""
        return _exit_code("test.py", lambda: self.evaluate(argv), (InputError,))


class Column(NamedTuple):
    """One column of the get_flops table: ``result[key] / scale`` with ``digits`` decimals."""

    header: str
    key: str
    scale: float
    digits: int

    def cell(self, result: Dict[str, object]) -> str:
        """The formatted value of this column in a complexity ``result``."""
        return f"{result[self.key] / self.scale:.{self.digits}f}"


@dataclass(frozen=True)
class FlopsCommand:
    """``get_flops.py CONFIG [--shape H [W]]``: build the config's model, count it on one
    (1, 3, H, W) image and print a Markdown table row.

    Args:
        description: the parser's description.
        default_shape: (height, width) without ``--shape``.
        scope: the toolkit whose ``registry.MODELS`` builds the model, after its
            ``utils.register_all_modules()`` (``"mmseg"``, ``"mmdet"``).
        count: ``count(model, (height, width))`` -> dict of the counts (e.g.
            :func:`vmamba2d.openmmlab.complexity.segmentor_complexity`).
        columns: the table's columns after ``config`` and ``input``.
    """

    description: str
    default_shape: Tuple[int, int]
    scope: str
    count: Callable[[nn.Module, Tuple[int, int]], Dict[str, object]]
    columns: Sequence[Column]

    def parse_args(self, argv: Argv = None) -> argparse.Namespace:
        """Parse the command line (``sys.argv[1:]`` when ``argv`` is None); ``--shape`` takes one or
        two positive ints."""
        parser = argparse.ArgumentParser(description=self.description,
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("config", help="config file, or the name of a config this package ships (--list prints them)")
        parser.add_argument("--shape", type=int, nargs="+", default=list(self.default_shape),
                            help="input height and width (one value: square)")
        parser.add_argument("--cfg-options", nargs="+", action=DictAction, default=None,
                            help="override config entries")
        parser.add_argument("--seed", type=int, default=0,
                            help="seed of the randomly initialised model (a detector's RoI-head "
                                 "FLOPs depend on how many proposals its RPN keeps)")
        args = parser.parse_args(argv)
        if len(args.shape) not in (1, 2) or min(args.shape) < 1:
            parser.error(f"--shape takes one or two positive ints, got {args.shape}")
        return args

    def build_model(self, cfg: Config) -> nn.Module:
        """``cfg.model`` built by the toolkit's registry (imported on use: ``mmdet.utils`` pulls in
        matplotlib, which train.py and test.py do not need before their Runner is built)."""
        importlib.import_module(f"{self.scope}.utils").register_all_modules()
        return importlib.import_module(f"{self.scope}.registry").MODELS.build(cfg.model)

    def main(self, argv: Argv = None) -> Dict[str, object]:
        """Print and return ``count(model, (height, width))`` for the config."""
        args = self.parse_args(argv)
        shape = (args.shape[0], args.shape[-1])
        torch.manual_seed(args.seed)
        model = self.build_model(load_config(args.config, args.cfg_options))
        start = time.perf_counter()
        result = self.count(model, shape)
        elapsed = time.perf_counter() - start
        headers = ["config", "input", *(column.header for column in self.columns)]
        cells = [os.path.basename(args.config), f"1x3x{shape[0]}x{shape[1]}",
                 *(column.cell(result) for column in self.columns)]
        print(f"| {' | '.join(headers)} |")
        print("|" + "---|" * len(headers))
        print(f"| {' | '.join(cells)} |")
        print(f"(traced in {elapsed:.1f} s)")
        return result
