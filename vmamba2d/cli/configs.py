"""The configs this package ships (package data under ``vmamba2d/configs/``), by kind and name.

A command that takes a config accepts either a file path or the name of a shipped config (its file
name without the extension); ``--list`` prints the names. ``_base_`` folders hold the pieces the
configs include and are not listed.
"""
from __future__ import annotations

import os
from pathlib import Path

CONFIG_ROOT = Path(__file__).resolve().parents[1] / "configs"
SUFFIXES = {"classification": ".yaml", "mil": ".yaml", "seg": ".py", "det": ".py"}


def shipped_configs(kind: str) -> dict[str, Path]:
    """``{name: path}`` of the shipped configs of ``kind`` ("classification", "seg", "det", "mil")."""
    if kind not in SUFFIXES:
        raise ValueError(f"kind must be one of {sorted(SUFFIXES)}, got {kind!r}")
    folder = CONFIG_ROOT / kind
    return {p.stem: p for p in sorted(folder.glob(f"*{SUFFIXES[kind]}")) if p.is_file()}


def resolve_config(kind: str, given: str) -> str:
    """``given`` when it is an existing file, else the path of the shipped config it names (with or
    without the extension), else ``given`` unchanged (the command reports the missing file)."""
    if os.path.isfile(given):
        return given
    name = given[: -len(SUFFIXES[kind])] if given.endswith(SUFFIXES[kind]) else given
    found = shipped_configs(kind).get(name) if os.sep not in name else None
    return str(found) if found is not None else given


def config_listing(kind: str) -> str:
    """One line per shipped config of ``kind``: its name, then its path."""
    configs = shipped_configs(kind)
    width = max(map(len, configs), default=0)
    return "\n".join(f"{name:<{width}}  {path}" for name, path in configs.items())
