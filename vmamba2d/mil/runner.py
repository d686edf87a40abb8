"""MIL training runs: seeds x folds, epoch selection, checkpoints and exact resume.

Layout of ``--output``::

    config.yaml            the resolved options
    summary.json           per-run results and their mean / std (written when all runs finish),
                           and the unusable slides left out (``--skip-bad-slides``)
    <run>/                 one folder per run: "seed<s>" or "fold<f>-seed<s>", kept with the
                           run-folder protocol of ``vmamba2d.runs.run_folder``
        run.json           marker of the run folder
        last.pth           everything needed to continue after the last finished epoch
        best.pth           weights of the selected epoch (``model_config`` + ``model``: loads
                           with ``vmamba2d.mil.model_from_checkpoint``), label map, bin edges,
                           its val / test predictions
        metrics.jsonl      one record per epoch (train loss, lr, val / test metrics)
        predictions_<split>.csv  per-slide predictions of the selected epoch (when finished)
        summary.json       the run's selected epoch and reported metrics (when finished)

Per epoch: train -> val -> test. ``select: best`` picks the epoch with the best val metric (later
epochs win ties, as the official code) and reports TEST at that epoch; ``select: last`` reports the
last epoch. The epoch is never chosen on the split it reports. For survival the official number
(the maximum val C-index over epochs, chosen on the reported set, hence optimistic) is also
recorded, under ``official_protocol``.

Exact resume: ``last.pth`` is committed after every epoch and holds the model, optimizer,
scheduler, scaler, RNG states and the epoch history; the training order of epoch e is drawn
from (seed, e) and the loaders never draw from the global generator. A resumed run therefore
reproduces an uninterrupted one bit for bit on the same machine; ``best.pth`` and
``metrics.jsonl`` are repaired to the committed epochs on start.
"""
from __future__ import annotations

import csv
import inspect
import io
import json
import logging
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import yaml

from ..runs import RunFolder, RunFolderError, RunFolderLock, StartPlan
from ..runs.checkpoint import (atomic_write, capture_rng_state, is_temp_file,
                                   remove_stale_temp_files, restore_rng_state)
from ..runs.run_folder import MARKER_NAME
from ..runs.run_lock import is_lock_file
from .config import RESUME_FREE_OPTIONS, TASKS, MILConfig, UsageError
from .data.dataset import SlideDataset
from .data.errors import SlideDataError
from .data.grid import GridOptions
from .engine import epoch_order, evaluate, resolve_loss_weights, select_epoch, train_one_epoch
from .models import MODELS, build_model
from .slide_check import BadSlide, check_slides, describe_bad_slides
from .splits import SPLITS, RunSplits, run_splits

LOGGER = logging.getLogger("vmamba2d.mil")
CHECKPOINT_FORMAT = "vmamba2d-mil-train-v1"
_STDERR_HANDLER = "vmamba2d.mil.stderr"
REPORTED_KEYS = {"classification": ("acc", "f1", "auc"), "survival": ("cindex",)}


@dataclass
class RunPlan:
    """One run (fold x seed) with its data, checked before anything is written;
    ``skipped_slides``: ids of the unusable slides left out of every run (--skip-bad-slides)."""

    name: str
    fold: Optional[int]
    seed: int
    splits: RunSplits
    datasets: dict[str, SlideDataset]
    folder: RunFolder
    start: StartPlan
    skipped_slides: list[str]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is a UsageError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available (use --device cpu or auto)")
    return torch.device(name)


def grid_options(cfg: MILConfig) -> GridOptions:
    """GridOptions from the ``grid`` mapping (canvas_size / patch_step lists become tuples)."""
    values = dict(cfg.grid)
    for key in ("canvas_size", "patch_step"):
        if isinstance(values.get(key), list):
            values[key] = tuple(values[key])
    try:
        return GridOptions(**values)
    except (TypeError, ValueError) as error:
        raise UsageError(f"--grid: {error}") from error


def slide_uses(splits: dict[Optional[int], RunSplits]) -> dict[str, list[str]]:
    """Slide id -> where the runs use it (``"train"``, or ``"fold 0 val"`` with folds), in order."""
    uses: dict[str, list[str]] = {}
    for fold, fold_splits in splits.items():
        for name in SPLITS:
            for entry in fold_splits.split(name):
                uses.setdefault(entry.slide_id, []).append(name if fold is None
                                                           else f"fold {fold} {name}")
    return uses


def checked_splits(cfg: MILConfig, options: GridOptions, folds: list[Optional[int]]
                   ) -> tuple[dict[Optional[int], RunSplits], Optional[int], list[BadSlide]]:
    """Every fold's splits after reading each slide they name once: (splits, in_dim, bad slides).

    Bad slides raise one UsageError listing them all, or with ``skip_bad_slides`` are left out
    of the tables before the splits are made (survival bins then come from the usable patients).
    """
    splits = {fold: run_splits(cfg, fold) for fold in folds}
    uses = slide_uses(splits)
    LOGGER.info("checking the %d slide file(s) the splits name", len(uses))
    in_dim, bad = check_slides(uses, cfg.feature_dir, options, cfg.in_dim)
    if not bad:
        return splits, in_dim, bad
    report = describe_bad_slides(bad, len(uses))
    if not cfg.skip_bad_slides:
        raise UsageError(f"{report}\nFix or remove these files, or pass --skip-bad-slides to "
                         "train without them")
    LOGGER.warning("%s\nskipped (--skip-bad-slides)", report)
    excluded = frozenset(b.slide_id for b in bad)
    return {fold: run_splits(cfg, fold, excluded) for fold in folds}, in_dim, bad


def read_last_checkpoint(path: Path) -> dict[str, Any]:
    """A run's ``last.pth`` to continue from; UsageError naming the file when it cannot be."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated / empty / foreign pickles: torch raises many kinds
        lines = str(error).strip().splitlines()
        raise UsageError(f"--resume: cannot read {path} ({type(error).__name__}: "
                         f"{lines[0] if lines else ''}); the file is damaged (e.g. truncated): "
                         "restore it, or train into a new --output") from error
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise UsageError(f"--resume: {path} is not a checkpoint of mil/train.py")
    return checkpoint


def check_resumable(plan: RunPlan) -> None:
    """A continued run must read its last.pth and keep the slides it was trained without."""
    checkpoint = read_last_checkpoint(plan.folder.last_path)
    before = sorted(checkpoint.get("skipped_slides", []))
    if before != plan.skipped_slides:
        raise UsageError(
            f"--resume: the unusable slides changed since run {plan.name} started (then: "
            f"{', '.join(before) or 'none'}; now: {', '.join(plan.skipped_slides) or 'none'}); "
            "continuing would change its training data. Restore the slide files as they were, "
            "or train into a new --output")


def make_model(cfg: MILConfig, in_dim: int, num_classes: int) -> torch.nn.Module:
    """The configured model; bad ``model_kwargs`` raise a UsageError listing the model's options."""
    kwargs = dict(cfg.model_kwargs, in_dim=in_dim, num_classes=num_classes,
                  survival=cfg.task == "survival")
    try:
        return build_model(cfg.model, **kwargs)
    except (TypeError, ValueError) as error:
        accepted = sorted(set(inspect.signature(MODELS[cfg.model]).parameters)
                          - {"in_dim", "num_classes", "survival"})
        raise UsageError(f"--model {cfg.model} --model-kwargs {cfg.model_kwargs}: {error} "
                         f"(options of {cfg.model}: {', '.join(accepted)})") from error


def loss_weights(cfg: MILConfig, model: torch.nn.Module) -> dict[str, float]:
    """The model's loss-term weights with ``cfg.loss_weights`` applied; UsageError when they do
    not fit the model."""
    try:
        return resolve_loss_weights(model, cfg.loss_weights)
    except ValueError as error:
        raise UsageError(f"--loss-weights: {error}") from error


def plan_runs(cfg: MILConfig) -> tuple[list[RunPlan], int, list[BadSlide]]:
    """All runs of ``cfg`` with their datasets (every slide file read and checked once), the
    feature size and the unusable slides left out (only with ``skip_bad_slides``)."""
    if not Path(cfg.feature_dir).is_dir():
        raise UsageError(f"--feature-dir {cfg.feature_dir} is not a folder")
    if not Path(cfg.label_csv).is_file():
        raise UsageError(f"--label-csv {cfg.label_csv} not found")
    options = grid_options(cfg)
    folds = cfg.folds if (cfg.uses_folds or cfg.task == "survival") else [None]
    all_splits, in_dim, bad = checked_splits(cfg, options, folds)
    skipped = sorted(b.slide_id for b in bad)
    plans = []
    for fold, splits in all_splits.items():
        for note in splits.notes:
            LOGGER.warning("%s%s", f"fold {fold}: " if fold is not None else "", note)
        for seed in cfg.seeds:
            try:
                datasets = {name: SlideDataset(splits.split(name), cfg.feature_dir, grid=options,
                                               in_dim=in_dim, train=name == "train", seed=seed)
                            for name in SPLITS if splits.split(name)}
            except (SlideDataError, FileNotFoundError) as error:
                raise UsageError(str(error)) from error
            name = f"seed{seed}" if fold is None else f"fold{fold}-seed{seed}"
            folder = RunFolder(Path(cfg.output) / name, script="mil/train.py")
            try:
                start = folder.plan_start("auto" if cfg.resume else None)
            except RunFolderError as error:
                raise UsageError(str(error)) from error
            plan = RunPlan(name, fold, seed, splits, datasets, folder, start, skipped)
            if start.continues:
                check_resumable(plan)
            plans.append(plan)
    model = make_model(cfg, in_dim, plans[0].splits.num_classes)
    loss_weights(cfg, model)  # bad options fail here
    probe_model(cfg, model, in_dim)
    return plans, in_dim, bad


def probe_model(cfg: MILConfig, model: torch.nn.Module, in_dim: int) -> None:
    """Run the model once on a 2 x 2 bag of zeros (CPU) before anything is written, so that
    ``model_kwargs`` the layers accept but cannot run with (e.g. a ``d_state`` above what the scan
    supports) fail as a UsageError instead of after config.yaml and run.json are written."""
    features = torch.zeros(4, in_dim)
    coords = torch.tensor([[0, 0], [1, 0], [0, 1], [1, 1]])
    try:
        with torch.no_grad():
            model.eval()(features, coords, grid_size=(2, 2))
    except (ValueError, RuntimeError) as error:
        raise UsageError(f"--model {cfg.model} --model-kwargs {cfg.model_kwargs}: the model fails on a "
                         f"test bag: {(str(error).strip().splitlines() or [''])[0]}") from error


def foreign_run_kind(output: Path) -> Optional[str]:
    """What ``output`` holds when it is not a MIL run folder (e.g. ``"a run of
    'classification/train.py'"``); None for a MIL run folder or one without config.yaml."""
    marker = output / MARKER_NAME  # MIL keeps one run folder per seed / fold, none at the top
    if marker.is_file():
        try:
            script = json.loads(marker.read_text()).get("script")
        except (OSError, ValueError, AttributeError):
            script = None
        return f"a run of {script!r}" if script else f"a run folder of another script ({marker})"
    saved_path = output / "config.yaml"
    if not saved_path.is_file():
        return None
    try:
        saved = yaml.safe_load(saved_path.read_text())
    except yaml.YAMLError:
        return f"a folder whose {saved_path.name} is not YAML"
    if (not isinstance(saved, dict) or saved.get("task") not in TASKS
            or not {"feature_dir", "label_csv"} <= set(saved)):
        return f"a folder whose {saved_path.name} holds no MIL options"
    return None


def check_output(cfg: MILConfig, output: Path) -> None:
    """Refuse to overwrite another run; on --resume, refuse a folder that is not a MIL run or
    was trained with other options. Temporary files of killed writes do not count."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} exists and is not a folder")
    entries = ([e for e in output.iterdir() if not (is_temp_file(e) or is_lock_file(e))]
               if output.is_dir() else [])
    if not cfg.resume:
        if entries:
            raise UsageError(f"--output {output} is not empty; choose a new folder or pass "
                             "--resume to continue the runs kept there")
        return
    kind = foreign_run_kind(output)
    if kind:
        raise UsageError(f"--resume: {output} is {kind}, not a MIL run (mil/train.py keeps "
                         "config.yaml and one folder per seed / fold there); choose another "
                         "--output")
    saved_path = output / "config.yaml"
    if not saved_path.is_file():
        if entries:
            raise UsageError(f"--resume: {output} holds no config.yaml, so it is not a MIL run "
                             "folder; choose another --output")
        return
    saved = yaml.safe_load(saved_path.read_text())
    defaults = MILConfig().to_dict()  # options added after the run started have their default
    changed = sorted(k for k, v in cfg.to_dict().items()
                     if k not in RESUME_FREE_OPTIONS and saved.get(k, defaults[k]) != v)
    if changed:
        raise UsageError("--resume: options differ from the run kept in "
                         f"{output}: " + ", ".join(f"{k}: {saved.get(k, defaults[k])!r} -> "
                                                  f"{getattr(cfg, k)!r}" for k in changed))


def _atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda handle: handle.write(text.encode()))


def write_predictions(path: Path, rows: list[dict[str, Any]]) -> None:
    """Per-slide predictions as CSV (columns = the keys of the first row), written atomically."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    _atomic_write_text(path, text.getvalue())


def build_optimisation(cfg: MILConfig, model: torch.nn.Module, device: torch.device):
    """AdamW on all parameters (official: weight decay everywhere), the cosine schedule stepped
    once per epoch (or none) and the fp16 grad scaler (disabled otherwise)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = None
    if cfg.scheduler == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs,
                                                               eta_min=cfg.min_lr)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    return optimizer, scheduler, scaler


def summarise_run(cfg: MILConfig, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The chosen epoch and the metrics reported for it (see the module docstring)."""
    index = select_epoch(history, cfg.select, cfg.metric)
    chosen = history[index]
    reported_split = "test" if "test" in chosen else "val"
    summary: dict[str, Any] = {
        "selection": (f"best val {cfg.metric}" if cfg.select == "best" else "last epoch"),
        "selected_epoch": chosen["epoch"],
        "reported_split": reported_split,
        "reported": chosen[reported_split],
        "val_at_selected": chosen["val"],
        "last_epoch": {k: history[-1][k] for k in ("epoch", "val", "test") if k in history[-1]},
    }
    if cfg.task == "survival":
        values = [r["val"]["cindex"] for r in history if not math.isnan(r["val"]["cindex"])]
        summary["official_protocol"] = {
            "val_cindex_max": max(values) if values else math.nan,
            "note": "maximum val C-index over epochs (the paper's survival number): the epoch is "
                    "chosen on the reported set, so it is optimistic",
        }
    return summary


def run_one(cfg: MILConfig, plan: RunPlan, in_dim: int, device: torch.device) -> dict[str, Any]:
    """Train (or continue) one run; returns its summary."""
    folder = plan.folder
    summary_path = folder.path / "summary.json"
    if summary_path.is_file():
        LOGGER.info("%s: finished earlier, kept", plan.name)
        return json.loads(summary_path.read_text())
    seed_everything(plan.seed)
    model = make_model(cfg, in_dim, plan.splits.num_classes)
    model.to(device)
    optimizer, scheduler, scaler = build_optimisation(cfg, model, device)
    history: list[dict[str, Any]] = []
    checkpoint = None
    if plan.start.continues:
        checkpoint = read_last_checkpoint(folder.last_path)
        history = list(checkpoint["history"])
    for note in folder.start(plan.start, len(history)):
        LOGGER.warning("%s: %s", plan.name, note)
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(checkpoint["scheduler"])
        scaler.load_state_dict(checkpoint["scaler"])
        restore_rng_state(checkpoint["rng"])
        LOGGER.info("%s: resuming after epoch %d", plan.name, len(history) - 1)

    common = dict(task=cfg.task, alpha=cfg.alpha, device=device, amp=cfg.amp,
                  workers=cfg.workers, seed=plan.seed)
    term_weights = loss_weights(cfg, model)
    train_set = plan.datasets["train"]
    for epoch in range(len(history), cfg.epochs):
        train_set.set_epoch(epoch)
        order = epoch_order(len(train_set), plan.seed, epoch, cfg.shuffle)
        stats = train_one_epoch(model=model, dataset=train_set, order=order, optimizer=optimizer,
                                scaler=scaler, epoch=epoch, progress=cfg.progress,
                                loss_weights=term_weights, **common)
        if scheduler is not None:
            scheduler.step()
        record: dict[str, Any] = {"epoch": epoch, **stats}
        predictions = {}
        for split in ("val", "test"):
            if split in plan.datasets:
                record[split], predictions[split] = evaluate(
                    model, plan.datasets[split], num_classes=plan.splits.num_classes,
                    progress=cfg.progress, desc=split, **common)
        history.append(record)
        weights = {"format": CHECKPOINT_FORMAT, "model_config": model.config,
                   "model": model.state_dict(), "epoch": epoch, "config": cfg.to_dict(),
                   "fold": plan.fold, "seed": plan.seed, "in_dim": in_dim,
                   "label_map": plan.splits.label_map, "bin_edges": plan.splits.bin_edges,
                   "skipped_slides": plan.skipped_slides, "metrics": record}
        is_best = select_epoch(history, cfg.select, cfg.metric) == len(history) - 1
        folder.commit(epoch=epoch, records=[record],
                      best={**weights, "predictions": predictions} if is_best else None,
                      checkpoint={**weights, "optimizer": optimizer.state_dict(),
                                  "scheduler": scheduler.state_dict() if scheduler else None,
                                  "scaler": scaler.state_dict(), "rng": capture_rng_state(),
                                  "history": history})
        LOGGER.info("%s epoch %d/%d: loss %.4f | val %s%s | %.1f s", plan.name, epoch + 1,
                    cfg.epochs, stats["train_loss"], _short(record["val"], cfg.task),
                    f" | test {_short(record['test'], cfg.task)}" if "test" in record else "",
                    stats["train_seconds"])
    best = torch.load(folder.best_path, map_location="cpu", weights_only=True)
    for split, rows in best["predictions"].items():
        write_predictions(folder.path / f"predictions_{split}.csv", rows)
    summary = {"run": plan.name, "fold": plan.fold, "seed": plan.seed,
               "train_slides": len(plan.splits.train), "val_slides": len(plan.splits.val),
               "test_slides": len(plan.splits.test), "notes": plan.splits.notes,
               "skipped_bad_slides": {"count": len(plan.skipped_slides),
                                      "slide_ids": plan.skipped_slides},
               **summarise_run(cfg, history)}
    if summary["selected_epoch"] != best["epoch"]:
        raise RuntimeError(f"{folder.best_path} holds epoch {best['epoch']}, but epoch "
                           f"{summary['selected_epoch']} was selected")
    _atomic_write_text(summary_path, json.dumps(summary, indent=2))
    return summary


def _short(metrics: dict[str, float], task: str) -> str:
    keys = ("loss",) + REPORTED_KEYS[task]
    return " ".join(f"{k} {metrics[k]:.4f}" for k in keys)


def aggregate(cfg: MILConfig, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and (population) std over runs of the reported metrics."""
    keys = REPORTED_KEYS[cfg.task]
    table = {}
    for key in keys:
        values = np.array([s["reported"][key] for s in summaries], dtype=np.float64)
        table[key] = {"mean": float(np.nanmean(values)) if values.size else math.nan,
                      "std": float(np.nanstd(values)) if values.size else math.nan,
                      "values": values.tolist()}
    result = {"task": cfg.task, "model": cfg.model, "reported_split":
              sorted({s["reported_split"] for s in summaries}), "metrics": table, "runs": summaries}
    if cfg.task == "survival":
        values = [s["official_protocol"]["val_cindex_max"] for s in summaries]
        result["official_protocol_val_cindex_max_mean"] = float(np.nanmean(values))
    return result


def train(cfg: MILConfig) -> dict[str, Any]:
    """Run every (fold, seed) of ``cfg``; returns the aggregated summary. ``cfg.threads`` sets
    torch's intra-op threads for the run; the caller's setting is restored afterwards."""
    previous_threads = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg)
    finally:
        torch.set_num_threads(previous_threads)


def _train(cfg: MILConfig) -> dict[str, Any]:
    device = resolve_device(cfg.device)
    if cfg.amp != "none" and device.type != "cuda":
        raise UsageError(f"--amp {cfg.amp} needs a GPU; this run is on {device}")
    output = Path(cfg.output)
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} exists and is not a folder")
    try:
        lock = RunFolderLock(output)
        lock.acquire()
    except RunFolderError as error:
        raise UsageError(str(error)) from error
    try:
        return _train_in_folder(cfg, output, device)
    finally:
        lock.release()


def _train_in_folder(cfg: MILConfig, output: Path, device: torch.device) -> dict[str, Any]:
    """The runs of :func:`train` once ``output`` is locked."""
    check_output(cfg, output)
    plans, in_dim, bad = plan_runs(cfg)
    # --- everything is checked; from here on files are written --------------------------------
    output.mkdir(parents=True, exist_ok=True)
    for path in remove_stale_temp_files(output):  # of a run killed while writing here
        LOGGER.warning("removed %s, left by a killed run", path)
    if not (output / "config.yaml").is_file():
        _atomic_write_text(output / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    LOGGER.info("%d run(s) of %s (%s) on %s, in_dim %d", len(plans), cfg.model, cfg.task,
                device, in_dim)
    start = time.perf_counter()
    summaries = [run_one(cfg, plan, in_dim, device) for plan in plans]
    result = aggregate(cfg, summaries)
    result["skipped_bad_slides"] = {"count": len(bad), "slides": [b.to_dict() for b in bad]}
    result["seconds"] = time.perf_counter() - start
    _atomic_write_text(output / "summary.json", json.dumps(result, indent=2))
    for key, value in result["metrics"].items():
        LOGGER.info("%s %s: %.4f +- %.4f over %d run(s)", result["reported_split"], key,
                    value["mean"], value["std"], len(value["values"]))
    return result


def setup_logging() -> None:
    """INFO messages of vmamba2d.mil to the current stderr (re-pointed on every call: callers
    such as test runners and notebooks replace sys.stderr between runs)."""
    logger = logging.getLogger("vmamba2d.mil")
    for old in [h for h in logger.handlers if h.get_name() == _STDERR_HANDLER]:
        logger.removeHandler(old)  # its stream may be closed by now: not flushed
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_STDERR_HANDLER)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
