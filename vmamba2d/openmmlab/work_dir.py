"""Start, resume and repair an mmengine work dir the way :mod:`vmamba2d.runs.run_folder` does
for classification and MIL runs.

With :class:`~vmamba2d.openmmlab.safe_checkpoints.AtomicCheckpointHook`, ``work_dir/last_checkpoint`` is the
commit point: everything the checkpoint it names records is done. :func:`prepare_work_dir`, called
before the Runner is built, then

* deletes temporary files of killed atomic writes (``.<name>.tmp-<pid>``);
* without ``--resume``: refuses a work dir that already holds checkpoints or ``last_checkpoint``
  (the new run would overwrite them);
* ``--resume`` (auto): resumes from ``last_checkpoint`` after checking that the checkpoint is a complete,
  readable torch file; a damaged one (not a complete zip archive or failing a CRC check, e.g. truncated
  by plain mmengine) is set aside as ``<name>.corrupt-<time>`` (renamed, never deleted), with a warning
  naming it, for the newest readable older checkpoint, and the run is refused when there is none. An
  intact checkpoint that weights-only loading refuses stops the run in one line saying how to trust
  it; no checkpoint is ever deleted because it could not be loaded. A legacy (non-zip) torch file is
  read as such. Without ``last_checkpoint``, the run starts from scratch when the work dir is empty or
  holds only what a run that never committed left (see below); anything else is refused with the
  folder and its files named;
* ``--resume PATH``: resumes from that checkpoint after the same check (refused when unreadable);
  refused when the work dir holds another run (a ``last_checkpoint`` elsewhere) or, without
  ``last_checkpoint``, anything but what a never-committed run left (unless PATH is in that folder);
* a run killed before its first commit leaves its timestamped log folders, mmengine's copy of the
  config and, when the kill came during the first checkpoint, checkpoints (``iter_N.pth``,
  ``best_<metric>_iter_N.pth``) that no ``last_checkpoint`` names. Such a checkpoint counts as that
  run's own when it is a readable mmengine checkpoint whose ``meta.experiment_name`` ends in the
  timestamp of one of the work dir's log folders. Starting over (``--resume`` without a path, or a
  ``--resume PATH`` from elsewhere) deletes those checkpoints and the scalar records of that run
  (every step is trained again), so an automatic requeue that always passes ``--resume`` works
  after a kill at any moment;
* when resuming from the work dir's latest committed checkpoint, removes what a kill left *ahead* of it:
  checkpoints of later steps, best checkpoints the committed message hub does not name, and the lines
  of later steps in the runs' JSON scalar logs (``<timestamp>/vis_data/*.json``). The text logs
  (``<timestamp>/<timestamp>.log``) are kept as they are: a history of what ran.

Only rank 0 (``RANK`` unset or 0) writes or deletes.
"""
from __future__ import annotations

import json
import os
import os.path as osp
import pickle
import re
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from mmengine.config import Config

from vmamba2d.runs.checkpoint import atomic_write, is_temp_file, remove_stale_temp_files
from vmamba2d.runs.run_folder import RunFolderError
from vmamba2d.runs.run_lock import is_lock_file

from .checkpoint_safety import load_error_reason
from .safe_checkpoints import LAST_CHECKPOINT_NAME, write_last_checkpoint

_RUN_LOG_FOLDER = re.compile(r"^\d{8}_\d{6}$")  # mmengine's per-run timestamp folders


class UnreadableCheckpoint(RunFolderError):
    """A checkpoint file is missing, truncated, corrupted, refused or not an mmengine checkpoint
    (message says which)."""


class DamagedCheckpoint(UnreadableCheckpoint):
    """The file is not a complete zip archive (truncated, empty) or fails a CRC check: the only kind
    ``--resume`` sets aside (renamed, never deleted) to fall back to an older checkpoint."""


class RefusedCheckpoint(UnreadableCheckpoint):
    """An intact checkpoint that ``torch.load(weights_only=True)`` refuses (a Python object outside the
    allow-list): kept, and the run stops."""


def use_atomic_checkpoints(cfg: Config) -> None:
    """Replace the config's ``default_hooks.checkpoint`` CheckpointHook by AtomicCheckpointHook."""
    hook = (cfg.get("default_hooks") or {}).get("checkpoint")
    if hook is not None and hook.get("type") in ("CheckpointHook", "mmengine.CheckpointHook"):
        hook["type"] = "AtomicCheckpointHook"


def read_checkpoint_state(path: Path) -> Dict[str, Any]:
    """``{'meta': ..., 'runtime_info': ...}`` of an mmengine checkpoint, after checking it is complete.

    Raises:
        UnreadableCheckpoint naming the file, its size and what is wrong (missing, empty, truncated,
        failing a CRC check, or refused by ``torch.load``).
    """
    path = Path(path)
    if not path.is_file():
        raise UnreadableCheckpoint(f"checkpoint {path} does not exist")
    size = path.stat().st_size
    legacy = _is_legacy_torch_file(path)
    if not legacy:
        try:
            with zipfile.ZipFile(path) as archive:
                damaged = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            raise DamagedCheckpoint(
                f"checkpoint {path} ({size} bytes) is not a complete torch checkpoint ({error}); it was "
                "probably truncated by a killed write") from None
        if damaged is not None:
            raise DamagedCheckpoint(f"checkpoint {path} is corrupted: archive member {damaged} fails its CRC check")
    try:
        # a legacy file (torch.save(..., _use_new_zipfile_serialization=False)) cannot be memory-mapped
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=not legacy)
    except pickle.UnpicklingError as error:
        raise RefusedCheckpoint(
            f"checkpoint {path} is intact but weights-only loading refuses it ({load_error_reason(error)}); it is "
            "kept and nothing of it ran. If you trust it: load it with torch.load(..., weights_only=False), "
            "turn that object into plain values (e.g. str() of a Path), save it back and resume again") from None
    except Exception as error:  # any other reading problem: report it instead of failing inside the Runner
        if legacy:  # no archive to check: an unreadable legacy file counts as damaged
            raise DamagedCheckpoint(f"checkpoint {path} ({size} bytes) is a legacy (non-zip) torch file that "
                                    f"cannot be read ({load_error_reason(error)}); truncated?") from None
        raise UnreadableCheckpoint(f"checkpoint {path} cannot be loaded: {load_error_reason(error)}") from None
    if not isinstance(checkpoint, dict) or "meta" not in checkpoint:
        raise UnreadableCheckpoint(f"checkpoint {path} is not an mmengine training checkpoint (no 'meta')")
    message_hub = checkpoint.get("message_hub") or {}
    return {"meta": checkpoint["meta"], "runtime_info": dict(message_hub.get("runtime_info") or {})}


_LEGACY_TORCH_HEADER = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"  # pickle 2 + torch's magic


def _is_legacy_torch_file(path: Path) -> bool:
    """Whether ``path`` starts like a pre-1.6 (non-zip) ``torch.save`` file."""
    with open(path, "rb") as handle:
        return handle.read(len(_LEGACY_TORCH_HEADER)) == _LEGACY_TORCH_HEADER


def prepare_work_dir(cfg: Config, resume: Optional[str]) -> List[str]:
    """Check, repair and configure ``cfg.work_dir`` for a training run; see the module docstring.

    Args:
        cfg: the training config (``work_dir`` set); gets ``resume`` / ``load_from`` set (a new run
            keeps the config's ``load_from``, a resumed one loads the checkpoint it resumes) and the
            checkpoint hook switched to AtomicCheckpointHook.
        resume: None (new run), ``"auto"`` (continue the work dir's run) or a checkpoint path.

    Returns:
        Notes for the log (what was repaired or skipped).

    Raises:
        RunFolderError (a ValueError) naming the folder and files when the run cannot start as asked.
    """
    use_atomic_checkpoints(cfg)
    requested = cfg.get("load_from")  # weights a new run starts from (a resumed run loads its own)
    work_dir = Path(cfg.work_dir)
    checkpoint_dir = _checkpoint_dir(cfg)
    pattern = _checkpoint_pattern(cfg)
    main = int(os.environ.get("RANK", "0")) == 0
    notes: List[str] = []
    if main:
        for folder in dict.fromkeys((work_dir, checkpoint_dir)):
            notes += [f"removed temporary file {path} left by a killed write"
                      for path in remove_stale_temp_files(folder)]
    pointer = _read_pointer(work_dir)
    checkpoints = _step_files(checkpoint_dir, pattern)
    if resume is None:
        if pointer is not None or checkpoints:
            raise RunFolderError(
                f"--work-dir {work_dir} already holds a training run ({LAST_CHECKPOINT_NAME if pointer else ''}"
                f"{', ' if pointer and checkpoints else ''}{', '.join(p.name for _, p in checkpoints[-3:])}); "
                "pass --resume to continue it, or choose another --work-dir")
        cfg.resume, cfg.load_from = False, requested
        return notes
    if resume == "auto":
        if pointer is None:
            uncommitted = _uncommitted_run_checkpoints(work_dir, checkpoint_dir, pattern)
            cfg.resume, cfg.load_from = False, requested
            if main:
                notes += _discard_uncommitted_run(work_dir, uncommitted)
            return notes + ([f"{work_dir}: no committed checkpoint yet, starting from scratch"]
                            if work_dir.is_dir() else [])
        chosen, state, skipped, damaged = _newest_readable(pointer, checkpoints, pattern)
        if main:
            notes += [_set_aside(path) for path in damaged]
        notes += skipped
        committed = True
    else:
        chosen = Path(resume)
        state = read_checkpoint_state(chosen)
        committed = pointer is not None and _same_file(chosen, pointer)
        if pointer is not None and not committed and not _same_file(chosen.parent, checkpoint_dir):
            raise RunFolderError(
                f"--work-dir {work_dir} already holds another run (last checkpoint {pointer}); resuming "
                f"{chosen} there would overwrite it. Use --resume without a path, or another --work-dir")
        if pointer is None and not _same_file(chosen.parent, checkpoint_dir):
            uncommitted = _uncommitted_run_checkpoints(work_dir, checkpoint_dir, pattern)
            if main:
                notes += _discard_uncommitted_run(work_dir, uncommitted)
    cfg.resume, cfg.load_from = True, str(chosen)
    if main and committed:
        notes += _repair(work_dir, checkpoint_dir, pattern, chosen, state, pointer, _metrics_logged_by_epoch(cfg))
    return notes


# ---------------------------------------------------------------------- reading -----------------

def _checkpoint_dir(cfg: Config) -> Path:
    """Where the checkpoint hook writes: its ``out_dir`` / <work_dir name>, or the work_dir."""
    hook = (cfg.get("default_hooks") or {}).get("checkpoint") or {}
    out_dir = hook.get("out_dir")
    if out_dir and "://" not in str(out_dir):
        return Path(out_dir) / Path(str(cfg.work_dir).rstrip(os.sep)).name
    return Path(cfg.work_dir)


def _checkpoint_pattern(cfg: Config) -> re.Pattern:
    hook = (cfg.get("default_hooks") or {}).get("checkpoint") or {}
    template = hook.get("filename_tmpl") or ("epoch_{}.pth" if hook.get("by_epoch", True) else "iter_{}.pth")
    return re.compile("^" + re.escape(template).replace(r"\{\}", r"(\d+)") + "$")


def _metrics_logged_by_epoch(cfg: Config) -> bool:
    """Whether an epoch-based run's LoggerHook records validation metrics at step = epoch (mmengine's
    default) rather than step = iteration (``log_metric_by_epoch=False``)."""
    logger = (cfg.get("default_hooks") or {}).get("logger") or {}
    epoch_loop = "max_epochs" in (cfg.get("train_cfg") or {})  # what makes mmengine build EpochBasedTrainLoop
    return epoch_loop and bool(logger.get("log_metric_by_epoch", True))


def _read_pointer(work_dir: Path) -> Optional[str]:
    try:
        text = (work_dir / LAST_CHECKPOINT_NAME).read_text().strip()
    except OSError:
        return None
    return text or None


def _step_files(folder: Path, pattern: re.Pattern) -> List[Tuple[int, Path]]:
    """(step, path) of the folder's periodic checkpoints, by step."""
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = pattern.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _same_file(a, b) -> bool:
    return osp.realpath(str(a)) == osp.realpath(str(b))


def _newest_readable(pointer: str, checkpoints: List[Tuple[int, Path]], pattern: re.Pattern
                     ) -> Tuple[Path, Dict[str, Any], List[str], List[Path]]:
    """The checkpoint ``last_checkpoint`` names if readable, else the newest readable older one:
    (path, state, notes, damaged files passed over, to be set aside).

    Only missing and damaged files (:class:`DamagedCheckpoint`) are passed over; any other problem of a
    file on the way (refused by the allow-list, not an mmengine checkpoint) is raised, so that nothing a
    run saved is abandoned, and later removed as ahead of the commit, because it could not be loaded.
    """
    target = Path(pointer)
    damaged: List[Path] = []
    try:
        return target, read_checkpoint_state(target), [], damaged
    except DamagedCheckpoint as error:
        problem = str(error)
        damaged.append(target)
    except UnreadableCheckpoint as error:
        if target.exists():
            raise
        problem = str(error)
    match = pattern.match(target.name)
    limit = int(match.group(1)) if match else None
    reasons = [problem]
    for step, path in reversed(checkpoints):
        # step == limit: the same name in this folder (last_checkpoint may name a moved work dir)
        if (limit is not None and step > limit) or _same_file(path, target):
            continue
        try:
            state = read_checkpoint_state(path)
        except DamagedCheckpoint as error:
            reasons.append(str(error))
            damaged.append(path)
            continue
        return path, state, [f"the latest checkpoint is unusable ({problem}); resuming from {path} instead"], damaged
    raise UnreadableCheckpoint("--resume: no readable checkpoint to continue from: " + "; ".join(reasons)
                               + ". Resume from another file with --resume PATH, or start a new --work-dir")


def _set_aside(path: Path) -> str:
    """Rename a damaged checkpoint to ``<name>.corrupt-<time>`` (kept for inspection); returns a note."""
    target = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, target)
    return f"set the damaged checkpoint {path.name} aside as {target.name}"


def _uncommitted_run_checkpoints(work_dir: Path, checkpoint_dir: Path, pattern: re.Pattern) -> List[Path]:
    """The checkpoints a run killed before its first commit left in a work dir without ``last_checkpoint``.

    Allowed contents: timestamped log folders, ``.py`` config copies, temp files of killed writes, and
    checkpoints (``pattern`` or ``best_*_<pattern>``) whose ``meta.experiment_name`` ends in the
    timestamp of one of the log folders.

    Raises:
        RunFolderError naming the folder and every other entry (foreign files, unreadable checkpoints
        or checkpoints of another experiment), so that nothing of someone else's is deleted.
    """
    folders = [folder for folder in dict.fromkeys((work_dir, checkpoint_dir)) if folder.is_dir()]
    run_logs = {entry.name for entry in work_dir.iterdir()
                if entry.is_dir() and _RUN_LOG_FOLDER.match(entry.name)} if work_dir.is_dir() else set()
    best_pattern = re.compile("^best_.+_" + pattern.pattern.lstrip("^"))
    ours: List[Path] = []
    foreign: List[str] = []
    for folder in folders:
        for entry in sorted(folder.iterdir()):
            run_log = entry.is_dir() and _RUN_LOG_FOLDER.match(entry.name)
            config_copy = entry.is_file() and entry.suffix == ".py"  # mmengine's copy of the config
            if run_log or config_copy or is_temp_file(entry) or is_lock_file(entry):
                continue
            if entry.is_file() and (pattern.match(entry.name) or best_pattern.match(entry.name)):
                owner = _experiment_timestamp(entry)
                if owner is not None and owner in run_logs:
                    ours.append(entry)
                    continue
                if owner is None and not entry.exists():  # rank 0 of this launch deleted it meanwhile
                    continue
                foreign.append(f"{entry.name} (" + ("unreadable" if owner is None else f"of run {owner}, which "
                                                    "left no log folder here") + ")")
                continue
            foreign.append(entry.name + ("/" if entry.is_dir() else ""))
    if foreign:
        shown = ", ".join(foreign[:10]) + (f" (+{len(foreign) - 10} more)" if len(foreign) > 10 else "")
        raise RunFolderError(
            f"--resume: {work_dir} has no {LAST_CHECKPOINT_NAME} to continue from but is not empty "
            f"({shown}); refusing to start over there. Resume from a file with --resume PATH, choose "
            "another --work-dir, or empty the folder yourself")
    return ours


def _experiment_timestamp(path: Path) -> Optional[str]:
    """The run timestamp (``YYYYmmdd_HHMMSS``) ending a checkpoint's ``meta.experiment_name``; None when
    the file is unreadable or names no timestamp."""
    try:
        name = read_checkpoint_state(path)["meta"].get("experiment_name")
    except UnreadableCheckpoint:
        return None
    if not isinstance(name, str):
        return None
    timestamp = name[-15:]
    return timestamp if _RUN_LOG_FOLDER.match(timestamp) else None


def _discard_uncommitted_run(work_dir: Path, checkpoints: List[Path]) -> List[str]:
    """Delete a never-committed run's checkpoints and scalar records before starting over; returns notes."""
    notes = []
    for path in checkpoints:
        path.unlink()
        notes.append(f"removed {path.name}: written by a run killed before its first commit "
                     f"(no {LAST_CHECKPOINT_NAME})")
    return notes + _trim_scalar_logs(work_dir, 0)


# ---------------------------------------------------------------------- repair ------------------

def _repair(work_dir: Path, checkpoint_dir: Path, pattern: re.Pattern, chosen: Path, state: Dict[str, Any],
            pointer: Optional[str], metrics_by_epoch: bool) -> List[str]:
    """Remove what a kill left ahead of the committed checkpoint ``chosen``; returns notes."""
    notes = []
    match = pattern.match(chosen.name)
    if match:
        for step, path in _step_files(checkpoint_dir, pattern):
            if step > int(match.group(1)):
                path.unlink()
                notes.append(f"removed {path.name}: written after the committed checkpoint {chosen.name}")
    named_best = {osp.realpath(str(value)) for key, value in state["runtime_info"].items()
                  if key.startswith("best_ckpt") and isinstance(value, str)}
    for path in sorted(checkpoint_dir.glob("best_*.pth")):
        if osp.realpath(str(path)) not in named_best:
            path.unlink()
            notes.append(f"removed {path.name}: a best checkpoint the committed checkpoint {chosen.name} does "
                         "not name (uncommitted, or superseded)")
    if pointer is None or not _same_file(chosen, pointer):
        write_last_checkpoint(work_dir, str(chosen))
        notes.append(f"{LAST_CHECKPOINT_NAME} now names {chosen}")
    committed_iter = state["meta"].get("iter")
    committed_epoch = state["meta"].get("epoch") if metrics_by_epoch else None
    if isinstance(committed_iter, int):
        notes += _trim_scalar_logs(work_dir, committed_iter,
                                   committed_epoch if isinstance(committed_epoch, int) else None)
    return notes


def _trim_scalar_logs(work_dir: Path, committed_iter: int, committed_epoch: Optional[int] = None) -> List[str]:
    """Drop JSON-lines records of steps after the commit (and torn lines) from earlier runs'
    ``<timestamp>/vis_data/*.json`` scalar logs.

    Training records (they carry an ``iter`` key) count ``step`` in iterations. Validation records
    (no ``iter`` key) count it in epochs when ``committed_epoch`` is given (mmengine's LoggerHook
    default, ``log_metric_by_epoch=True``), else in iterations.
    """
    notes = []
    for path in sorted(work_dir.glob("*/vis_data/*.json")):
        if not _RUN_LOG_FOLDER.match(path.parent.parent.name):
            continue
        kept, dropped = [], 0
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                by_epoch = committed_epoch is not None and "iter" not in record
                if record["step"] > (committed_epoch if by_epoch else committed_iter):
                    dropped += 1
                    continue
            kept.append(line + "\n")
        if dropped:
            payload = "".join(kept).encode()
            atomic_write(path, lambda handle: handle.write(payload))
            notes.append(f"dropped {dropped} record(s) after iteration {committed_iter} from "
                         f"{path.relative_to(work_dir)}")
    return notes
