"""The run-folder protocol: one atomic commit point per epoch, repaired on the next start.

A run folder holds

* ``run.json`` - marker written when the run starts: format, script, starting checkpoint;
* ``last.pth`` - everything needed to continue after the last finished epoch. Replacing it
  (atomically, :func:`~vmamba2d.runs.checkpoint.atomic_torch_save`) is the *commit point*:
  an epoch is done exactly when ``last.pth`` says so;
* ``best.pth`` - the best epoch's weights so far, as recorded in ``last.pth``;
* ``metrics.jsonl`` - one JSON object per line, each with the ``epoch`` (0-based) it belongs to;
* whatever else the script keeps there (logs, config, TensorBoard events) - not managed here.

Committing epoch ``e`` (:meth:`RunFolder.commit`) writes, in this order:

1. if ``e`` is a new best: keep the current ``best.pth`` also as ``.best.pth.prev-<e+1>`` (a
   hard link, or a copy where the file system has none; ``best.pth`` itself stays in place) or,
   when there is none yet, create the empty ``.best.pth.none-<e+1>``; then replace ``best.pth``
   atomically with the new one, so a run that had a ``best.pth`` always has one;
2. append the epoch's metrics lines to ``metrics.jsonl`` (flushed and fsynced);
3. replace ``last.pth`` - the commit point; the checkpoint must say that ``e + 1`` epochs are done;
4. delete the ``.best.pth.prev-`` / ``.none-`` file of step 1.

So ``best.pth`` and ``metrics.jsonl`` are never behind ``last.pth``: a kill before step 3 can
only leave them *ahead* of it (an epoch that will be trained again), and a kill during any write
leaves at most a temporary ``.<name>.tmp-<pid>`` file. :meth:`RunFolder.repair`, run on every
start with the number of epochs ``last.pth`` holds (0 without one), undoes exactly that: it
deletes temporary files, puts back the ``best.pth`` an uncommitted epoch replaced (or removes
the one it created), drops metrics lines of uncommitted epochs and a torn last line, and
deletes the step-1 files of finished commits. Repair is idempotent, so a kill during repair is
repaired by the next start.

Starting (:meth:`RunFolder.plan_start`, read-only, then :meth:`RunFolder.start`):

* no resume: the folder must be absent or empty;
* ``resume="auto"``: continue from ``last.pth`` when there is one; start when the folder is absent
  or empty; restart a run of the same script that never committed an epoch (it holds only the
  marker and files an uncommitted first epoch leaves, and nothing proving a commit); anything
  else is refused with the folder and its files named;
* ``resume=<path>``: continue from that checkpoint into an absent, empty or never-committed
  folder, or into its own folder when ``<path>`` is the folder's ``last.pth``.

Only one process (rank 0 of a distributed job) may call the writing methods.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .checkpoint import (atomic_second_name, atomic_torch_save, atomic_write, fsync_folder,
                         is_temp_file, remove_stale_temp_files)

RUN_FOLDER_FORMAT = "vmamba2d.run-folder/1"
LAST_NAME = "last.pth"
BEST_NAME = "best.pth"
METRICS_NAME = "metrics.jsonl"
MARKER_NAME = "run.json"
LOCK_NAME = ".run.lock"  # vmamba2d.runs.run_lock: held while a run writes here
_BEST_BACKUP = f".{BEST_NAME}.prev-"  # + epochs done after the commit that replaced best.pth
_BEST_ABSENT = f".{BEST_NAME}.none-"  # + epochs done after the commit that created best.pth


class RunFolderError(ValueError):
    """The run folder cannot be used as asked (message names the folder, files and options)."""


@dataclass(frozen=True)
class StartPlan:
    """What :meth:`RunFolder.start` will do; decided without writing anything.

    ``resume_from``: checkpoint to load (None: from scratch). ``continues``: it is this folder's
    own ``last.pth`` (its epoch count is then the committed count for :meth:`RunFolder.start`).
    ``notes``: what the user should be told (e.g. that an uncommitted run is restarted).
    """

    resume_from: Optional[Path]
    continues: bool
    notes: tuple[str, ...] = ()


def parse_metrics_lines(text: str) -> tuple[list[dict[str, Any]], int]:
    """JSON-lines text -> (records, number of unparsable lines skipped, e.g. a torn last line)."""
    records, skipped = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            skipped += 1
    return records, skipped


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` file, in order (unparsable lines skipped)."""
    return parse_metrics_lines(Path(path).read_text())[0]


def _describe_entries(entries: Sequence[Path], limit: int = 10) -> str:
    names = [entry.name + ("/" if entry.is_dir() else "") for entry in entries]
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def _staging_suffix(name: str) -> Optional[tuple[str, int]]:
    """('prev' | 'none', epochs) for a step-1 file name of :meth:`RunFolder.commit`, else None."""
    for prefix, kind in ((_BEST_BACKUP, "prev"), (_BEST_ABSENT, "none")):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return kind, int(name[len(prefix):])
    return None


class RunFolder:
    """One training run's folder; see the module docstring for the protocol.

    Args:
        path: the run folder (created by :meth:`start`).
        script: who writes it (e.g. ``"classification/train.py"``); a never-committed folder is
            only restarted by the same script.
        output_option / resume_option: the command-line options named in error messages.
    """

    def __init__(self, path: Path | str, *, script: str, output_option: str = "--output",
                 resume_option: str = "--resume") -> None:
        self.path = Path(path)
        self.script = script
        self.output_option = output_option
        self.resume_option = resume_option

    @property
    def last_path(self) -> Path:
        return self.path / LAST_NAME

    @property
    def best_path(self) -> Path:
        return self.path / BEST_NAME

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_NAME

    @property
    def marker_path(self) -> Path:
        return self.path / MARKER_NAME

    # ------------------------------------------------------------------ start ---------------

    def plan_start(self, resume: Optional[str]) -> StartPlan:
        """Decide how to start for ``resume`` (None, ``"auto"`` or a checkpoint path).

        Reads only. Raises RunFolderError for anything that would overwrite or silently
        abandon another run.
        """
        out, res = self.output_option, self.resume_option
        if self.path.exists() and not self.path.is_dir():
            raise RunFolderError(f"{out} {self.path} exists and is not a folder")
        # temporary files of killed writes do not count (start() deletes them), nor the lock
        entries = (sorted(e for e in self.path.iterdir()
                          if not is_temp_file(e) and e.name != LOCK_NAME)
                   if self.path.is_dir() else [])
        has_last = self.last_path.is_file()
        if resume is None:
            if not entries:
                return StartPlan(None, False)
            if has_last:
                raise RunFolderError(
                    f"{out} {self.path} already holds a training run ({self.last_path}); pass "
                    f"{res} auto to continue it, or choose another {out}")
            raise RunFolderError(
                f"{out} {self.path} is not empty ({_describe_entries(entries)}); choose a new "
                f"folder (or pass {res} auto to continue the run kept there)")
        if resume == "auto":
            if has_last:
                return StartPlan(self.last_path, True)
            if not entries:
                return StartPlan(None, False)
            started_from = self._uncommitted_run_start(entries, f"{res} auto")
            source = f"from {started_from}" if started_from else "from scratch"
            return StartPlan(started_from, False, (
                f"{self.path} holds a run that never finished its first epoch (no {LAST_NAME}); "
                f"starting it again {source}",))
        path = Path(resume)
        if not path.is_file():
            raise RunFolderError(f"{res}: checkpoint not found: {path}")
        if has_last:
            if path.resolve() == self.last_path.resolve():
                return StartPlan(self.last_path, True)
            raise RunFolderError(
                f"{out} {self.path} already holds a run ({self.last_path}); resuming {path} "
                f"there would overwrite it. Use {res} auto or another {out}")
        if entries:
            self._uncommitted_run_start(entries, f"{res} {path}")
        return StartPlan(path, False)

    def _uncommitted_run_start(self, entries: Sequence[Path], what: str) -> Optional[Path]:
        """For a folder without last.pth: its starting checkpoint if it is a run of this script
        that never committed an epoch; RunFolderError naming the folder and files otherwise."""
        refusal = (f"{what}: {self.path} has no {LAST_NAME} to continue from but is not empty "
                   f"({_describe_entries(entries)}); refusing to start over there. Choose "
                   f"another {self.output_option}, or empty the folder yourself")
        marker = self._read_marker()
        if marker is None:
            raise RunFolderError(refusal)
        if marker.get("script") != self.script:
            raise RunFolderError(f"{refusal} (it is a run of {marker.get('script')!r}, not "
                                 f"{self.script!r})")
        names = {entry.name for entry in entries}
        staged_first_best = any(_staging_suffix(name) is not None and
                                _staging_suffix(name)[0] == "none" for name in names)
        if BEST_NAME in names and not staged_first_best:
            raise RunFolderError(f"{refusal} ({BEST_NAME} shows that epochs were committed)")
        if self.metrics_path.is_file():
            records, _ = parse_metrics_lines(self.metrics_path.read_text())
            if len({record.get("epoch") for record in records}) > 1:
                raise RunFolderError(f"{refusal} ({METRICS_NAME} shows that epochs were "
                                     "committed)")
        started_from = marker.get("started_from")
        return Path(started_from) if started_from else None

    def _read_marker(self) -> Optional[dict[str, Any]]:
        try:
            marker = json.loads(self.marker_path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(marker, dict) or marker.get("format") != RUN_FOLDER_FORMAT:
            return None
        return marker

    def start(self, plan: StartPlan, committed_epochs: int) -> list[str]:
        """Create the folder, write the marker and :meth:`repair` it; returns notes for the log.

        ``committed_epochs``: epochs the folder's ``last.pth`` holds (0 unless
        ``plan.continues``).
        """
        if not plan.continues and committed_epochs != 0:
            raise ValueError("committed_epochs must be 0 when the run does not continue this "
                             f"folder's {LAST_NAME}")
        self.path.mkdir(parents=True, exist_ok=True)
        notes = list(plan.notes) + self.repair(committed_epochs)
        marker = self._read_marker()
        if not plan.continues or marker is None:
            marker = {"format": RUN_FOLDER_FORMAT, "script": self.script,
                      "started_from": (None if plan.continues or plan.resume_from is None
                                       else str(plan.resume_from)),
                      "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            atomic_write(self.marker_path,
                         lambda handle: handle.write((json.dumps(marker) + "\n").encode()))
        return notes

    # ------------------------------------------------------------------ repair --------------

    def repair(self, committed_epochs: int) -> list[str]:
        """Undo what a kill after ``committed_epochs`` committed epochs left behind.

        Returns one note per action taken (empty when the folder was consistent).
        """
        if committed_epochs < 0:
            raise ValueError(f"committed_epochs must be >= 0, got {committed_epochs}")
        notes = [f"removed temporary file {path.name} left by a killed write"
                 for path in remove_stale_temp_files(self.path)]
        for entry in sorted(self.path.iterdir()):
            staged = _staging_suffix(entry.name)
            if staged is None:
                continue
            kind, epochs = staged
            if epochs <= committed_epochs:  # that commit finished; only step 4 was missing
                entry.unlink()
            elif kind == "prev":
                if self.best_path.exists() and os.path.samefile(entry, self.best_path):
                    # killed before the new best.pth replaced the old one (renaming a hard link
                    # onto its other name would do nothing)
                    entry.unlink()
                else:
                    os.replace(entry, self.best_path)
                    notes.append(f"restored {BEST_NAME} of the last committed epoch (epoch "
                                 f"{epochs} was not committed)")
            else:
                if self.best_path.exists():
                    self.best_path.unlink()
                    notes.append(f"removed {BEST_NAME} of epoch {epochs}, which was not "
                                 "committed")
                entry.unlink()
            fsync_folder(self.path)
        notes += self._repair_metrics(committed_epochs)
        return notes

    def _repair_metrics(self, committed_epochs: int) -> list[str]:
        if not self.metrics_path.is_file():
            return []
        text = self.metrics_path.read_text()
        records, torn = parse_metrics_lines(text)
        kept = [r for r in records if not isinstance(r.get("epoch"), int)
                or r["epoch"] < committed_epochs]
        dropped = len(records) - len(kept)
        if not torn and not dropped and (not text or text.endswith("\n")):
            return []
        payload = "".join(json.dumps(record) + "\n" for record in kept).encode()
        atomic_write(self.metrics_path, lambda handle: handle.write(payload))
        notes = []
        if dropped:
            notes.append(f"dropped {dropped} line(s) of uncommitted epoch(s) from {METRICS_NAME}")
        if torn:
            notes.append(f"dropped {torn} unreadable (torn) line(s) from {METRICS_NAME}")
        return notes

    # ------------------------------------------------------------------ commit --------------

    def commit(self, *, epoch: int, checkpoint: Any, records: Sequence[Mapping[str, Any]],
               best: Optional[Any] = None) -> None:
        """Commit finished epoch ``epoch`` (0-based): ``best`` (when it is a new best), the
        metrics ``records`` (each gets / must have ``"epoch": epoch``), then ``checkpoint`` as
        ``last.pth`` (it must record ``epoch + 1`` epochs done)."""
        lines = []
        for record in records:
            record = {"epoch": epoch, **record}
            if record["epoch"] != epoch:
                raise ValueError(f"metrics record for epoch {record['epoch']} committed with "
                                 f"epoch {epoch}")
            lines.append(json.dumps(record) + "\n")
        epochs_done = epoch + 1
        staging = None
        if best is not None:
            staging = self._stage_best(epochs_done)
            atomic_torch_save(best, self.best_path)
        if lines:
            with open(self.metrics_path, "a") as handle:
                handle.write("".join(lines))
                handle.flush()
                os.fsync(handle.fileno())
        atomic_torch_save(checkpoint, self.last_path)
        if staging is not None:
            staging.unlink()
            fsync_folder(self.path)

    def _stage_best(self, epochs_done: int) -> Path:
        """Step 1: keep the current best.pth (or the fact that there is none) for a rollback;
        best.pth itself stays in place until the new one replaces it."""
        if self.best_path.exists():
            staging = self.path / f"{_BEST_BACKUP}{epochs_done}"
            atomic_second_name(self.best_path, staging)
        else:
            staging = self.path / f"{_BEST_ABSENT}{epochs_done}"
            staging.touch()
        fsync_folder(self.path)
        return staging

    def records(self) -> list[dict[str, Any]]:
        """The metrics records written so far (empty without a metrics file)."""
        return read_metrics(self.metrics_path) if self.metrics_path.is_file() else []
