"""Crash-safe training checkpoints: atomic writes and RNG state capture / restore.

Files are first written to a temporary file ``.<name>.tmp-<pid>`` in the same folder, fsynced and
then renamed with ``os.replace``, so a crash never leaves a truncated file behind. A process killed
mid-write (SIGKILL, power loss) can leave the temporary file itself; :func:`remove_stale_temp_files`
deletes those on the next start.
"""
from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional

import numpy as np
import torch

TEMP_MARK = ".tmp-"


def temp_path_for(path: Path) -> Path:
    """The temporary file :func:`atomic_write` uses for ``path`` in this process."""
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}")


def is_temp_file(path: Path) -> bool:
    """True for a name :func:`temp_path_for` produces (``.<name>.tmp-<digits>``)."""
    name = path.name
    head, mark, pid = name.rpartition(TEMP_MARK)
    return name.startswith(".") and bool(mark) and len(head) > 1 and pid.isdigit()


def fsync_folder(folder: Path) -> None:
    """Make a rename / unlink in ``folder`` durable (no-op where folders cannot be opened)."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(handle)`` on a temp file next to ``path``, fsync, then ``os.replace`` it."""
    path = Path(path)
    tmp = temp_path_for(path)
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_folder(path.parent)


def atomic_second_name(source: Path, target: Path) -> None:
    """Give the file ``source`` the second name ``target`` (replacing any file there), leaving
    ``source`` in place: a hard link, or, where the file system has none (e.g. FAT, some network
    file systems), a fsynced copy. Via a temporary name + ``os.replace``, so ``target`` is
    complete or absent after a kill."""
    source, target = Path(source), Path(target)
    tmp = temp_path_for(target)
    try:
        try:
            os.link(source, tmp)
        except OSError:  # no hard links on this file system: same content, one more write
            shutil.copyfile(source, tmp)
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` via a temp file in the same folder + fsync + ``os.replace``."""
    atomic_write(Path(path), lambda handle: torch.save(obj, handle))


STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
"""Write failures of the storage itself (disk full, quota, read-only file system)."""


def storage_error_message(error: OSError, folder: Path | str) -> Optional[str]:
    """One line for a write that failed because of the storage (:data:`STORAGE_ERRNOS`), naming
    ``folder`` and the file; None for any other error. Atomic writes leave the previous files as
    they were, so the run continues from its last commit once there is room."""
    if error.errno not in STORAGE_ERRNOS:
        return None
    where = f" ({error.filename})" if error.filename else ""
    return (f"cannot write into {folder}: {error.strerror or os.strerror(error.errno)}{where}; "
            "what was saved before is intact: make room (or make the folder writable), then "
            "continue the run with its resume option")


def remove_stale_temp_files(folder: Path) -> list[Path]:
    """Delete temporary files that killed :func:`atomic_write` calls left in ``folder``.

    Only call this when no other process writes into ``folder``. Returns the removed paths.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and is_temp_file(entry):
            entry.unlink()
            removed.append(entry)
    if removed:
        fsync_folder(folder)
    return removed


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states, as weights_only-loadable values."""
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": np_kind, "keys": torch.from_numpy(np_keys.astype(np.int64)),
                  "pos": int(np_pos), "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    np_state = state["numpy"]
    np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype(np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
