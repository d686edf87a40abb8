"""A second, real process holding a run folder's lock (vmamba2d.runs.run_lock) for tests."""
from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]
_HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from vmamba2d.runs.run_lock import RunFolderLock
RunFolderLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def lock_held_by_another_process(folder: Path) -> Iterator[subprocess.Popen]:
    """Start a process that locks ``folder`` and keeps it; yields it once it holds the lock,
    kills it (SIGKILL: the kernel releases the lock) on exit."""
    child = subprocess.Popen([sys.executable, "-c", _HOLDER.format(root=str(ROOT)), str(folder)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "locked", f"the lock holder did not start (exit {child.poll()})"
        yield child
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
