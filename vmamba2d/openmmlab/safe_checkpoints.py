"""Crash-safe checkpoints for mmengine's Runner: ``AtomicCheckpointHook``.

mmengine's ``CheckpointHook`` writes ``iter_*.pth`` / ``best_*.pth`` with a plain ``open(path, 'wb')``
(``LocalBackend.put``) and ``last_checkpoint`` with ``open(path, 'w')``, deletes the oldest / the
previous best checkpoint *before* writing its replacement, and saves ``iter_N.pth`` before the
validation of iteration N. A kill can so leave a truncated checkpoint that ``--resume`` picks up, no
complete checkpoint at all (``max_keep_ckpts=1``), or a best checkpoint behind the latest one.

``AtomicCheckpointHook`` (registered in mmengine's HOOKS, which mmseg's and mmdet's registries
inherit; ``type='AtomicCheckpointHook'``) keeps the options and file names of ``CheckpointHook`` and
commits step N (an iteration of an iteration-based loop, an epoch of an epoch-based one) in this order:

1. after training step N, when a validation follows, wait for it;
2. a new best checkpoint (``save_best``) is written; the previous best stays on disk;
3. ``iter_N.pth`` / ``epoch_N.pth`` is written (its message hub records the new best);
4. ``last_checkpoint`` is replaced - the *commit point*: step N is done when it names that file;
5. checkpoints beyond ``max_keep_ckpts`` and the superseded best checkpoint are deleted.

Every file goes through :class:`AtomicLocalBackend` (temp file in the same folder, fsync,
``os.replace``), so a kill leaves at most a ``.<name>.tmp-<pid>`` file and files *ahead* of the commit
(a best or step checkpoint of an uncommitted step), never a truncated checkpoint or a best checkpoint
behind ``last_checkpoint``. :func:`vmamba2d.openmmlab.work_dir.prepare_work_dir` repairs that on the
next start. When the best score improves at a step without a scheduled checkpoint, the step's
checkpoint is written too (mmengine does the same), so the new best is committed.

mmengine does not checkpoint random number generators. The hook adds the torch generator states
(CPU, and the current CUDA device's once CUDA is initialised) to every checkpoint under
``'torch_rng_state'`` and, in a single-process run resumed at iteration > 0, restores them before
training continues, so dropout / drop-path draw what the uninterrupted run drew. Data augmentation
(numpy, in the main process or in mmengine-seeded loader workers) is replayed by mmengine's own
resume, which re-reads the batches it skips.
"""
from __future__ import annotations

import bisect
import os.path as osp
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch
from mmengine.dist import get_world_size, is_main_process
from mmengine.fileio import LocalBackend, register_backend
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

from vmamba2d.runs.checkpoint import atomic_write

ATOMIC_BACKEND = "vmamba2d_atomic_local"
RNG_STATE_KEY = "torch_rng_state"
LAST_CHECKPOINT_NAME = "last_checkpoint"


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend whose ``put`` / ``put_text`` write atomically (temp + fsync +
    ``os.replace``); a reader sees the old file or the complete new one."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        path = Path(filepath)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda handle: handle.write(obj))

    def put_text(self, obj: str, filepath: Union[str, Path], encoding: str = "utf-8") -> None:
        self.put(obj.encode(encoding), filepath)


def register_atomic_backend() -> None:
    """Make ``backend_args=dict(backend='vmamba2d_atomic_local')`` available to mmengine's fileio."""
    register_backend(ATOMIC_BACKEND, AtomicLocalBackend, force=True)


def write_last_checkpoint(work_dir: Union[str, Path], checkpoint_path: str) -> None:
    """Atomically point ``work_dir/last_checkpoint`` (mmengine's resume pointer) at ``checkpoint_path``."""
    atomic_write(Path(work_dir) / LAST_CHECKPOINT_NAME, lambda handle: handle.write(checkpoint_path.encode()))


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` with atomic writes and a commit order that never leaves the best checkpoint
    behind ``last_checkpoint`` (see the module docstring). Arguments are those of ``CheckpointHook``;
    ``backend_args`` defaults to the atomic local backend for local ``out_dir`` (None or no ``://``)."""

    def __init__(self, *args, backend_args: Optional[dict] = None, **kwargs) -> None:
        out_dir = kwargs.get("out_dir")
        if backend_args is None and kwargs.get("file_client_args") is None and (
                out_dir is None or "://" not in str(out_dir)):
            backend_args = {"backend": ATOMIC_BACKEND}
        super().__init__(*args, backend_args=backend_args, **kwargs)
        self._save_pending = False
        self._superseded_best: List[str] = []
        self._loaded_rng: Optional[Dict[str, Any]] = None

    # ------------------------------------------------------------------ RNG streams ----------

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state()
        checkpoint[RNG_STATE_KEY] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        self._loaded_rng = checkpoint.get(RNG_STATE_KEY)

    def before_train(self, runner) -> None:
        super().before_train(runner)
        state, self._loaded_rng = self._loaded_rng, None
        if state is None or runner.iter == 0:  # nothing saved, or weights loaded for a new run (load_from)
            return
        if get_world_size() > 1:
            runner.logger.warning("resumed a distributed run: the torch generators of each rank start anew "
                                  "(only single-process runs restore them)")
            return
        torch.set_rng_state(state["cpu"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])

    # ------------------------------------------------------------------ when to save ---------

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self.by_epoch:
            return
        due = self.every_n_train_iters(runner, self.interval, self.save_begin) or (
            self.save_last and self.is_last_train_iter(runner))
        self._save_or_defer(runner, due, "iterations")

    def after_train_epoch(self, runner) -> None:
        if not self.by_epoch:
            return
        due = self.every_n_epochs(runner, self.interval, self.save_begin) or (
            self.save_last and self.is_last_train_epoch(runner))
        self._save_or_defer(runner, due, "epochs")

    def _save_or_defer(self, runner, due: bool, unit: str) -> None:
        """Save the step's checkpoint now, or after the validation that follows the step."""
        if not due:
            return
        if _validation_follows(runner, self.by_epoch):
            self._save_pending = True  # committed after the validation (and best) of this step
            return
        done = runner.epoch + 1 if self.by_epoch else runner.iter + 1
        runner.logger.info(f"Saving checkpoint at {done} {unit}")
        self._save_checkpoint(runner)

    def after_val_epoch(self, runner, metrics: Dict[str, float]) -> None:
        best_updated = False
        if metrics:
            best_updated = self._save_best_checkpoint(runner, metrics)
        else:
            runner.logger.warning("the validation returned no metrics: the best checkpoint is not updated")
        if not (self._save_pending or best_updated):
            return
        # the training loop has counted the step already: runner.epoch / runner.iter is N
        step = runner.epoch if self.by_epoch else runner.iter
        runner.logger.info(f"Saving checkpoint at {step} {'epochs' if self.by_epoch else 'iterations'}")
        self._save_checkpoint_with_step(runner, step, dict(epoch=runner.epoch, iter=runner.iter))
        self._save_pending = False

    # ------------------------------------------------------------------ writing --------------

    def _save_checkpoint_with_step(self, runner, step: int, meta: dict) -> None:
        dropped: List[int] = []
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                dropped.append(self.keep_ckpt_ids.popleft())
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info("keep_ckpt_ids", list(self.keep_ckpt_ids))
        filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, filename)
        runner.message_hub.update_info("last_ckpt", self.last_ckpt)
        runner.save_checkpoint(self.out_dir, filename, self.file_client_args,
                               save_optimizer=self.save_optimizer,
                               save_param_scheduler=self.save_param_scheduler, meta=meta,
                               by_epoch=self.by_epoch, backend_args=self.backend_args, **self.args)
        if not is_main_process():
            return
        write_last_checkpoint(runner.work_dir, self.last_ckpt)  # the commit point
        for old_step in dropped:
            self._remove(self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(old_step)))
        for path in self._superseded_best:
            self._remove(path)
            runner.logger.info(f"The previous best checkpoint {path} is removed")
        self._superseded_best.clear()

    def _remove(self, path: str) -> None:
        if self.file_backend.isfile(path):
            self.file_backend.remove(path)
        elif self.file_backend.isdir(path):  # deepspeed checkpoints are folders
            self.file_backend.rmtree(path)

    def _save_best_checkpoint(self, runner, metrics: Dict[str, float]) -> bool:
        """Write a best checkpoint for every key indicator that improved; the replaced ones are deleted
        after the next commit. Returns whether any improved."""
        if not self.save_best:
            return False
        step = runner.epoch if self.by_epoch else runner.iter
        checkpoint_name = self.filename_tmpl.format(step)
        if "auto" in self.key_indicators:
            self._init_rule(self.rules, [list(metrics.keys())[0]])
        single = len(self.key_indicators) == 1
        updated = False
        for key_indicator, rule in zip(self.key_indicators, self.rules):
            score = metrics[key_indicator]
            score_key = "best_score" if single else f"best_score_{key_indicator}"
            path_key = "best_ckpt" if single else f"best_ckpt_{key_indicator}"
            best = runner.message_hub.runtime_info.get(score_key, self.init_value_map[rule])
            if score is None or not self.is_better_than[key_indicator](score, best):
                continue
            updated = True
            runner.message_hub.update_info(score_key, score)
            previous = self.best_ckpt_path if single else self.best_ckpt_path_dict[key_indicator]
            best_name = f"best_{key_indicator}_{checkpoint_name}".replace("/", "_")
            best_path = self.file_backend.join_path(self.out_dir, best_name)
            if single:
                self.best_ckpt_path = best_path
            else:
                self.best_ckpt_path_dict[key_indicator] = best_path
            runner.message_hub.update_info(path_key, best_path)
            runner.save_checkpoint(self.out_dir, filename=best_name, file_client_args=self.file_client_args,
                                   save_optimizer=False, save_param_scheduler=False,
                                   meta=dict(epoch=runner.epoch, iter=runner.iter), by_epoch=False,
                                   backend_args=self.backend_args)
            if previous and osp.normpath(previous) != osp.normpath(best_path):
                self._superseded_best.append(previous)
            runner.logger.info(f"The best checkpoint with {score:0.4f} {key_indicator} at {step} "
                               f"{'epoch' if self.by_epoch else 'iter'} is saved to {best_name}.")
        return updated


def _validation_follows(runner, by_epoch: bool) -> bool:
    """Whether mmengine's training loop validates right after the current training step (an epoch of
    ``EpochBasedTrainLoop`` or an iteration of ``IterBasedTrainLoop``; same rule as the loop, evaluated
    before it increments its counter)."""
    loop = runner.train_loop
    expected = EpochBasedTrainLoop if by_epoch else IterBasedTrainLoop
    if not isinstance(loop, expected) or runner.val_loop is None:
        return False
    done = runner.epoch + 1 if by_epoch else runner.iter + 1
    last = loop.max_epochs if by_epoch else loop.max_iters
    interval = loop.dynamic_intervals[bisect.bisect(loop.dynamic_milestones, done + 1) - 1]
    return done >= loop.val_begin and (done % interval == 0 or done == last)
