"""One run per folder: an exclusive OS lock on a run folder, held for the whole run.

Every training CLI (ImageNet, MIL, seg, det) takes :class:`RunFolderLock` on its output folder
before it writes anything there. The lock is ``fcntl.flock`` on the file ``.run.lock`` inside the
folder; the kernel releases it when the process ends, however it ends (a ``kill -9`` leaves no
stale lock behind), so the file itself carries no state: its content is only the holder's PID,
shown to a second run, which is refused with :class:`RunFolderBusy`. The file is removed when the
lock is released; a killed run leaves it behind, unlocked, and run folders ignore it.

A folder the lock had to create and that is empty when the lock is released (the run was refused
before writing anything) is removed again, with the parents created for it.
"""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType
from typing import Optional, Type

from .run_folder import LOCK_NAME, RunFolderError


class RunFolderBusy(RunFolderError):
    """Another process holds the run folder's lock (message names the folder and the PID)."""


def is_lock_file(path: Path) -> bool:
    """True for the lock file of :class:`RunFolderLock` (not part of a run's contents)."""
    return Path(path).name == LOCK_NAME


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        return "another process"
    return f"process {text}" if text.isdigit() else "another process"


class RunFolderLock:
    """Exclusive lock on ``folder`` (created when absent); use as a context manager.

    Args:
        folder: the run folder.
        option: the command-line option that named it, for messages (``"--output"``).

    Raises (on entering):
        RunFolderBusy when another process holds the lock; RunFolderError when the folder cannot be
        created or the lock file cannot be opened (read-only file system, no permission, a file in
        the way). Each message is one line naming the folder.
    """

    def __init__(self, folder: Path | str, option: str = "--output") -> None:
        self.folder = Path(folder)
        self.option = option
        self._fd: Optional[int] = None
        self._created: list[Path] = []

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    def acquire(self) -> None:
        """Take the lock (no waiting)."""
        if self._fd is not None:
            return
        self._make_folder()
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                self._remove_created()
                raise RunFolderError(f"{self.option} {self.folder}: cannot create the lock file "
                                     f"{LOCK_NAME} ({error.strerror or error})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                os.close(fd)
                if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunFolderError(f"{self.option} {self.folder}: cannot lock {LOCK_NAME} "
                                         f"({error.strerror or error})") from None
                raise RunFolderBusy(
                    f"{self.option} {self.folder} is in use by another run ({_holder(self.path)} "
                    "holds its lock); wait for it to end, or choose another "
                    f"{self.option}") from None
            # the holder before us may have removed the file while we opened it: lock the one
            # that is there now
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file (still holding the lock: a process that opened it meanwhile finds it
        gone and retries), release the lock, and remove the folder again when this lock created it
        and it is empty."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink()
            if self._created and not any(self.folder.iterdir()):
                self._remove_created()
        except OSError:
            pass
        finally:
            os.close(fd)

    def _make_folder(self) -> None:
        missing = []
        folder = self.folder
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise RunFolderError(f"{self.option} {self.folder}: a file is in the way (a folder "
                                 "is needed)") from None
        except OSError as error:
            raise RunFolderError(f"{self.option} {self.folder} cannot be created "
                                 f"({error.strerror or error})") from None
        self._created = missing

    def _remove_created(self) -> None:
        for folder in self._created:  # innermost first
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []

    def __enter__(self) -> "RunFolderLock":
        self.acquire()
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], error: Optional[BaseException],
                 trace: Optional[TracebackType]) -> None:
        self.release()
