"""Autotuning of the GPU scan kernels' numerics-neutral launch knobs on the user's GPU.

The design of a call is fixed by :mod:`vmamba2d.ops.plan`'s rule; within a design, a launcher hands
:meth:`Tuner.choose` the settings of knobs that cannot change a single output bit (each candidate
runs the same floating-point operations in the same order on every cell; docs/kernels.md,
"Planner and tuner"), default first. On the first call per key (GPU, SM count, dtype, shape, N,
routes, direction, ...) each candidate runs once untimed (its compile / load) and ``TIMED_CALLS``
times timed; the lowest median wins (ties: the earlier candidate). The choice is kept in the
process and in ``<cache root>/tuning/<kernel>/<hash of the key>.json`` (the cache root of the NVRTC
kernels: ``$VMAMBA2D_CACHE_DIR``, else ``$XDG_CACHE_HOME/vmamba2d``, else ``~/.cache/vmamba2d``),
written through a temporary file and ``os.replace``; an unusable entry is tuned again with a
one-line warning, a folder that cannot be written leaves the choice in the process (warned once).

In order, a call takes:

1. ``VMAMBA2D_TUNE=off``: the default; ``VMAMBA2D_TUNE=warps=2,prefetch=1`` (knob=value pairs): the
   first candidate with those values (knobs a kernel does not have are ignored; a value that is not
   among a kernel's candidates is an error). Unset, ``auto`` or ``on``: tune.
2. ``torch.distributed`` initialized with more than one rank: the default on every rank. Timings and
   cache folders differ between ranks, and a collective inside a kernel call would hang when the
   ranks reach a key at different times (an uneven last batch), so ranks agree by a deterministic
   rule instead; pin knobs with ``VMAMBA2D_TUNE`` for the same tuned setting on every rank.
3. The choice made before in this process, else the one on disk.
4. Under CUDA-graph capture or torch.compile tracing: the default, not stored (a later eager call
   tunes).
5. Timing, as above.

``VMAMBA2D_DEBUG_PLAN=1`` prints each key's choice once; ``backend_info()["scan_tuning"]`` lists them.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Callable, Mapping, Optional, Sequence

import torch

from .compiled.kernel_cache import default_cache_dir, write_entry
from .plan import DEBUG_ENV

TUNE_ENV = "VMAMBA2D_TUNE"
KNOBS = ("prefetch", "warps", "block_m")
MAX_CANDIDATES = 6
TIMED_CALLS = 3
CACHE_FORMAT = 1

Knobs = Mapping[str, int]
# Runs the callable once and returns the seconds it took on the device.
Timer = Callable[[Callable[[], None]], float]


@dataclass(frozen=True)
class Choice:
    """A launch's knob settings, where they came from ("tuned", "process", "disk", "default",
    "off", "pinned", "distributed", "skipped: <why>") and the candidates' median seconds when tuned."""

    knobs: Mapping[str, int]
    source: str
    medians: Optional[tuple[float, ...]] = None


def cuda_event_timer(run: Callable[[], None]) -> float:
    """Seconds one ``run()`` takes on the current CUDA stream (events around it, then synchronized)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def tracing_reason() -> Optional[str]:
    """Why timing is not possible now (torch.compile tracing, CUDA-graph capture), or None."""
    if torch.compiler.is_compiling():
        return "torch.compile tracing"
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return "CUDA-graph capture"
    return None


def distributed_ranks() -> int:
    """Ranks of the initialized default process group (1 without one)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def tune_setting() -> tuple[str, dict[str, int]]:
    """``VMAMBA2D_TUNE`` as ("tune", {}), ("off", {}) or ("pin", knobs).

    Raises:
        ValueError: a value of another form, an unknown knob or a value that is not a positive int.
    """
    value = os.environ.get(TUNE_ENV, "").strip().lower()
    if value in ("", "auto", "on"):
        return "tune", {}
    if value == "off":
        return "off", {}
    pins: dict[str, int] = {}
    for part in value.split(","):
        name, eq, number = (s.strip() for s in part.partition("="))
        if not eq or name not in KNOBS or not number.isdigit() or int(number) < 1 or name in pins:
            raise ValueError(f"{TUNE_ENV}: expected auto, off or knob=value pairs such as 'prefetch=2,warps=2' "
                             f"(knobs {', '.join(KNOBS)}, positive ints, each once), got {value!r}")
        pins[name] = int(number)
    return "pin", pins


def pinned_candidate(candidates: Sequence[Knobs], pins: Mapping[str, int], kernel: str) -> Knobs:
    """The first candidate with the pinned values of the knobs it has (others ignored).

    Raises:
        ValueError: no candidate has them.
    """
    own = {k: v for k, v in pins.items() if k in candidates[0]}
    for candidate in candidates:
        if all(candidate[k] == v for k, v in own.items()):
            return candidate
    raise ValueError(f"{TUNE_ENV}: {','.join(f'{k}={v}' for k, v in own.items())} is not a bit-neutral "
                     f"setting of {kernel} for this call; its settings are {[dict(c) for c in candidates]}")


class Tuner:
    """Chooses launch knobs per key (module docstring); one per process (:func:`default_tuner`).

    timer: runs a callable once and returns its device seconds (CUDA events by default; tests pass
    a fake clock). cache_root: the folder holding ``tuning/`` (None: the NVRTC cache root, read at
    each use). ranks / skip_reason: the distributed and tracing probes (injectable for tests).
    """

    def __init__(self, timer: Optional[Timer] = None, cache_root: Optional[Path] = None,
                 ranks: Callable[[], int] = distributed_ranks,
                 skip_reason: Callable[[], Optional[str]] = tracing_reason) -> None:
        self._timer = timer or cuda_event_timer
        self._cache_root = Path(cache_root) if cache_root is not None else None
        self._ranks = ranks
        self._skip_reason = skip_reason
        self._chosen: dict[str, Choice] = {}
        self._announced: set[tuple[str, str]] = set()
        self._unwritable: set[Path] = set()
        self._lock = threading.Lock()

    def folder(self) -> Path:
        """Where the entries live: ``<cache root>/tuning``."""
        return (self._cache_root or default_cache_dir()) / "tuning"

    def entry_path(self, kernel: str, key_text: str) -> Path:
        return self.folder() / kernel / f"{hashlib.sha256(key_text.encode()).hexdigest()[:32]}.json"

    def choose(self, kernel: str, key: Mapping[str, object], candidates: Sequence[Knobs],
               run: Callable[[Knobs], None]) -> Choice:
        """The knob settings for a launch of ``kernel`` (a name such as "cuda-rs") on a call with
        ``key`` (JSON-able values: GPU, dtype, shape, ...), among ``candidates`` (at most
        MAX_CANDIDATES, the heuristic default first, all bitwise-equivalent); ``run(knobs)`` launches
        the call's kernel with a setting (it is timed on the first call per key)."""
        distinct = {tuple(sorted(c.items())) for c in candidates}
        if not 1 <= len(candidates) <= MAX_CANDIDATES or len(distinct) != len(candidates):
            raise ValueError(f"candidates: expected 1 to {MAX_CANDIDATES} distinct settings, got {list(candidates)}")
        key_text = json.dumps({"kernel": kernel, "format": CACHE_FORMAT, **key}, sort_keys=True)
        mode, pins = tune_setting()
        if mode == "off":
            return self._keep(key_text, Choice(candidates[0], "off"), store=False)
        if mode == "pin":
            return self._keep(key_text, Choice(pinned_candidate(candidates, pins, kernel), "pinned"), store=False)
        ranks = self._ranks()
        if ranks > 1:
            return self._keep(key_text, Choice(candidates[0], "distributed"), store=True)
        with self._lock:
            known = self._chosen.get(key_text)
        if known is not None:
            return Choice(known.knobs, "process", known.medians)
        path = self.entry_path(kernel, key_text)
        cached = self._read(path, key_text, candidates)
        if cached is not None:
            return self._keep(key_text, cached, store=True)
        skip = self._skip_reason()
        if skip is not None:
            return self._keep(key_text, Choice(candidates[0], f"skipped: {skip}"), store=False)
        choice = self._tune(candidates, run)
        self._write(path, key_text, choice)
        return self._keep(key_text, choice, store=True)

    def _tune(self, candidates: Sequence[Knobs], run: Callable[[Knobs], None]) -> Choice:
        medians = []
        for candidate in candidates:
            run(candidate)  # compile / load outside the timing
            medians.append(median(self._timer(lambda: run(candidate)) for _ in range(TIMED_CALLS)))
        best = min(range(len(candidates)), key=lambda i: (medians[i], i))
        return Choice(candidates[best], "tuned", tuple(medians))

    def _read(self, path: Path, key_text: str, candidates: Sequence[Knobs]) -> Optional[Choice]:
        try:
            entry = json.loads(path.read_text())
        except OSError:  # absent, or a folder that cannot be read: a miss (a failed write warns)
            return None
        except ValueError as err:
            return self._unusable(path, f"unreadable: {err}")
        if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT or entry.get("key") != key_text:
            return self._unusable(path, "written for another key or format")
        knobs = entry.get("knobs")
        if not any(knobs == dict(c) for c in candidates):
            return self._unusable(path, f"{knobs} is not a candidate")
        medians = entry.get("medians")
        numbers = isinstance(medians, list) and all(isinstance(m, (int, float)) for m in medians)
        return Choice(dict(knobs), "disk", tuple(medians) if numbers else None)

    @staticmethod
    def _unusable(path: Path, why: str) -> None:
        warnings.warn(f"vmamba2d: tuning cache entry {path} is unusable ({why}); tuning again", RuntimeWarning,
                      stacklevel=4)
        return None

    def _write(self, path: Path, key_text: str, choice: Choice) -> None:
        entry = {"format": CACHE_FORMAT, "key": key_text, "knobs": dict(choice.knobs), "medians": list(choice.medians)}
        try:
            write_entry(path, json.dumps(entry, sort_keys=True).encode())
        except OSError as err:
            with self._lock:
                first = path.parents[1] not in self._unwritable
                self._unwritable.add(path.parents[1])
            if first:
                warnings.warn(f"vmamba2d: cannot write the tuning cache {path.parents[1]} ({err}); tuned launch "
                              f"settings last for this process only (set VMAMBA2D_CACHE_DIR to a writable folder)",
                              RuntimeWarning, stacklevel=4)

    def _keep(self, key_text: str, choice: Choice, store: bool) -> Choice:
        with self._lock:
            if store:
                self._chosen[key_text] = choice
            first = (key_text, choice.source) not in self._announced
            self._announced.add((key_text, choice.source))
        if first and os.environ.get(DEBUG_ENV, "") in ("1", "true", "yes"):
            times = f", medians {[round(t * 1e3, 4) for t in choice.medians]} ms" if choice.medians else ""
            print(f"vmamba2d tuning: {key_text} -> {dict(choice.knobs)} ({choice.source}{times})", file=sys.stderr)
        return choice

    def chosen(self) -> list[dict]:
        """The choices kept in this process: key, knobs, source."""
        with self._lock:
            return [{"key": json.loads(text), "knobs": dict(c.knobs), "source": c.source}
                    for text, c in self._chosen.items()]


@functools.lru_cache(maxsize=None)
def default_tuner() -> Tuner:
    """The process's tuner (CUDA-event timer, the NVRTC cache root)."""
    return Tuner()


def describe() -> dict:
    """The tuner's setting, cache folder and the choices made so far, for ``backend_info()``."""
    tuner = default_tuner()
    return {"setting": os.environ.get(TUNE_ENV) or "auto", "cache": str(tuner.folder()), "chosen": tuner.chosen()}
