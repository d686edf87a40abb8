"""One training epoch (AMP, mixup, gradient accumulation, clipping, EMA, per-step lr) and evaluation."""
from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from vmamba2d.runs.options import autocast

from .distributed import DistContext, all_reduce_sum
from .errors import BadImageError
from .logging_utils import LOGGER_NAME

class BadImages:
    """What to do with the unreadable images a batch reports (``problems``: one string per row,
    empty for readable files; see ``ReadableImageFolder``): raise BadImageError naming the first
    one, or, with ``skip``, log each (unless ``log`` is off, e.g. for a second pass over the same
    split) and let the caller drop / keep the substituted rows."""

    def __init__(self, skip: bool, log: bool = True) -> None:
        self.skip = skip
        self.log = log
        self.logger = logging.getLogger(LOGGER_NAME)

    def bad_rows(self, problems: Sequence[str], where: str) -> list[int]:
        """Indices of the rows whose own file was unreadable (raises unless skipping)."""
        rows = [row for row, problem in enumerate(problems) if problem]
        if rows and not self.skip:
            raise BadImageError(f"unreadable image {problems[rows[0]]}")
        for row in rows if self.log else ():
            self.logger.warning("%s: skipped unreadable image %s", where, problems[row])
        return rows


@dataclass
class TrainState:
    """What the epoch loop mutates: optimizer updates done so far."""

    global_step: int = 0


def _current_lr(optimizer: torch.optim.Optimizer) -> float:
    return max(group["lr"] for group in optimizer.param_groups)


def train_one_epoch(*, model: torch.nn.Module, train_model: torch.nn.Module, loader: DataLoader,
                    optimizer: torch.optim.Optimizer, scheduler: Any, loss_fn: Callable,
                    mixup_fn: Optional[Callable], ema: Optional[torch.nn.Module],
                    scaler: torch.amp.GradScaler, amp: str, accum_steps: int,
                    clip_grad: Optional[float], state: TrainState, epoch: int, ctx: DistContext,
                    progress: bool, log_interval: int,
                    bad_images: Optional[BadImages] = None) -> dict[str, float]:
    """Train ``train_model`` (``model`` or its DDP wrapper) for one pass over ``loader``.

    Batches are (images (batch, 3, H, W), targets (batch,) int64, problems (batch strings)).
    A loss is divided by the size of its accumulation group; the optimizer steps at the end of
    each group (the last group of the epoch may be shorter). An unreadable image raises
    BadImageError before the batch is used, unless ``bad_images.skip`` (its substitute is then
    trained on and counted). Returns rank-averaged ``train_loss``, the last ``lr``,
    ``train_img_per_s``, ``train_seconds`` and ``train_bad_images`` (summed over ranks).
    """
    bad_images = bad_images or BadImages(skip=False)
    model.train()
    device = ctx.device
    num_batches = len(loader)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    images_seen = bad_count = 0
    bar = tqdm(total=num_batches, desc=f"epoch {epoch}", disable=not (progress and ctx.is_main),
               dynamic_ncols=True, leave=False)
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    for index, (images, targets, problems) in enumerate(loader):
        bad_count += len(bad_images.bad_rows(problems, f"train epoch {epoch}"))
        group_start = (index // accum_steps) * accum_steps
        group_size = min(accum_steps, num_batches - group_start)
        is_update = index + 1 == group_start + group_size
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        if mixup_fn is not None:
            images, targets = mixup_fn(images, targets)
        no_sync = ctx.distributed and not is_update and hasattr(train_model, "no_sync")
        with train_model.no_sync() if no_sync else contextlib.nullcontext():
            with autocast(device, amp):
                loss = loss_fn(train_model(images), targets)
            scaler.scale(loss / group_size).backward()
        if is_update:
            if clip_grad is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            state.global_step += 1
            if ema is not None:
                ema.update(model, step=state.global_step)
            scheduler.step_update(num_updates=state.global_step)
        loss_sum += loss.detach().double() * images.shape[0]
        images_seen += images.shape[0]
        if (index + 1) % log_interval == 0 or index + 1 == num_batches:
            mean_loss = (loss_sum / images_seen).item()
            if not math.isfinite(mean_loss):
                raise FloatingPointError(f"training loss is {mean_loss} at epoch {epoch}, step "
                                         f"{state.global_step}; the last checkpoint is untouched")
            elapsed = time.perf_counter() - start
            bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{_current_lr(optimizer):.3g}",
                            img_s=f"{images_seen * ctx.world_size / max(elapsed, 1e-9):.1f}")
        bar.update(1)
    bar.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    totals = all_reduce_sum(torch.stack([loss_sum.cpu(), torch.tensor(float(images_seen),
                                                                      dtype=torch.float64),
                                         torch.tensor(float(bad_count), dtype=torch.float64)]),
                            ctx)
    return {"train_loss": (totals[0] / totals[1]).item(), "lr": _current_lr(optimizer),
            "train_img_per_s": totals[1].item() / max(elapsed, 1e-9),
            "train_seconds": elapsed, "train_bad_images": int(totals[2].item())}


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, ctx: DistContext, amp: str,
             progress: bool = False, desc: str = "eval",
             bad_images: Optional[BadImages] = None) -> dict[str, float]:
    """Top-1 / top-5 accuracy (%) and mean cross-entropy over the whole split (all ranks).

    Batches as in :func:`train_one_epoch`. Each image is counted once: ``loader`` must shard the
    split without padding. Unreadable images raise BadImageError, or with ``bad_images.skip``
    are left out and counted. Returns top1, top5, loss, images (evaluated), bad_images and
    img_per_s (forward throughput incl. data loading).
    """
    bad_images = bad_images or BadImages(skip=False)
    model.eval()
    device = ctx.device
    # correct@1, correct@5, loss, count, unreadable
    sums = torch.zeros(5, dtype=torch.float64, device=device)
    bar = tqdm(total=len(loader), desc=desc, disable=not (progress and ctx.is_main),
               dynamic_ncols=True, leave=False)
    start = time.perf_counter()
    for images, targets, problems in loader:
        bad = bad_images.bad_rows(problems, desc)
        if bad:
            keep = torch.ones(len(problems), dtype=torch.bool)
            keep[bad] = False
            images, targets = images[keep], targets[keep]
            sums[4] += len(bad)
            if targets.numel() == 0:
                bar.update(1)
                continue
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(images)
        logits = logits.float()
        k = min(5, logits.shape[1])
        top = logits.topk(k, dim=1).indices
        hits = top.eq(targets[:, None])
        sums[0] += hits[:, 0].sum()
        sums[1] += hits.any(dim=1).sum()
        sums[2] += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").double()
        sums[3] += targets.shape[0]
        bar.update(1)
    bar.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    sums = all_reduce_sum(sums.cpu(), ctx)
    count = sums[3].item()
    if count == 0:
        raise ValueError("evaluate: the loader yielded no images")
    return {"top1": 100.0 * sums[0].item() / count, "top5": 100.0 * sums[1].item() / count,
            "loss": sums[2].item() / count, "images": int(count),
            "bad_images": int(sums[4].item()),
            "img_per_s": count / max(elapsed, 1e-9)}
