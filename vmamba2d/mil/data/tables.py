"""Label, survival and split tables (CSV) -> slide entries.

Labels:
    ``read_label_csv(path, label_map=None, ...)`` -> (list[SlideEntry], label_map). Columns
        ``slide_id,label,split`` by default (BRACS-style); other names via keywords (e.g. DHMC:
        ``slide_column="File Name", label_column="Diagnosis", split_column="Data Split"``).
    ``read_survival_csv(path, ...)`` -> list[SlideEntry], one per patient (``case_id``), from
        ``,case_id,slide_id,censorship,survival_months`` (censorship 1 = censored).
    ``read_split_csv(path)`` -> {"train": [...], "val": [...], "test": [...]} from ``,train,val,test``
        columns of ids (``splits_k.csv``, HIPT-style splits); ``select_split(entries, ids, by=...)``.

Every error names the CSV row.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from .errors import SlideDataError

PathLike = Union[str, Path]

SPLIT_NAMES = ("train", "val", "test")
SLIDE_SUFFIXES = (".svs", ".tif", ".tiff", ".ndpi", ".mrxs", ".scn", ".h5", ".pt", ".png", ".jpg")


@dataclass(frozen=True)
class SlideEntry:
    """One row of a label / survival table: which slide file to load and its targets.

    slide_id: file stem to load; slide_ids: every slide of the patient (survival; the first is loaded);
    label: class index (or survival time bin); case_id / time / censorship: survival fields; split.
    """

    slide_id: str
    label: Optional[int] = None
    split: Optional[str] = None
    case_id: Optional[str] = None
    time: Optional[float] = None
    censorship: Optional[int] = None
    slide_ids: tuple[str, ...] = ()


def _clean_id(value: str, strip_suffixes: Sequence[str]) -> str:
    value = value.strip()
    for suffix in strip_suffixes:
        if value.lower().endswith(suffix):
            return value[: -len(suffix)]
    return value


def _read_rows(path: PathLike, required: Sequence[str]) -> list[dict[str, str]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"table not found: {path}")
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            missing = [c for c in required if c not in columns]
            if missing:
                raise SlideDataError(f"{path}: missing column(s) {missing}; found {columns}")
            return list(reader)
    except UnicodeDecodeError as error:
        raise SlideDataError(f"{path}: not a UTF-8 text CSV table (byte {error.start}: "
                             f"{error.reason})") from None


def _normalise_split(value: Optional[str], path: Path, line: int) -> Optional[str]:
    if value is None or not value.strip():
        return None
    split = value.strip().lower()
    split = {"validation": "val", "valid": "val"}.get(split, split)
    if split not in SPLIT_NAMES:
        raise SlideDataError(f"{path} line {line}: split {value!r} is not one of {SPLIT_NAMES}")
    return split


def read_label_csv(path: PathLike, *, label_map: Optional[Mapping[str, int]] = None,
                   slide_column: str = "slide_id", label_column: str = "label",
                   split_column: Optional[str] = "split", drop_unmapped: bool = False,
                   strip_suffixes: Sequence[str] = SLIDE_SUFFIXES) -> tuple[list[SlideEntry], dict[str, int]]:
    """Classification table -> (entries, label_map).

    ``label_map`` maps the label column's text to class indices; None = the sorted distinct labels
    numbered 0..C-1 (integers sort numerically). A label not in the map raises SlideDataError
    naming the row, unless ``drop_unmapped=True`` (e.g. TCGA-BRCA keeps IDC / ILC and drops the
    other codes) leaves such rows out; an empty slide id or a repeated one raises. ``split_column=None`` or a missing
    column leaves ``split`` None; split values are train / val / test (any case; "validation" ok).
    File suffixes such as ``.svs`` are removed from slide ids (whole suffix, not characters).
    """
    path = Path(path)
    rows = _read_rows(path, [slide_column, label_column])
    texts = [row[label_column].strip() for row in rows]
    if label_map is None:
        distinct = sorted({t for t in texts if t}, key=lambda t: (0, int(t), "") if t.lstrip("-").isdigit() else (1, 0, t))
        label_map = {t: i for i, t in enumerate(distinct)}
    label_map = {str(k): int(v) for k, v in label_map.items()}
    entries, seen = [], set()
    for line, (row, text) in enumerate(zip(rows, texts), start=2):
        slide_id = _clean_id(row[slide_column], strip_suffixes)
        if not slide_id:
            raise SlideDataError(f"{path} line {line}: empty {slide_column!r}")
        if slide_id in seen:
            raise SlideDataError(f"{path} line {line}: slide {slide_id!r} is listed twice")
        seen.add(slide_id)
        if text not in label_map:
            if drop_unmapped:
                continue
            raise SlideDataError(f"{path} line {line}: slide {slide_id!r} has label {text!r}, not in the label map "
                                 f"{sorted(label_map)}")
        split = _normalise_split(row.get(split_column) if split_column else None, path, line)
        entries.append(SlideEntry(slide_id, label=label_map[text], split=split, slide_ids=(slide_id,)))
    return entries, label_map


def read_survival_csv(path: PathLike, *, case_column: str = "case_id", slide_column: str = "slide_id",
                      censorship_column: str = "censorship", time_column: str = "survival_months",
                      strip_suffixes: Sequence[str] = SLIDE_SUFFIXES) -> list[SlideEntry]:
    """Survival table (one row per slide) -> one entry per patient, in first-appearance order.

    Each entry has ``case_id``, ``time``, ``censorship`` (1 = censored, 0 = event), ``slide_ids`` (all
    the patient's slides, file order) and ``slide_id`` = the first of them (the slide that is loaded,
    as in the official code); ``label`` is None until the caller assigns time bins. Rows of one
    patient with different times or censorship, censorship not 0/1, or a non-finite / negative time
    raise SlideDataError naming the row.
    """
    path = Path(path)
    rows = _read_rows(path, [case_column, slide_column, censorship_column, time_column])
    patients: dict[str, dict[str, Any]] = {}
    for line, row in enumerate(rows, start=2):
        case_id = row[case_column].strip()
        slide_id = _clean_id(row[slide_column], strip_suffixes)
        if not case_id or not slide_id:
            raise SlideDataError(f"{path} line {line}: empty {case_column!r} or {slide_column!r}")
        try:
            time = float(row[time_column])
            censorship = int(float(row[censorship_column]))
        except ValueError as error:
            raise SlideDataError(f"{path} line {line} (case {case_id!r}): unreadable time / censorship: {error}") from error
        if not math.isfinite(time) or time < 0:
            raise SlideDataError(f"{path} line {line} (case {case_id!r}): survival time {time} must be finite and >= 0")
        if censorship not in (0, 1):
            raise SlideDataError(f"{path} line {line} (case {case_id!r}): censorship must be 0 or 1, got {censorship}")
        patient = patients.setdefault(case_id, dict(time=time, censorship=censorship, slides=[]))
        if (patient["time"], patient["censorship"]) != (time, censorship):
            raise SlideDataError(f"{path} line {line}: case {case_id!r} has rows with different survival time / censorship")
        if slide_id not in patient["slides"]:
            patient["slides"].append(slide_id)
    return [SlideEntry(p["slides"][0], case_id=case_id, time=p["time"], censorship=p["censorship"],
                       slide_ids=tuple(p["slides"])) for case_id, p in patients.items()]


def read_split_csv(path: PathLike, *, strip_suffixes: Sequence[str] = SLIDE_SUFFIXES) -> dict[str, list[str]]:
    """Split table with columns ``train``, ``val``, ``test`` (any may be absent or short; blank cells
    ignored; an unnamed index column is skipped) -> {split: ids in order, repeats removed}."""
    path = Path(path)
    rows = _read_rows(path, [])
    columns = [c for c in (rows[0].keys() if rows else []) if c and c.strip().lower() in ("train", "val", "test")]
    if not columns:
        raise SlideDataError(f"{path}: needs at least one of the columns train, val, test")
    splits: dict[str, list[str]] = {}
    for column in columns:
        ids = [_clean_id(row[column] or "", strip_suffixes) for row in rows]
        splits[column.strip().lower()] = list(dict.fromkeys(i for i in ids if i))
    return splits


def select_split(entries: Iterable[SlideEntry], ids: Iterable[str], *, by: str = "slide_id",
                 exclude: Iterable[str] = ()) -> list[SlideEntry]:
    """The entries whose ``by`` field (``"slide_id"`` or ``"case_id"``) is in ``ids``, in the order of
    ``ids``, minus those in ``exclude`` (e.g. patients also in the training split; docs/mil.md).
    An id with no entry raises SlideDataError."""
    if by not in ("slide_id", "case_id"):
        raise ValueError(f"by must be 'slide_id' or 'case_id', got {by!r}")
    lookup = {getattr(e, by): e for e in entries}
    excluded = set(exclude)
    missing = [i for i in ids if i not in lookup]
    if missing:
        raise SlideDataError(f"{len(missing)} split id(s) have no table entry (by {by}), e.g. {missing[:3]}")
    return [lookup[i] for i in dict.fromkeys(ids) if i not in excluded]
