"""Training options: built-in recipe defaults < YAML recipe (``--config``) < command-line flags.

The built-in defaults are the ImageNet-1K recipe of docs/training.md (Swin recipe + EMA); the YAML files
under ``vmamba2d/configs/classification/`` restate it per model with that model's drop-path rate.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from vmamba2d.machine import fit_to_machine
from vmamba2d.runs.options import config_file_values, parse_key_values

from .auto_augment import check_auto_augment
from .errors import UsageError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "classification"
AMP_CHOICES = ("bf16", "fp16", "none")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
INTERPOLATION_CHOICES = ("bilinear", "bicubic", "nearest", "random")
# Options with a fixed set of values (checked for YAML recipes too, not only by argparse).
CHOICES = {"amp": AMP_CHOICES, "device": DEVICE_CHOICES, "interpolation": INTERPOLATION_CHOICES,
           "mixup_mode": ("batch", "pair", "elem"), "remode": ("const", "rand", "pixel")}


@dataclass
class TrainConfig:
    """Every option of a training run; field names match the YAML keys and the CLI flags."""

    model: Optional[str] = None
    model_kwargs: dict = field(default_factory=dict)  # extra timm.create_model arguments
    data_dir: Optional[str] = None
    output: Optional[str] = None
    resume: Optional[str] = None
    device: str = "auto"
    amp: str = "bf16"
    seed: int = 0
    workers: int = 8
    pin_memory: bool = True
    progress: bool = True
    log_interval: int = 50
    skip_bad_images: bool = False  # unreadable images: skip and count (default: stop the run)
    # schedule and batch
    epochs: int = 300
    batch_size: int = 128  # per process
    accum_steps: int = 1
    img_size: int = 224
    # optimizer: lr, warmup_lr and min_lr are per `lr_base_batch` images and scaled linearly by
    # the total batch (batch_size x world size x accum_steps) / lr_base_batch (0: no scaling).
    opt: str = "adamw"
    lr: float = 5e-4
    warmup_lr: float = 5e-7
    min_lr: float = 5e-6
    lr_base_batch: int = 512
    weight_decay: float = 0.05
    opt_eps: float = 1e-8
    opt_betas: list = field(default_factory=lambda: [0.9, 0.999])
    sched: str = "cosine"
    warmup_epochs: int = 20
    clip_grad: Optional[float] = 5.0
    # regularisation and augmentation
    drop_path: float = 0.1
    smoothing: float = 0.1
    mixup: float = 0.8
    cutmix: float = 1.0
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    mixup_mode: str = "batch"
    aa: Optional[str] = "rand-m9-mstd0.5-inc1"
    color_jitter: float = 0.4
    reprob: float = 0.25
    remode: str = "pixel"
    recount: int = 1
    interpolation: str = "bicubic"
    crop_pct: Optional[float] = 0.875  # eval: resize img_size / crop_pct, then centre crop
    # EMA of the weights
    model_ema: bool = True
    model_ema_decay: float = 0.9999

    def total_batch(self, world_size: int) -> int:
        """Images per optimizer update across all processes."""
        return self.batch_size * world_size * self.accum_steps

    def lr_scale(self, world_size: int) -> float:
        """Factor applied to lr, warmup_lr and min_lr (1.0 when lr_base_batch is 0)."""
        if self.lr_base_batch == 0:
            return 1.0
        return self.total_batch(world_size) / self.lr_base_batch

    def to_dict(self) -> dict[str, Any]:
        """Plain, YAML/JSON-serialisable copy."""
        return dataclasses.asdict(self)


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(TrainConfig))
FIELD_TYPES = typing.get_type_hints(TrainConfig)


def _optional_float(text: str) -> Optional[float]:
    return None if text.lower() in ("none", "null") else float(text)


def _optional_str(text: str) -> Optional[str]:
    return None if text.lower() in ("none", "null", "") else text


def parse_model_kwargs(items: Sequence[str]) -> dict[str, Any]:
    """``["dims=16", "depths=[1,1,1,1]"]`` → ``{"dims": 16, "depths": [1, 1, 1, 1]}`` (YAML values)."""
    return parse_key_values(items, "--model-kwargs", UsageError)


def build_train_parser() -> argparse.ArgumentParser:
    """CLI of classification/train.py; options not given are absent from the namespace."""
    p = argparse.ArgumentParser(
        description="Train an image classifier (any timm model; vmamba2d models registered) on an "
                    "ImageNet-layout folder: <data-dir>/train/<class>/*, <data-dir>/val/<class>/*.",
        epilog="examples:\n"
               "  vmamba2d-train --config vmamba2d_tiny --data-dir data/tiny/imagenet --output runs/tiny "
               "--epochs 2 --img-size 64\n"
               "  torchrun --nproc_per_node 8 -m vmamba2d.classification.train --config vmamba2d_tiny "
               "--data-dir /data/imagenet --output runs/vmamba2d_tiny\n"
               "  vmamba2d-train ... --resume auto      # continue a killed run\n"
               "configs shipped: vmamba2d_{tiny,small,base}, vmamba_{tiny,small,base}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS)
    p.add_argument("--config", help="recipe YAML, or a name under vmamba2d/configs/classification/")
    p.add_argument("--model", help="timm model name, e.g. vmamba2d_tiny")
    p.add_argument("--model-kwargs", nargs="+", metavar="KEY=VALUE",
                   help="extra model arguments, e.g. depths=[1,1,1,1] (YAML values)")
    p.add_argument("--data-dir", help="folder holding train/ and val/ class folders")
    p.add_argument("--output", help="run folder: checkpoints, metrics.jsonl, config.yaml, logs")
    p.add_argument("--resume", help="checkpoint path, or 'auto' for <output>/last.pth if present")
    p.add_argument("--device", choices=DEVICE_CHOICES)
    p.add_argument("--amp", choices=AMP_CHOICES, help="autocast dtype (fp16 also uses a GradScaler; "
                   "default: the recipe's on a GPU, none on a CPU)")
    p.add_argument("--seed", type=int)
    p.add_argument("--workers", type=int, help="data-loading processes per training process "
                   "(default: the recipe's, at most the available cores)")
    p.add_argument("--pin-memory", action=argparse.BooleanOptionalAction)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, help="tqdm bar on rank 0")
    p.add_argument("--log-interval", type=int, help="progress-bar refresh interval in steps")
    p.add_argument("--skip-bad-images", action=argparse.BooleanOptionalAction,
                   help="skip unreadable images (logged, counted per epoch in metrics.jsonl); "
                        "default: stop the run, naming the file")
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int, help="images per process per micro-step")
    p.add_argument("--accum-steps", type=int, help="micro-steps per optimizer update")
    p.add_argument("--img-size", type=int)
    p.add_argument("--opt", help="timm optimizer name (recipe: adamw)")
    p.add_argument("--lr", type=float, help="learning rate per --lr-base-batch images")
    p.add_argument("--warmup-lr", type=float)
    p.add_argument("--min-lr", type=float)
    p.add_argument("--lr-base-batch", type=int, help="batch the lrs are given for (0: no scaling)")
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--opt-eps", type=float)
    p.add_argument("--opt-betas", type=float, nargs=2)
    p.add_argument("--sched", help="timm scheduler name (recipe: cosine)")
    p.add_argument("--warmup-epochs", type=int)
    p.add_argument("--clip-grad", type=_optional_float, help="max grad norm, or 'none'")
    p.add_argument("--drop-path", type=float)
    p.add_argument("--smoothing", type=float, help="label smoothing")
    p.add_argument("--mixup", type=float, help="mixup alpha (0: off)")
    p.add_argument("--cutmix", type=float, help="cutmix alpha (0: off)")
    p.add_argument("--mixup-prob", type=float)
    p.add_argument("--mixup-switch-prob", type=float)
    p.add_argument("--mixup-mode", choices=CHOICES["mixup_mode"])
    p.add_argument("--aa", type=_optional_str, help="timm auto-augment string, or 'none'")
    p.add_argument("--color-jitter", type=float)
    p.add_argument("--reprob", type=float, help="random-erasing probability")
    p.add_argument("--remode", choices=CHOICES["remode"])
    p.add_argument("--recount", type=int)
    p.add_argument("--interpolation", choices=INTERPOLATION_CHOICES)
    p.add_argument("--crop-pct", type=_optional_float, help="eval crop fraction ('none': model's)")
    p.add_argument("--model-ema", action=argparse.BooleanOptionalAction)
    p.add_argument("--model-ema-decay", type=float)
    return p


def _type_matches(value: Any, expected: Any) -> bool:
    if typing.get_origin(expected) is typing.Union:  # Optional[X]
        return any(_type_matches(value, option) for option in typing.get_args(expected))
    if expected is type(None):
        return value is None
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def _type_name(expected: Any) -> str:
    if typing.get_origin(expected) is typing.Union:
        return " or ".join(_type_name(option) for option in typing.get_args(expected))
    return {type(None): "none", float: "a number", int: "an int", bool: "true/false",
            str: "text", list: "a list", dict: "a mapping"}.get(expected, str(expected))


def check_option_types(cfg: TrainConfig) -> None:
    """UsageError naming the first option whose value has the wrong type (e.g. from YAML)."""
    for name in FIELD_NAMES:
        value, expected = getattr(cfg, name), FIELD_TYPES[name]
        if not _type_matches(value, expected):
            hint = ""
            if isinstance(value, str) and expected in (float, Optional[float]):
                hint = " (YAML reads 5e-4 as text: write 5.0e-4)"
            raise UsageError(f"option '{name}' (--{name.replace('_', '-')}) must be "
                             f"{_type_name(expected)}, got {value!r} ({type(value).__name__})"
                             f"{hint}")


def validate_config(cfg: TrainConfig) -> None:
    """Reject option values that cannot work, naming the option (types, ranges, choices).

    A warm-up longer than the run is not an error: train.py clamps it with a warning.
    """
    check_option_types(cfg)
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise UsageError(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}, "
                             f"got {getattr(cfg, name)!r}")
    for name in ("model", "data_dir", "output"):
        if not getattr(cfg, name):
            raise UsageError(f"--{name.replace('_', '-')} is required (flag or recipe key '{name}')")
    positive = ("epochs", "batch_size", "accum_steps", "img_size", "log_interval")
    for name in positive:
        if int(getattr(cfg, name)) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if cfg.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {cfg.workers}")
    if cfg.recount < 1:
        raise UsageError(f"--recount must be >= 1, got {cfg.recount}")
    if cfg.lr_base_batch < 0:
        raise UsageError(f"--lr-base-batch must be >= 0, got {cfg.lr_base_batch}")
    if cfg.warmup_epochs < 0:
        raise UsageError(f"--warmup-epochs must be >= 0, got {cfg.warmup_epochs}")
    if cfg.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {cfg.seed}")
    for name in ("lr", "warmup_lr", "min_lr", "weight_decay", "drop_path", "smoothing", "mixup",
                 "cutmix", "reprob", "color_jitter"):
        if not math.isfinite(float(getattr(cfg, name))):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number, got "
                             f"{getattr(cfg, name)}")
        if float(getattr(cfg, name)) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    for name in ("drop_path", "smoothing", "reprob", "mixup_prob", "mixup_switch_prob"):
        if float(getattr(cfg, name)) > 1:
            raise UsageError(f"--{name.replace('_', '-')} must be <= 1, got {getattr(cfg, name)}")
    if not 0 <= cfg.model_ema_decay < 1:
        raise UsageError(f"--model-ema-decay must be in [0, 1), got {cfg.model_ema_decay}")
    if cfg.crop_pct is not None and not 0 < cfg.crop_pct <= 1:
        raise UsageError(f"--crop-pct must be in (0, 1], got {cfg.crop_pct}")
    if cfg.clip_grad is not None and cfg.clip_grad <= 0:
        raise UsageError(f"--clip-grad must be > 0 or 'none', got {cfg.clip_grad}")
    if len(cfg.opt_betas) != 2 or not all(_type_matches(b, float) and 0 <= b < 1
                                          for b in cfg.opt_betas):
        raise UsageError(f"--opt-betas needs two numbers in [0, 1), got {cfg.opt_betas}")
    if cfg.aa is not None:
        check_auto_augment(cfg.aa)
    if (cfg.mixup > 0 or cfg.cutmix > 0) and cfg.batch_size % 2:
        raise UsageError(f"--batch-size must be even when mixup/cutmix is on, got {cfg.batch_size}")


def resolve_train_config(argv: Optional[Sequence[str]] = None) -> TrainConfig:
    """Parse argv and merge: TrainConfig defaults < --config YAML < explicit flags; validated."""
    given = vars(build_train_parser().parse_args(argv))
    values = config_file_values(given, CONFIG_DIR, FIELD_NAMES, UsageError)
    if not isinstance(values.get("model_kwargs", {}), dict):
        raise UsageError(f"option 'model_kwargs' must be a mapping, got "
                         f"{values['model_kwargs']!r}")
    if "model_kwargs" in given:
        given["model_kwargs"] = {**values.get("model_kwargs", {}),
                                 **parse_model_kwargs(given["model_kwargs"])}
    values.update(given)
    recipe = {**{f.name: f.default for f in dataclasses.fields(TrainConfig)}, **values}
    values["amp"], values["workers"] = fit_to_machine(
        recipe["device"], recipe["amp"], recipe["workers"], explicit=given,
        processes_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    try:
        cfg = TrainConfig(**values)
    except TypeError as error:
        raise UsageError(f"invalid options: {error}") from error
    if isinstance(cfg.opt_betas, tuple):
        cfg.opt_betas = list(cfg.opt_betas)
    validate_config(cfg)
    return cfg
