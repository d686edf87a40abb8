"""Train an image classifier on an ImageNet-layout folder (docs/training.md recipe by default).

Single process:   python classification/train.py --config vmamba2d_tiny --data-dir DATA --output RUN
Several GPUs:     torchrun --nproc_per_node 8 classification/train.py --config vmamba2d_tiny ...
Continue a run:   add --resume auto (continues RUN/last.pth; see below for a folder without one)

Every epoch ends with a validation pass (model and EMA) and one commit of the run folder
(``vmamba2d.runs.RunFolder``): ``RUN/best.pth`` (weights of the best validation top-1 so
far) and the epoch's line of ``RUN/metrics.jsonl`` are written first, then ``RUN/last.pth`` is
replaced atomically - the commit point. A kill at any moment therefore never leaves best.pth or
metrics.jsonl behind last.pth, and the next start (``--resume auto``) repairs what the kill
interrupted (rolls back an uncommitted best.pth, drops metrics lines of the uncommitted epoch,
deletes temporary files of killed writes). ``--resume auto`` refuses a non-empty folder without
last.pth unless it is a run of this script killed in its first epoch (that one is restarted).
Data-loading randomness depends only on (seed, epoch, image index), so a resumed run is
bitwise identical to the uninterrupted one on CPU, with any ``--workers``. TensorBoard scalars
go to ``RUN/tensorboard`` when installed.
"""
from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import yaml
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch.nn.parallel import DistributedDataParallel

from .checkpoint import (CHECKPOINT_FORMAT, LAST_NAME, check_state_dict_matches,
                         is_training_checkpoint, load_checkpoint_file)
from .config import TrainConfig, resolve_train_config
from .data import (check_train_val_classes, eval_loader, eval_transform,
                   make_image_folder, model_data_config, train_loader,
                   train_transform, updates_per_epoch)
from .distributed import (DistContext, barrier, gather_objects, init_distributed,
                          shutdown_distributed)
from .engine import BadImages, TrainState, evaluate, train_one_epoch
from .errors import BadImageError, DataTransformError, UsageError
from .logging_utils import TensorBoardWriter, setup_logger
from .models import check_model_input, check_model_name, create_classifier
from vmamba2d.machine import available_cores
from vmamba2d.runs import (RunFolder, RunFolderError, RunFolderLock, StartPlan, atomic_write,
                               capture_rng_state, clamp_warmup, restore_rng_state)

SCRIPT = "classification/train.py"
# Options that may change when a run is resumed without changing what is being trained.
RESUME_FREE_OPTIONS = {"resume", "output", "device", "workers", "pin_memory", "progress",
                       "log_interval", "data_dir", "epochs", "skip_bad_images"}


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def check_output_writable(output: Path) -> None:
    """UsageError when --output cannot be created / written (checked before any write)."""
    existing = output
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--output {output}: no permission to write into {existing}")
    if existing != output and not existing.is_dir():
        raise UsageError(f"--output {output}: {existing} is a file, not a folder")


def plan_start(run: RunFolder, resume: Optional[str]) -> StartPlan:
    """How this start uses the run folder (read-only; refuses to overwrite or abandon runs)."""
    try:
        return run.plan_start(resume)
    except RunFolderError as error:
        raise UsageError(str(error)) from error


def load_resume_checkpoint(path: Path, cfg: TrainConfig, classes: list[str],
                           model: torch.nn.Module, logger) -> dict[str, Any]:
    """Read and validate a training checkpoint against the model, classes and recipe."""
    checkpoint = load_checkpoint_file(path, trust_option=None)
    if not is_training_checkpoint(checkpoint):
        raise UsageError(f"--resume {path} is not a checkpoint written by classification/train.py "
                         "(to start from pretrained weights, fine-tune from a fresh run instead)")
    if checkpoint["model_name"] != cfg.model:
        raise UsageError(f"--resume {path} was trained as '{checkpoint['model_name']}', "
                         f"not --model '{cfg.model}'")
    if list(checkpoint["classes"]) != classes:
        raise UsageError(f"--resume {path} was trained on {len(checkpoint['classes'])} other "
                         f"classes than the {len(classes)} in --data-dir")
    check_state_dict_matches(model, checkpoint["model"], f"--resume {path}")
    saved = checkpoint["config"]
    changed = sorted(k for k, v in cfg.to_dict().items()
                     if k not in RESUME_FREE_OPTIONS and saved.get(k) != v)
    if changed:
        logger.warning("resuming with changed options: %s",
                       ", ".join(f"{k}: {saved.get(k)!r} -> {getattr(cfg, k)!r}" for k in changed))
    return checkpoint


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module, scale: float):
    """timm optimizer ``cfg.opt`` (no weight decay on norms / biases); UsageError for a bad
    name."""
    try:
        return create_optimizer_v2(model, opt=cfg.opt, lr=cfg.lr * scale,
                                   weight_decay=cfg.weight_decay, eps=cfg.opt_eps,
                                   betas=tuple(cfg.opt_betas), filter_bias_and_bn=True)
    except (ValueError, AssertionError, TypeError) as error:
        raise UsageError(f"--opt {cfg.opt!r}: {error}") from error


def build_scheduler(cfg: TrainConfig, optimizer, scale: float, steps_per_epoch: int):
    """timm per-update lr schedule ``cfg.sched``; UsageError for a bad name."""
    try:
        scheduler, _ = create_scheduler_v2(
            optimizer, sched=cfg.sched, num_epochs=cfg.epochs, warmup_epochs=cfg.warmup_epochs,
            warmup_lr=cfg.warmup_lr * scale, min_lr=cfg.min_lr * scale, step_on_epochs=False,
            updates_per_epoch=steps_per_epoch)
    except (ValueError, AssertionError, TypeError) as error:
        raise UsageError(f"--sched {cfg.sched!r}: {error}") from error
    if scheduler is None:
        raise UsageError(f"--sched {cfg.sched!r}: timm built no scheduler for this name")
    return scheduler


def build_loss(cfg: TrainConfig) -> torch.nn.Module:
    """Soft-target CE under mixup/cutmix (smoothing folded into the mixed targets), else
    label-smoothing CE, else plain CE."""
    if cfg.mixup > 0 or cfg.cutmix > 0:
        return SoftTargetCrossEntropy()
    if cfg.smoothing > 0:
        return LabelSmoothingCrossEntropy(smoothing=cfg.smoothing)
    return torch.nn.CrossEntropyLoss()


def build_mixup(cfg: TrainConfig, num_classes: int) -> Optional[Mixup]:
    """timm Mixup/CutMix (with label smoothing) when either alpha is > 0."""
    if cfg.mixup <= 0 and cfg.cutmix <= 0:
        return None
    return Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mixup_prob,
                 switch_prob=cfg.mixup_switch_prob, mode=cfg.mixup_mode,
                 label_smoothing=cfg.smoothing, num_classes=num_classes)


def training_checkpoint(*, cfg: TrainConfig, classes: list[str], model: torch.nn.Module,
                        ema: Optional[ModelEmaV3], optimizer, scheduler, scaler, epoch: int,
                        state: TrainState, rng: list, best_top1: float, best_epoch: int,
                        metrics: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Everything needed to continue exactly after ``epoch`` (0-based) has finished."""
    return {
        "format": CHECKPOINT_FORMAT, "model_name": cfg.model, "classes": classes,
        "config": cfg.to_dict(), "epoch": epoch + 1, "global_step": state.global_step,
        "model": model.state_dict(), "model_ema": ema.module.state_dict() if ema else None,
        "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(), "rng": rng, "world_size": world_size,
        "best_top1": best_top1, "best_epoch": best_epoch, "metrics": metrics,
    }


def train(cfg: TrainConfig, ctx: DistContext) -> dict[str, Any]:
    """Run (or continue) the training described by ``cfg``; returns the last epoch's metrics."""
    logger = setup_logger(ctx.is_main)
    # --- validate everything before writing anything ---------------------------------------
    data_dir = Path(cfg.data_dir)
    classes = check_train_val_classes(data_dir)
    check_model_name(cfg.model)
    output = Path(cfg.output)
    check_output_writable(output)
    lock = lock_run_folder(output, ctx)
    try:
        return _train_in_folder(cfg, ctx, logger, classes, output)
    finally:
        if lock is not None:
            lock.release()


def lock_run_folder(output: Path, ctx: DistContext) -> Optional[RunFolderLock]:
    """Rank 0 takes the exclusive lock of ``--output`` (the other ranks write nothing there);
    UsageError on every rank when another run holds it or it cannot be taken."""
    lock, problem = None, None
    if ctx.is_main:
        lock = RunFolderLock(output)
        try:
            lock.acquire()
        except RunFolderError as error:
            lock, problem = None, str(error)
    problems = [p for p in gather_objects(problem, ctx) if p]
    if problems:
        if lock is not None:
            lock.release()
        raise UsageError(problems[0])
    return lock


def _train_in_folder(cfg: TrainConfig, ctx: DistContext, logger, classes: list[str],
                     output: Path) -> dict[str, Any]:
    """The run of :func:`train` once its inputs are checked and ``output`` is locked."""
    data_dir = Path(cfg.data_dir)
    run = RunFolder(output, script=SCRIPT)
    plan = plan_start(run, cfg.resume)
    resume_path = plan.resume_from
    if len(set(gather_objects((str(resume_path), plan.continues), ctx))) > 1:
        raise UsageError(f"processes disagree on what to resume from --output {output}: it must "
                         "be on a filesystem shared by all nodes")
    cfg.warmup_epochs, warmup_note = clamp_warmup(cfg.warmup_epochs, cfg.epochs)
    if warmup_note:
        logger.warning(warmup_note)

    seed_everything(cfg.seed)  # same initial weights on every rank
    model = create_classifier(cfg.model, len(classes), cfg.drop_path, cfg.model_kwargs)
    checkpoint = None
    if resume_path is not None:
        checkpoint = load_resume_checkpoint(resume_path, cfg, classes, model, logger)
        model.load_state_dict(checkpoint["model"])
    model.to(ctx.device)
    check_model_input(model, cfg.model, cfg.img_size, ctx.device)

    data_config = model_data_config(model, cfg.img_size, cfg.interpolation, cfg.crop_pct)
    train_set = make_image_folder(
        data_dir / "train",
        train_transform(data_config, auto_augment=cfg.aa, color_jitter=cfg.color_jitter,
                        re_prob=cfg.reprob, re_mode=cfg.remode, re_count=cfg.recount), classes)
    val_set = make_image_folder(data_dir / "val", eval_transform(data_config), classes)
    pin = cfg.pin_memory and ctx.device.type == "cuda"
    loader = train_loader(train_set, batch_size=cfg.batch_size, rank=ctx.rank,
                          world_size=ctx.world_size, seed=cfg.seed, workers=cfg.workers,
                          pin_memory=pin)
    val_loader = eval_loader(val_set, batch_size=cfg.batch_size, rank=ctx.rank,
                             world_size=ctx.world_size, workers=cfg.workers, pin_memory=pin)

    scale = cfg.lr_scale(ctx.world_size)
    optimizer = build_optimizer(cfg, model, scale)
    steps_per_epoch = updates_per_epoch(len(loader), cfg.accum_steps)
    scheduler = build_scheduler(cfg, optimizer, scale, steps_per_epoch)
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=cfg.amp == "fp16")
    ema = ModelEmaV3(model, decay=cfg.model_ema_decay) if cfg.model_ema else None
    state = TrainState()
    start_epoch, best_top1, best_epoch = 0, -1.0, -1
    if checkpoint is not None:
        if ema is not None:
            if checkpoint.get("model_ema") is None:
                logger.warning("checkpoint has no EMA weights; the EMA restarts from the model")
            else:
                ema.module.load_state_dict(checkpoint["model_ema"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if checkpoint["config"]["epochs"] == cfg.epochs:
            scheduler.load_state_dict(checkpoint["scheduler"])
        else:  # keep the freshly built schedule for the new length
            logger.warning("--epochs changed from %d to %d: the lr schedule is recomputed for %d "
                           "epochs", checkpoint["config"]["epochs"], cfg.epochs, cfg.epochs)
        scaler.load_state_dict(checkpoint["scaler"])
        start_epoch = checkpoint["epoch"]
        state.global_step = checkpoint["global_step"]
        best_top1, best_epoch = checkpoint["best_top1"], checkpoint["best_epoch"]
        scheduler.step_update(num_updates=state.global_step)

    # --- from here on files are written (rank 0 only) ---------------------------------------
    if ctx.is_main:
        repairs = run.start(plan, checkpoint["epoch"] if plan.continues else 0)
        logger = setup_logger(True, output / "log.txt")
        for note in ([warmup_note] if warmup_note else []) + repairs:
            logger.warning("%s", note)
        if not plan.continues:
            text = yaml.safe_dump(cfg.to_dict(), sort_keys=False).encode()
            atomic_write(output / "config.yaml", lambda handle: handle.write(text))
    tensorboard = TensorBoardWriter(output, enabled=ctx.is_main, logger=logger,
                                    purge_step=state.global_step if checkpoint else None)
    logger.info("model %s: %.2fM parameters, %d classes, %d train / %d val images",
                cfg.model, sum(p.numel() for p in model.parameters()) / 1e6, len(classes),
                len(train_set), len(val_set))
    logger.info("%d process(es) on %s; total batch %d (lr scale %.4g: lr %.3g, warmup %.3g, "
                "min %.3g); %d updates/epoch; amp %s; %d data worker(s) per process, %d core(s) "
                "available", ctx.world_size, ctx.device.type,
                cfg.total_batch(ctx.world_size), scale, cfg.lr * scale, cfg.warmup_lr * scale,
                cfg.min_lr * scale, steps_per_epoch, cfg.amp, cfg.workers, available_cores())
    if checkpoint is not None:
        logger.info("resumed from %s: %d epoch(s) done, step %d, best top-1 %.2f",
                    resume_path, start_epoch, state.global_step, best_top1)
        rng = checkpoint["rng"]
        if len(rng) == ctx.world_size:
            restore_rng_state(rng[ctx.rank])
        else:
            logger.warning("checkpoint was written by %d process(es), this run has %d: random "
                           "streams are re-seeded, so drop-path and mixup will differ from an "
                           "uninterrupted run", len(rng), ctx.world_size)
            seed_everything(cfg.seed + 1000 * start_epoch + ctx.rank)
    else:
        seed_everything(cfg.seed + ctx.rank)  # different drop-path / mixup on every rank

    train_model: torch.nn.Module = model
    if ctx.distributed:
        train_model = DistributedDataParallel(
            model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    loss_fn = build_loss(cfg)
    mixup_fn = build_mixup(cfg, len(classes))
    bad_images = BadImages(skip=cfg.skip_bad_images)

    record: dict[str, Any] = {}
    if start_epoch >= cfg.epochs:
        logger.info("nothing to do: %d of %d epochs already done", start_epoch, cfg.epochs)
    for epoch in range(start_epoch, cfg.epochs):
        loader.sampler.set_epoch(epoch)
        try:
            train_stats = train_one_epoch(
                model=model, train_model=train_model, loader=loader, optimizer=optimizer,
                scheduler=scheduler, loss_fn=loss_fn, mixup_fn=mixup_fn, ema=ema, scaler=scaler,
                amp=cfg.amp, accum_steps=cfg.accum_steps, clip_grad=cfg.clip_grad, state=state,
                epoch=epoch, ctx=ctx, progress=cfg.progress, log_interval=cfg.log_interval,
                bad_images=bad_images)
            scheduler.step(epoch + 1)
            val = evaluate(model, val_loader, ctx, cfg.amp, cfg.progress, desc="val",
                           bad_images=bad_images)
            ema_val = (evaluate(ema.module, val_loader, ctx, cfg.amp, cfg.progress,
                                desc="val ema", bad_images=BadImages(skip=True, log=False))
                       if ema is not None else None)
        except DataTransformError as error:
            raise DataTransformError(error.failures, error.split, epoch) from error
        except BadImageError as error:
            kept = (f"{output / LAST_NAME} still holds the {epoch} finished epoch(s)" if epoch
                    else "no epoch was finished yet")
            raise BadImageError(
                f"{error}. Training stopped in epoch {epoch} ({epoch + 1} of {cfg.epochs}) before any of it "
                f"was saved; {kept}. Fix or delete the file, or pass --skip-bad-images, then "
                "continue with --resume auto") from error
        record = {"type": "epoch", "epoch": epoch, "step": state.global_step, **train_stats,
                  "val_top1": val["top1"], "val_top5": val["top5"], "val_loss": val["loss"],
                  "val_images": val["images"], "val_bad_images": val["bad_images"]}
        epoch_best = val["top1"]
        if ema_val is not None:
            record.update(ema_top1=ema_val["top1"], ema_top5=ema_val["top5"],
                          ema_loss=ema_val["loss"])
            epoch_best = max(epoch_best, ema_val["top1"])
        improved = epoch_best > best_top1
        if improved:
            best_top1, best_epoch = epoch_best, epoch
        record.update(best_top1=best_top1, best_epoch=best_epoch, time=time.time())
        rng = gather_objects(capture_rng_state(), ctx)
        if ctx.is_main:
            ckpt = training_checkpoint(cfg=cfg, classes=classes, model=model, ema=ema,
                                       optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                       epoch=epoch, state=state, rng=rng, best_top1=best_top1,
                                       best_epoch=best_epoch, metrics=record,
                                       world_size=ctx.world_size)
            best = ({k: v for k, v in ckpt.items()
                     if k not in ("optimizer", "scheduler", "scaler", "rng")}
                    if improved else None)
            run.commit(epoch=epoch, checkpoint=ckpt, records=[record], best=best)
            tensorboard.write(record, step=state.global_step)
        # epochs numbered from 0, as in metrics.jsonl, the checkpoints and the progress bar
        logger.info("epoch %d (%d of %d) step %d: loss %.4f lr %.3g | val top-1 %.2f top-5 %.2f%s | "
                    "best %.2f (epoch %d) | %.1f img/s", epoch, epoch + 1, cfg.epochs, state.global_step,
                    train_stats["train_loss"], train_stats["lr"], val["top1"], val["top5"],
                    f" | ema top-1 {record['ema_top1']:.2f}" if ema is not None else "",
                    best_top1, best_epoch, train_stats["train_img_per_s"])
    tensorboard.close()
    barrier(ctx)
    return record


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; returns the process exit code (2 for bad input, 1 for a diverged run
    or a data transform that raised)."""
    try:
        cfg = resolve_train_config(argv)
        ctx = init_distributed(cfg.device)
        try:
            train(cfg, ctx)
        finally:
            shutdown_distributed()
    except UsageError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    except FloatingPointError as error:
        print(f"train.py: error: {error}. Lower --lr, set --clip-grad or train with --amp none, "
              "then continue with --resume auto", file=sys.stderr)
        return 1
    except DataTransformError as error:
        print(f"train.py: error: {error}. Nothing of that epoch was saved. Augmentation is "
              "seeded per (seed, epoch, image), so --resume auto repeats the same draw: fix or "
              "remove the image, or change the failing transform's options, then continue with "
              "--resume auto", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
