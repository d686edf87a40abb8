"""Options of a MIL training run: built-in defaults < YAML (``--config``) < command-line flags.

The defaults are the official 2DMambaMIL protocol (docs/mil.md): AdamW lr 1e-4, weight decay 1e-5,
20 epochs, one slide per step, cosine schedule stepped per epoch for classification (none for
survival), fp32. The YAML files under ``vmamba2d/configs/mil/`` hold one dataset / task each.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ..runs.options import config_file_values, parse_key_values

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "mil"
TASKS = ("classification", "survival")
MODEL_NAMES = ("mambamil2d", "mambamil", "abmil", "clam_sb", "dsmil", "dtfdmil", "transmil", "s4mil", "mambamil_sr")
AMP_CHOICES = ("none", "bf16", "fp16")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
SCHEDULERS = ("cosine", "none")
SELECTIONS = ("best", "last")
CLASSIFICATION_METRICS = ("auc", "acc", "f1", "loss")
SURVIVAL_METRICS = ("cindex", "loss")


class UsageError(ValueError):
    """Bad user input (options, paths, tables); the CLI prints it and exits with code 2."""


@dataclass
class MILConfig:
    """Every option of a MIL run; field names are the YAML keys, flags are ``--field-name``."""

    task: str = "classification"
    model: str = "mambamil2d"
    model_kwargs: dict = field(default_factory=dict)  # e.g. {num_blocks: 1, conv: "1d"}
    loss_weights: dict = field(default_factory=dict)  # loss term -> weight, e.g. {instance: 0.3}
    in_dim: Optional[int] = None  # None: the feature size of most slides
    # data
    feature_dir: Optional[str] = None
    label_csv: Optional[str] = None
    split_csv: Optional[str] = None  # ",train,val,test" ids; "{fold}" in the name = one per fold
    label_map: Optional[dict] = None  # label text -> class index (classification)
    drop_unmapped_labels: bool = False  # skip rows whose label is not in label_map (else error)
    slide_column: str = "slide_id"
    label_column: str = "label"
    split_column: Optional[str] = "split"
    split_fractions: Optional[list] = None  # [train, val, test]: stratified split of the table
    split_seed: int = 0
    grid: dict = field(default_factory=dict)  # vmamba2d.mil.data.grid.GridOptions fields
    skip_bad_slides: bool = False  # train without unusable slides (listed in summary.json)
    # survival
    n_bins: int = 4
    alpha: float = 0.0
    holdout_fraction: float = 0.0  # carve a selection set out of train; the fold's val is tested
    # runs
    output: Optional[str] = None
    resume: bool = False
    seeds: list = field(default_factory=lambda: [0])
    folds: list = field(default_factory=lambda: [0])  # used when split_csv contains "{fold}"
    device: str = "auto"
    amp: str = "none"
    workers: int = 0
    threads: Optional[int] = None  # torch intra-op threads (None: torch's default)
    progress: bool = True
    # optimisation
    epochs: int = 20
    lr: float = 1e-4
    weight_decay: float = 1e-5
    scheduler: str = "cosine"
    min_lr: float = 0.0
    shuffle: bool = True  # False = the official classification order (table order, every epoch)
    # selection: "best" picks the epoch on val and reports test there; "last" reports the last
    # epoch (survival default unless holdout_fraction > 0: the folds have no test split)
    select: str = "best"
    select_metric: Optional[str] = None  # default: auc (classification) / cindex (survival)

    def to_dict(self) -> dict[str, Any]:
        """Plain, YAML/JSON-serialisable copy."""
        return dataclasses.asdict(self)

    @property
    def metric(self) -> str:
        """The selection metric (``select_metric`` or the task's default)."""
        if self.select_metric:
            return self.select_metric
        return "auc" if self.task == "classification" else "cindex"

    @property
    def uses_folds(self) -> bool:
        """True when ``split_csv`` names one file per fold."""
        return bool(self.split_csv) and "{fold}" in self.split_csv


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(MILConfig))
# Options that may differ when a run folder is resumed without changing what is trained.
RESUME_FREE_OPTIONS = {"resume", "output", "device", "workers", "threads", "progress",
                       "feature_dir"}


def build_train_parser() -> argparse.ArgumentParser:
    """CLI of mil/train.py; options not given are absent from the parsed namespace."""
    p = argparse.ArgumentParser(
        description="Train 2DMambaMIL (or a baseline: --model) on per-slide feature "
                    "files: classification or survival, seeds x folds, with checkpoints and resume.",
        epilog="examples:\n"
               "  vmamba2d-mil-train --config synthetic --feature-dir data/tiny/mil/features "
               "--label-csv data/tiny/mil/labels.csv --output runs/mil --epochs 3\n"
               "  vmamba2d-mil-train --config bracs --feature-dir FEATURES --label-csv labels.csv --output runs/bracs\n"
               "  vmamba2d-mil-train ... --resume      # continue a killed run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS)
    p.add_argument("--config", help="YAML file, or a name under vmamba2d/configs/mil/ (e.g. bracs)")
    p.add_argument("--task", choices=TASKS)
    p.add_argument("--model", choices=MODEL_NAMES)
    p.add_argument("--model-kwargs", nargs="+", metavar="KEY=VALUE",
                   help="model options, e.g. num_blocks=2 conv=2d mask_pad=false (model_kwargs of a "
                        "--config file apply to that file's model only)")
    p.add_argument("--loss-weights", nargs="+", metavar="TERM=WEIGHT",
                   help="weights of the model's loss terms, e.g. slide=0.7 instance=0.3 (clam_sb) "
                        "or slide=0.5 max_instance=0.5 (dsmil); default: the model's")
    p.add_argument("--in-dim", type=int, help="feature size (default: read from the data)")
    p.add_argument("--feature-dir", help="folder of <slide_id>.h5 / .pt feature files")
    p.add_argument("--label-csv", help="label table (classification) or survival table")
    p.add_argument("--split-csv", help="split table (,train,val,test); '{fold}' = one per fold")
    p.add_argument("--label-map", nargs="+", metavar="LABEL=INDEX", help="e.g. AT=0 BT=1 MT=2")
    p.add_argument("--drop-unmapped-labels", action=argparse.BooleanOptionalAction)
    p.add_argument("--slide-column")
    p.add_argument("--label-column")
    p.add_argument("--split-column")
    p.add_argument("--split-fractions", type=float, nargs=3, metavar=("TRAIN", "VAL", "TEST"))
    p.add_argument("--split-seed", type=int)
    p.add_argument("--grid", nargs="+", metavar="KEY=VALUE",
                   help="grid placement, e.g. patch_step=512 placement=absolute max_cells=40000")
    p.add_argument("--skip-bad-slides", action=argparse.BooleanOptionalAction,
                   help="train without the slides whose files are unusable (default: list them "
                        "all and stop before anything is written)")
    p.add_argument("--n-bins", type=int, help="survival time bins K")
    p.add_argument("--alpha", type=float, help="weight of the uncensored term of the NLL")
    p.add_argument("--holdout-fraction", type=float,
                   help="share of the training patients held out for epoch selection")
    p.add_argument("--output", help="run folder (one sub-folder per seed / fold)")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction,
                   help="continue the runs kept in --output")
    p.add_argument("--seeds", type=int, nargs="+")
    p.add_argument("--folds", type=int, nargs="+")
    p.add_argument("--device", choices=DEVICE_CHOICES)
    p.add_argument("--amp", choices=AMP_CHOICES, help="autocast dtype on GPU (fp16 adds a scaler)")
    p.add_argument("--workers", type=int, help="data-loading processes")
    p.add_argument("--threads", type=int, help="torch CPU threads (1 is fastest on a busy machine)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction)
    p.add_argument("--epochs", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--scheduler", choices=SCHEDULERS)
    p.add_argument("--min-lr", type=float)
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction,
                   help="reshuffle the training slides every epoch (--no-shuffle: official order)")
    p.add_argument("--select", choices=SELECTIONS)
    p.add_argument("--select-metric", choices=sorted(set(CLASSIFICATION_METRICS + SURVIVAL_METRICS)))
    return p


def validate_config(cfg: MILConfig) -> None:
    """Reject option values that cannot work, naming the option."""
    def bad(name: str, message: str) -> UsageError:
        return UsageError(f"--{name.replace('_', '-')} {message}")

    for name in ("feature_dir", "label_csv", "output"):
        if not getattr(cfg, name):
            raise bad(name, f"is required (flag or config key '{name}')")
    if cfg.task not in TASKS:
        raise bad("task", f"must be one of {TASKS}, got {cfg.task!r}")
    if cfg.model not in MODEL_NAMES:
        raise bad("model", f"must be one of {MODEL_NAMES}, got {cfg.model!r}")
    for name, choices in (("amp", AMP_CHOICES), ("device", DEVICE_CHOICES),
                          ("scheduler", SCHEDULERS), ("select", SELECTIONS)):
        if getattr(cfg, name) not in choices:
            raise bad(name, f"must be one of {choices}, got {getattr(cfg, name)!r}")
    allowed = CLASSIFICATION_METRICS if cfg.task == "classification" else SURVIVAL_METRICS
    if cfg.metric not in allowed:
        raise bad("select_metric", f"for task {cfg.task!r} must be one of {allowed}, got "
                                   f"{cfg.metric!r}")
    for name in ("epochs", "n_bins"):
        if isinstance(getattr(cfg, name), bool) or int(getattr(cfg, name)) < 1:
            raise bad(name, f"must be >= 1, got {getattr(cfg, name)}")
    if cfg.in_dim is not None and cfg.in_dim < 1:
        raise bad("in_dim", f"must be >= 1, got {cfg.in_dim}")
    if cfg.workers < 0:
        raise bad("workers", f"must be >= 0, got {cfg.workers}")
    if cfg.threads is not None and cfg.threads < 1:
        raise bad("threads", f"must be >= 1, got {cfg.threads}")
    for name in ("lr", "weight_decay", "min_lr"):
        if not math.isfinite(float(getattr(cfg, name))):
            raise bad(name, f"must be a finite number, got {getattr(cfg, name)}")
        if float(getattr(cfg, name)) < 0:
            raise bad(name, f"must be >= 0, got {getattr(cfg, name)}")
    if not 0.0 <= cfg.alpha <= 1.0:
        raise bad("alpha", f"must be in [0, 1], got {cfg.alpha}")
    if not 0.0 <= cfg.holdout_fraction < 1.0:
        raise bad("holdout_fraction", f"must be in [0, 1), got {cfg.holdout_fraction}")
    for name in ("seeds", "folds"):
        values = getattr(cfg, name)
        if (not isinstance(values, list) or not values
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                           for v in values) or len(set(values)) != len(values)):
            raise bad(name, f"must be a non-empty list of distinct integers >= 0, got {values!r}")
    for name in ("model_kwargs", "grid", "loss_weights"):
        if not isinstance(getattr(cfg, name), dict):
            raise bad(name, f"must be a mapping, got {getattr(cfg, name)!r}")
    reserved = {"in_dim", "num_classes", "survival"} & set(cfg.model_kwargs)
    if reserved:
        raise bad("model_kwargs", f"must not set {sorted(reserved)}: they follow from the data "
                                  "and --task (use --in-dim / --n-bins)")
    if cfg.label_map is not None:
        if (not isinstance(cfg.label_map, dict) or not cfg.label_map
                or not all(isinstance(v, int) and not isinstance(v, bool)
                           for v in cfg.label_map.values())
                or sorted(set(cfg.label_map.values())) != list(range(len(set(
                    cfg.label_map.values()))))):
            raise bad("label_map", f"must map labels to class indices 0..C-1 (each used), got "
                                   f"{cfg.label_map!r}")
        if len(set(cfg.label_map.values())) < 2:
            raise bad("label_map", f"maps every label to one class ({cfg.label_map!r}): a "
                                   "classifier needs at least 2 classes")
    if cfg.drop_unmapped_labels and cfg.label_map is None:
        raise bad("drop_unmapped_labels", "needs --label-map (which labels to keep)")
    if cfg.split_fractions is not None:
        fractions = cfg.split_fractions
        if (len(fractions) != 3 or any(f < 0 for f in fractions) or fractions[0] <= 0
                or abs(sum(fractions) - 1.0) > 1e-6):
            raise bad("split_fractions", f"must be three shares (train, val, test) >= 0 summing to "
                                         f"1 with train > 0, got {fractions}")
        if cfg.split_csv:
            raise bad("split_fractions", "and --split-csv are exclusive (give one split source)")
    if cfg.task == "survival":
        if not cfg.split_csv:
            raise bad("split_csv", "is required for survival (the fold files splits_{fold}.csv)")
        if "{fold}" not in cfg.split_csv and len(cfg.folds) > 1:
            raise bad("split_csv", f"{cfg.split_csv!r} has no '{{fold}}' placeholder, so the "
                                   f"{len(cfg.folds)} folds {cfg.folds} would all train on one "
                                   "split; name the fold files with {fold} or give one --folds")
    elif cfg.holdout_fraction > 0:
        raise bad("holdout_fraction", "is a survival option (classification tables have a val split)")
    if cfg.amp != "none" and cfg.device == "cpu":
        raise bad("amp", f"{cfg.amp} autocast is for GPUs; use --amp none with --device cpu")


def resolve_train_config(argv: Optional[Sequence[str]] = None) -> MILConfig:
    """Parse argv and merge MILConfig defaults < --config YAML < flags; validated."""
    given = vars(build_train_parser().parse_args(argv))
    values = config_file_values(given, CONFIG_DIR, FIELD_NAMES, UsageError)
    if "model" in given and values.get("model", given["model"]) != given["model"]:
        # A config file's model_kwargs are options of its own model, not of the one --model names.
        values.pop("model_kwargs", None)
    for name, flag in (("model_kwargs", "--model-kwargs"), ("grid", "--grid"),
                       ("loss_weights", "--loss-weights")):
        if name in given:
            given[name] = {**(values.get(name) or {}), **parse_key_values(given[name], flag, UsageError)}
    if "label_map" in given:
        given["label_map"] = _raw_label_map(given["label_map"])
    if "split_fractions" in given:
        given["split_fractions"] = list(given["split_fractions"])
    values.update(given)
    try:
        cfg = MILConfig(**values)
    except TypeError as error:
        raise UsageError(f"invalid options: {error}") from error
    if isinstance(cfg.label_map, dict):  # YAML may give numeric labels (e.g. ISUP grades)
        cfg.label_map = {str(k): v for k, v in cfg.label_map.items()}
    if cfg.task == "survival" and "scheduler" not in values:
        cfg.scheduler = "none"  # official survival protocol: no scheduler
    if cfg.task == "survival" and "select" not in values and cfg.holdout_fraction == 0:
        cfg.select = "last"  # survival folds have no test split: report val at the last epoch
    validate_config(cfg)
    for name in ("feature_dir", "label_csv", "split_csv"):  # checkpoints work from any folder
        if getattr(cfg, name):
            setattr(cfg, name, str(Path(getattr(cfg, name)).absolute()))
    return cfg


def _raw_label_map(items: Sequence[str]) -> dict[str, int]:
    """``["AT=0", "Clear cell=2"]`` -> ``{"AT": 0, "Clear cell": 2}`` (split at the last '=')."""
    mapping: dict[str, int] = {}
    for item in items:
        label, sep, index = item.rpartition("=")
        if not sep or not label:
            raise UsageError(f"--label-map: expected LABEL=INDEX, got {item!r}")
        try:
            mapping[label] = int(index)
        except ValueError as error:
            raise UsageError(f"--label-map: index of {label!r} must be an integer, got "
                             f"{index!r}") from error
    return mapping
