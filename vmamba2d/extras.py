"""The pip extras (optional dependency groups) and the one message that asks for one:
``<what> needs <modules>: pip install "vmamba2d[<extra>]"``."""
from __future__ import annotations

import importlib.util
from typing import Sequence


def install_command(extra: str) -> str:
    """The command that installs ``extra``: ``pip install "vmamba2d[seg]"`` (quoted for every shell)."""
    return f'pip install "vmamba2d[{extra}]"'


class MissingExtraError(ImportError):
    """A module of an extra is not installed; the message names the modules and the install command."""

    def __init__(self, needed_by: str, missing: Sequence[str], extra: str, detail: str = "") -> None:
        self.extra = extra
        self.missing = tuple(missing)
        note = f" ({detail})" if detail else ""
        super().__init__(f"{needed_by} needs {', '.join(missing)}{note}: {install_command(extra)}")


def require_extra(needed_by: str, modules: Sequence[str], extra: str, detail: str = "") -> None:
    """Raise :class:`MissingExtraError` when any top-level module of ``modules`` is not importable.

    Args:
        needed_by: what needs them, for the message (``"vmamba2d.seg"``, ``"the C-index"``).
        modules: top-level module names (``("mmengine", "mmseg")``).
        extra: the extra that installs them (``"seg"``).
        detail: pinned versions or another note, shown in parentheses.
    """
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(needed_by, missing, extra, detail)
