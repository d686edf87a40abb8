"""One MIL training epoch and one evaluation pass (one slide per step, as in the paper).

Classification: cross-entropy on the (1, C) logits; metrics accuracy, macro F1 and macro
one-vs-rest AUC. Survival: discrete-time NLL with censoring; metric the C-index of the risk
-sum(S) against the patients' times.

Training loss: the weighted sum of the model's loss terms (``model.loss_weights``, overridden by
``loss_weights``): ``"slide"`` is the task loss of the logits, the other terms come from
``model.auxiliary_losses`` (e.g. CLAM's instance loss). Evaluation reports the task loss only, so
losses compare across models.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from ..runs import loader_generator
from ..runs.options import autocast
from .metrics import classification_metrics, concordance_index
from .survival import survival_nll_loss, survival_risk

def epoch_order(count: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """Training order of ``count`` slides in ``epoch``: a permutation drawn from a generator
    seeded by (seed, epoch) — so a resumed run sees the same order — or the table order."""
    if not shuffle:
        return list(range(count))
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(count, generator=generator).tolist()


def _single(record: Any) -> Any:
    return record


def slide_loader(dataset: Dataset, order: Sequence[int], workers: int, seed: int) -> DataLoader:
    """Loader yielding one ``SlideRecord`` at a time in ``order``; it draws nothing from the
    global torch generator (whose state the checkpoints carry)."""
    return DataLoader(dataset, batch_size=None, sampler=list(order), num_workers=workers,
                      collate_fn=_single, generator=loader_generator(seed))


def task_loss_fn(record: Any, task: str, alpha: float, device: torch.device
                 ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The task's loss for one slide as a function of (1, C) logits: cross-entropy against the
    slide's class (classification) or the censored NLL of its time bin (survival)."""
    label = torch.tensor([record.label], device=device)
    if task == "classification":
        return lambda logits: F.cross_entropy(logits.float(), label)
    censorship = torch.tensor([record.censorship], device=device)
    return lambda logits: survival_nll_loss(logits.float(), label, censorship, alpha=alpha)


def slide_loss(output: dict[str, torch.Tensor], record: Any, task: str, alpha: float,
               device: torch.device) -> torch.Tensor:
    """Task loss of one slide's ``output["logits"]``: CE (classification) or the censored NLL (survival)."""
    return task_loss_fn(record, task, alpha, device)(output["logits"])


def resolve_loss_weights(model: torch.nn.Module, overrides: Optional[dict[str, float]]) -> dict[str, float]:
    """The model's default loss-term weights updated with ``overrides``; unknown terms and negative
    or non-numeric weights raise a ValueError naming the model's terms."""
    weights = dict(model.loss_weights)
    for name, value in (overrides or {}).items():
        if name not in weights:
            raise ValueError(f"loss term {name!r} is not one of {getattr(model, 'model_name', 'the model')}'s "
                             f"terms {sorted(weights)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"weight of loss term {name!r} must be a number >= 0, got {value!r}")
        weights[name] = float(value)
    return weights


def training_loss(model: torch.nn.Module, output: dict[str, torch.Tensor], record: Any, task: str,
                  alpha: float, device: torch.device, weights: dict[str, float]
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted sum of the model's loss terms for one slide: (total, value of each term)."""
    task_loss = task_loss_fn(record, task, alpha, device)
    terms = {"slide": task_loss(output["logits"]),
             **model.auxiliary_losses(output, record.label, task_loss)}
    if set(terms) != set(weights):
        raise ValueError(f"the model returned loss terms {sorted(terms)}, expected {sorted(weights)}")
    total = sum(weights[name] * value for name, value in terms.items())
    return total, {name: value.item() for name, value in terms.items()}


def train_one_epoch(*, model: torch.nn.Module, dataset: Dataset, order: Sequence[int],
                    optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, task: str,
                    alpha: float, device: torch.device, amp: str, workers: int, seed: int,
                    epoch: int, progress: bool,
                    loss_weights: Optional[dict[str, float]] = None) -> dict[str, float]:
    """One pass over ``dataset`` in ``order``, one optimizer step per slide.

    ``loss_weights``: weights of the model's loss terms (None: the model's defaults).
    Returns ``train_loss`` (mean over slides of the weighted total), ``lr`` (during the epoch),
    ``train_seconds`` and ``train_slides_per_s``; with several loss terms also
    ``train_loss_<term>`` (mean of each term, unweighted).
    """
    model.train()
    weights = resolve_loss_weights(model, loss_weights)
    loss_sum, count = 0.0, 0
    term_sums: dict[str, float] = {}
    lr = max(group["lr"] for group in optimizer.param_groups)
    bar = tqdm(total=len(order), desc=f"epoch {epoch}", disable=not progress, leave=False,
               dynamic_ncols=True)
    start = time.perf_counter()
    for record in slide_loader(dataset, order, workers, seed):
        record = record.to(device)
        with autocast(device, amp):
            output = model(record.features, record.coords, grid_size=record.grid)
        loss, terms = training_loss(model, output, record, task, alpha, device, weights)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        value = loss.item()
        if not math.isfinite(value):
            raise FloatingPointError(f"training loss is {value} on slide {record.slide_id!r} in "
                                     f"epoch {epoch}; the last checkpoint is untouched")
        loss_sum += value
        for name, term in terms.items():
            term_sums[name] = term_sums.get(name, 0.0) + term
        count += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss_sum / count:.4f}")
    bar.close()
    seconds = time.perf_counter() - start
    stats = {"train_loss": loss_sum / max(count, 1), "lr": lr, "train_seconds": seconds,
             "train_slides_per_s": count / max(seconds, 1e-9)}
    if len(weights) > 1:
        stats.update({f"train_loss_{name}": total / max(count, 1) for name, total in term_sums.items()})
    return stats


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: Dataset, *, task: str, num_classes: int,
             alpha: float, device: torch.device, amp: str, workers: int, seed: int = 0,
             progress: bool = False, desc: str = "eval") -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Metrics of ``model`` on every slide of ``dataset`` and the per-slide predictions.

    Returns (metrics, predictions): classification metrics ``loss``, ``acc``, ``f1``, ``auc``
    (+ ``auc_classes``, ``n``), predictions ``slide_id``, ``label``, ``prob_<k>``; survival
    metrics ``loss``, ``cindex``, ``n``, predictions ``case_id``, ``slide_id``, ``time``,
    ``censorship``, ``bin``, ``risk``.
    """
    model.eval()
    losses, labels, outputs, predictions = [], [], [], []
    bar = tqdm(total=len(dataset), desc=desc, disable=not progress, leave=False,
               dynamic_ncols=True)
    for record in slide_loader(dataset, range(len(dataset)), workers, seed):
        record = record.to(device)
        with autocast(device, amp):
            output = model(record.features, record.coords, grid_size=record.grid)
        logits = output["logits"].float()
        losses.append(slide_loss(output, record, task, alpha, device).item())
        labels.append(record.label)
        if task == "classification":
            probs = torch.softmax(logits, dim=1)[0].cpu().numpy().astype(np.float64)
            outputs.append(probs)
            predictions.append({"slide_id": record.slide_id, "label": record.label,
                                **{f"prob_{k}": float(p) for k, p in enumerate(probs)}})
        else:
            risk = float(survival_risk(logits)[0])
            outputs.append(risk)
            predictions.append({"case_id": record.case_id, "slide_id": record.slide_id,
                                "time": record.time, "censorship": record.censorship,
                                "bin": record.label, "risk": risk})
        bar.update(1)
    bar.close()
    if not losses:
        raise ValueError(f"{desc}: the dataset is empty")
    metrics: dict[str, float] = {"loss": float(np.mean(losses))}
    if task == "classification":
        if np.asarray(outputs).shape[1] != num_classes:
            raise ValueError(f"model gives {np.asarray(outputs).shape[1]} classes, expected "
                             f"{num_classes}")
        metrics.update(classification_metrics(np.asarray(labels, dtype=np.int64),
                                              np.stack(outputs)))
    else:
        event = np.array([p["censorship"] == 0 for p in predictions])
        times = np.array([p["time"] for p in predictions], dtype=np.float64)
        metrics["cindex"] = concordance_index(event, times, np.asarray(outputs))
        metrics["n"] = len(predictions)
    return metrics, predictions


def selection_value(metrics: dict[str, float], metric: str) -> float:
    """Score to maximise for ``metric`` (the loss is negated; NaN ranks lowest)."""
    value = metrics[metric]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return -math.inf
    return -value if metric == "loss" else value


def select_epoch(history: Sequence[dict[str, Any]], select: str, metric: str) -> Optional[int]:
    """Index into ``history`` of the chosen epoch: the last one (``select="last"``), or the best
    ``val_<metric>`` with later epochs winning ties (official ``>=``). None for an empty history."""
    if not history:
        return None
    if select == "last":
        return len(history) - 1
    best, best_index = -math.inf, 0
    for index, record in enumerate(history):
        value = selection_value(record["val"], metric)
        if value >= best:
            best, best_index = value, index
    return best_index
