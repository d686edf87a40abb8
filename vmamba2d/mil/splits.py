"""The train / val / test slides of one MIL run, from the tables a config names.

Classification: a label table (``read_label_csv``) split by its split column, by a split table
(``,train,val,test`` slide ids, HIPT-style) or by stratified fractions (PANDA-style). Survival:
a survival table (one entry per patient) and the fold's ``splits_{fold}.csv`` of case ids; time
bins are computed on the training patients only and stored as each entry's label.

Survival folds have no test split. By default the run then reports the fold's val set at a fixed
epoch (``select: last``); with ``holdout_fraction`` > 0 a stratified share of the training
patients becomes the selection (val) set and the fold's val set is reported as test, so the
epoch is never chosen on the set that is reported.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import AbstractSet, Optional

import numpy as np

from .config import MILConfig, UsageError
from .data.errors import SlideDataError
from .data.tables import SlideEntry, read_label_csv, read_split_csv, read_survival_csv
from .survival import assign_survival_bins, survival_bin_edges

SPLITS = ("train", "val", "test")


@dataclass
class RunSplits:
    """Entries of one run: ``train``, ``val`` and ``test`` (may be empty), the class count (or K
    time bins), the label map (classification) and the bin edges (survival), plus notes on what
    was dropped."""

    train: list[SlideEntry]
    val: list[SlideEntry]
    test: list[SlideEntry]
    num_classes: int
    label_map: Optional[dict[str, int]] = None
    bin_edges: Optional[list[float]] = None
    notes: list[str] = field(default_factory=list)

    def split(self, name: str) -> list[SlideEntry]:
        """Entries of ``name`` in SPLITS."""
        return getattr(self, name)


def _label_texts(path: Path, column: str) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            if column not in (reader.fieldnames or []):
                raise SlideDataError(f"{path}: missing column {column!r}; found {reader.fieldnames}")
            return [row[column].strip() for row in reader]
    except UnicodeDecodeError as error:
        raise SlideDataError(f"{path}: not a UTF-8 text CSV table (byte {error.start}: "
                             f"{error.reason})") from None


def classification_entries(cfg: MILConfig) -> tuple[list[SlideEntry], dict[str, int], list[str]]:
    """Entries with labels and (when the table has one) splits; the ids of dropped rows."""
    path = Path(cfg.label_csv)
    label_map = cfg.label_map
    unmapped: set[str] = set()
    if cfg.drop_unmapped_labels:
        unmapped = set(_label_texts(path, cfg.label_column)) - set(label_map)
        label_map = {**label_map, **{text: -1 for text in unmapped}}
    use_split_column = not (cfg.split_csv or cfg.split_fractions)
    entries, label_map = read_label_csv(
        path, label_map=label_map, slide_column=cfg.slide_column, label_column=cfg.label_column,
        split_column=cfg.split_column if use_split_column else None)
    dropped = [e.slide_id for e in entries if e.label == -1]
    entries = [e for e in entries if e.label != -1]
    label_map = {k: v for k, v in label_map.items() if v != -1}
    return entries, label_map, dropped


def _stratified_split(entries: list[SlideEntry], fractions: list[float],
                      seed: int) -> dict[str, list[SlideEntry]]:
    """Per-class shuffled split by ``fractions`` (train, val, test), rounding per class."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[SlideEntry]] = {name: [] for name in SPLITS}
    labels = sorted({e.label for e in entries})
    for label in labels:
        members = [e for e in entries if e.label == label]
        order = rng.permutation(len(members))
        n_val = int(round(fractions[1] * len(members)))
        n_test = int(round(fractions[2] * len(members)))
        n_train = len(members) - n_val - n_test
        picked = [members[i] for i in order]
        out["train"] += picked[:n_train]
        out["val"] += picked[n_train:n_train + n_val]
        out["test"] += picked[n_train + n_val:]
    for name in SPLITS:  # keep table order inside each split
        position = {e.slide_id: i for i, e in enumerate(entries)}
        out[name].sort(key=lambda e: position[e.slide_id])
    return out


def _select(entries: list[SlideEntry], ids: list[str], by: str, table: str,
            ignore: set[str] = frozenset()) -> list[SlideEntry]:
    lookup = {getattr(e, by): e for e in entries}
    missing = [i for i in ids if i not in lookup and i not in ignore]
    if missing:
        raise UsageError(f"{table}: {len(missing)} id(s) have no row in the label table "
                         f"(matched by {by}), e.g. {missing[:3]}")
    return [lookup[i] for i in dict.fromkeys(ids) if i in lookup]


def _skipped_note(skipped: list[str], what: str) -> list[str]:
    if not skipped:
        return []
    return [f"{len(skipped)} {what} skipped (--skip-bad-slides), e.g. {skipped[:3]}"]


def classification_splits(cfg: MILConfig, fold: Optional[int] = None,
                          exclude: AbstractSet[str] = frozenset()) -> RunSplits:
    """Train / val / test entries of a classification run, without the slides in ``exclude``
    (as if their rows were not in the label table)."""
    entries, label_map, dropped = classification_entries(cfg)
    skipped = [e.slide_id for e in entries if e.slide_id in exclude]
    entries = [e for e in entries if e.slide_id not in exclude]
    notes = [f"{len(dropped)} slide(s) with labels outside the label map dropped"] if dropped else []
    notes += _skipped_note(skipped, "unusable slide(s)")
    if cfg.split_csv:
        table = cfg.split_csv.format(fold=fold) if cfg.uses_folds else cfg.split_csv
        ids = read_split_csv(table)
        parts = {name: _select(entries, ids.get(name, []), "slide_id", table,
                               set(dropped) | set(skipped))
                 for name in SPLITS}
    elif cfg.split_fractions:
        parts = _stratified_split(entries, cfg.split_fractions, cfg.split_seed)
    else:
        unsplit = [e.slide_id for e in entries if e.split is None]
        if unsplit:
            raise UsageError(f"--label-csv {cfg.label_csv}: {len(unsplit)} row(s) have no split "
                             f"in column {cfg.split_column!r} (e.g. {unsplit[:3]}); give "
                             "--split-csv or --split-fractions")
        parts = {name: [e for e in entries if e.split == name] for name in SPLITS}
    seen: dict[str, str] = {}
    for name in SPLITS:
        for entry in parts[name]:
            if entry.slide_id in seen:
                raise UsageError(f"slide {entry.slide_id!r} is in both the {seen[entry.slide_id]} "
                                 f"and the {name} split")
            seen[entry.slide_id] = name
    return RunSplits(parts["train"], parts["val"], parts["test"], len(set(label_map.values())),
                     label_map=label_map, notes=notes)


def _holdout(entries: list[SlideEntry], fraction: float,
             seed: int) -> tuple[list[SlideEntry], list[SlideEntry]]:
    """Split patients into (kept, held out), stratified by censorship."""
    rng = np.random.default_rng(seed)
    held: set[str] = set()
    for censored in (0, 1):
        members = [e.case_id for e in entries if e.censorship == censored]
        count = int(round(fraction * len(members)))
        held.update(members[i] for i in rng.permutation(len(members))[:count])
    return ([e for e in entries if e.case_id not in held],
            [e for e in entries if e.case_id in held])


def survival_splits(cfg: MILConfig, fold: int, exclude: AbstractSet[str] = frozenset()) -> RunSplits:
    """Train / val / test patients of a survival fold, labelled with training-only time bins;
    patients whose loaded slide is in ``exclude`` are left out before the bins are computed."""
    entries = read_survival_csv(cfg.label_csv)
    skipped = [e.case_id for e in entries if e.slide_id in exclude]
    entries = [e for e in entries if e.slide_id not in exclude]
    table = cfg.split_csv.format(fold=fold)
    ids = read_split_csv(table)
    parts = {name: _select(entries, ids.get(name, []), "case_id", table, set(skipped))
             for name in SPLITS}
    notes = _skipped_note(skipped, "patient(s) with an unusable slide")
    evaluated = {e.case_id for e in parts["val"] + parts["test"]}
    overlap = [e.case_id for e in parts["train"] if e.case_id in evaluated]
    if overlap:  # e.g. UCEC: split files list a patient once per slide, in both splits
        parts["train"] = [e for e in parts["train"] if e.case_id not in evaluated]
        notes.append(f"{len(overlap)} patient(s) listed in train and in val/test removed from "
                     f"train (e.g. {overlap[:3]})")
    if cfg.holdout_fraction > 0:
        if parts["test"]:
            raise UsageError(f"--holdout-fraction: {table} already has a test split; the holdout "
                             "is for folds with train / val only")
        parts["test"] = parts["val"]
        parts["train"], parts["val"] = _holdout(parts["train"], cfg.holdout_fraction,
                                                cfg.split_seed * 1000 + fold)
        notes.append(f"{len(parts['val'])} training patient(s) held out for epoch selection; "
                     f"the fold's val patients are reported as test")
    if not parts["train"]:
        raise UsageError(f"{table}: the training split is empty")
    train = parts["train"]
    edges = survival_bin_edges([e.time for e in train], [e.censorship for e in train], cfg.n_bins)

    def with_bins(group: list[SlideEntry]) -> list[SlideEntry]:
        bins = assign_survival_bins([e.time for e in group], edges)
        return [replace(e, label=int(b)) for e, b in zip(group, bins)]

    return RunSplits(with_bins(parts["train"]), with_bins(parts["val"]), with_bins(parts["test"]),
                     cfg.n_bins, bin_edges=[float(v) for v in edges], notes=notes)


def run_splits(cfg: MILConfig, fold: Optional[int],
               exclude: AbstractSet[str] = frozenset()) -> RunSplits:
    """The entries of one run without the slide ids in ``exclude`` (unusable slides); checks that
    the chosen selection has the sets it needs."""
    try:
        splits = (survival_splits(cfg, fold, exclude) if cfg.task == "survival"
                  else classification_splits(cfg, fold, exclude))
    except (SlideDataError, FileNotFoundError) as error:
        raise UsageError(str(error)) from error
    where = f" (fold {fold})" if cfg.uses_folds else ""
    if not splits.train:
        raise UsageError(f"no training slides{where}")
    if not splits.val:
        raise UsageError(f"no validation slides{where}: every run evaluates a val split")
    if cfg.select == "best" and not splits.test:
        raise UsageError(
            f"--select best{where} picks the epoch on val and reports test, but there is no test "
            "split: the val score of an epoch chosen on val is optimistic. Use --select last "
            "(report val at the last epoch)" + (" or --holdout-fraction" if cfg.task == "survival"
                                               else " or give a test split"))
    return splits
