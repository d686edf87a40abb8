"""Run mmdetection's own tools (get_flops, print_config, browse_dataset, benchmark, train, test, ...)
with mmcv-lite and this package's configs.

mmdet's tools import ``mmdet.models`` / ``mmdet.apis`` / ``mmdet.utils`` at their top, which with
mmcv-lite fails on ``mmcv._ext`` before a config's ``custom_imports`` could run. This runner imports
:mod:`vmamba2d.det` first (mmcv.ops stand-in, backbone registration, the scan's FLOP handle for
mmengine's counter), then runs the tool file shipped in the installed mmdet wheel
(``mmdet/.mim/tools/``, or ``tools/`` of an mmdet source checkout) as ``__main__``:

    python -m vmamba2d.det.mmdet_tools misc/print_config.py CONFIG
    python det/mmdet_tool.py analysis_tools/get_flops.py CONFIG   # the same, from the repository
    python -m vmamba2d.det.mmdet_tools --list                     # the tools found
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

import vmamba2d.det  # noqa: F401  (must precede every mmdet tool import)
from vmamba2d.openmmlab.tool_runner import ToolRunner

_RUNNER = ToolRunner("mmdet", "mmdet==3.3.0", "vmamba2d.det.mmdet_tools")


def mmdet_tools_dir() -> Path:
    """The folder of mmdet's tools: ``mmdet/.mim/tools`` (wheel) or ``<checkout>/tools`` (editable).

    Raises:
        FileNotFoundError when neither exists.
    """
    return _RUNNER.tools_dir()


def available_tools(tools_dir: Optional[Path] = None) -> List[str]:
    """Tool paths relative to the tools folder, e.g. ``'analysis_tools/get_flops.py'``."""
    return _RUNNER.available_tools(tools_dir)


def resolve_tool(name: str, tools_dir: Optional[Path] = None) -> Path:
    """The tool file for ``name`` (see :meth:`ToolRunner.resolve_tool`); ValueError when it matches
    no tool or several."""
    return _RUNNER.resolve_tool(name, tools_dir)


def run_tool(name: str, argv: Sequence[str]) -> None:
    """Run mmdet tool ``name`` with command-line arguments ``argv``, as ``python TOOL ARGV`` would."""
    _RUNNER.run_tool(name, argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Command line: ``TOOL [ARGS...]`` runs an mmdet tool; ``--list`` prints the tools found."""
    _RUNNER.main(argv)


if __name__ == "__main__":
    main()
