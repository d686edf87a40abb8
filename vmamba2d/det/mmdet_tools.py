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

``mmdet_tools_dir``, ``available_tools``, ``resolve_tool``, ``run_tool`` and ``main`` are the
methods of :class:`vmamba2d.openmmlab.tool_runner.ToolRunner` for mmdet.
"""
from __future__ import annotations

import vmamba2d.det  # noqa: F401  (must precede every mmdet tool import)
from vmamba2d.openmmlab.tool_runner import ToolRunner

_RUNNER = ToolRunner("mmdet", "mmdet==3.3.0", "vmamba2d.det.mmdet_tools")

mmdet_tools_dir, available_tools = _RUNNER.tools_dir, _RUNNER.available_tools
resolve_tool, run_tool, main = _RUNNER.resolve_tool, _RUNNER.run_tool, _RUNNER.main

if __name__ == "__main__":
    main()
