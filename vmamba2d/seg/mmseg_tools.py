"""Run mmsegmentation's own tools (get_flops, print_config, browse_dataset, benchmark, train, test,
...) with mmcv-lite and this package's configs.

mmseg's tools import ``mmseg.models`` / ``mmseg.apis`` / ``mmseg.utils`` at their top, which with
mmcv-lite fails on ``mmcv._ext`` before a config's ``custom_imports`` could run. This runner
imports :mod:`vmamba2d.seg` first (mmcv.ops stand-in, backbone registration, the scan's FLOP
handle for mmengine's counter), then runs the tool file shipped in the installed mmseg wheel
(``mmseg/.mim/tools/``, or ``tools/`` of an mmseg source checkout) as ``__main__``:

    python -m vmamba2d.seg.mmseg_tools analysis_tools/get_flops.py CONFIG --shape 512 2048
    python seg/mmseg_tool.py misc/print_config.py CONFIG          # the same, from the repository
    python -m vmamba2d.seg.mmseg_tools --list                      # the tools found

``mmseg_tools_dir``, ``available_tools``, ``resolve_tool``, ``run_tool`` and ``main`` are the
methods of :class:`vmamba2d.openmmlab.tool_runner.ToolRunner` for mmseg.

Two upstream bugs of mmseg 1.2.2 are worked around, each only while its tool runs:

* ``get_flops.py`` passes both ``input_shape`` and ``inputs`` to mmengine's
  ``get_model_complexity_info``, which refuses that (open-mmlab/mmsegmentation#3241, fixed after
  1.2.2 by passing ``input_shape=None``): ``input_shape`` is dropped when ``inputs`` is given.
* ``browse_dataset.py`` hands the visualizer a channel-planar (non-contiguous) image view, on which
  OpenCV cannot draw the class labels (open-mmlab/mmsegmentation#3405): the image is made
  contiguous first.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import vmamba2d.seg  # noqa: F401  (must precede every mmseg tool import)
from vmamba2d.openmmlab.tool_runner import ToolRunner


@contextlib.contextmanager
def _complexity_info_takes_inputs_only() -> Iterator[None]:
    """While active, ``mmengine.analysis.get_model_complexity_info`` ignores ``input_shape`` when
    ``inputs`` is given (the upstream get_flops.py fix, see the module docstring)."""
    import mmengine.analysis

    original = mmengine.analysis.get_model_complexity_info

    def inputs_win(model, input_shape=None, inputs=None, **kwargs):
        return original(model, None if inputs is not None else input_shape, inputs, **kwargs)

    mmengine.analysis.get_model_complexity_info = inputs_win
    try:
        yield
    finally:
        mmengine.analysis.get_model_complexity_info = original


@contextlib.contextmanager
def _visualizer_gets_contiguous_images() -> Iterator[None]:
    """While active, ``SegLocalVisualizer.add_datasample`` copies a non-contiguous ``image`` into a
    C-contiguous array (OpenCV draws only on those; see the module docstring)."""
    import numpy as np
    from mmseg.visualization import SegLocalVisualizer

    original = SegLocalVisualizer.add_datasample

    def contiguous_image(self, *args, **kwargs):
        if "image" in kwargs:
            kwargs["image"] = np.ascontiguousarray(kwargs["image"])
        elif len(args) >= 2:  # (name, image, ...)
            args = (args[0], np.ascontiguousarray(args[1]), *args[2:])
        return original(self, *args, **kwargs)

    SegLocalVisualizer.add_datasample = contiguous_image
    try:
        yield
    finally:
        SegLocalVisualizer.add_datasample = original


_RUNNER = ToolRunner("mmseg", "mmsegmentation==1.2.2", "vmamba2d.seg.mmseg_tools", fixes={
    "analysis_tools/get_flops.py": _complexity_info_takes_inputs_only,
    "analysis_tools/browse_dataset.py": _visualizer_gets_contiguous_images,
    "misc/browse_dataset.py": _visualizer_gets_contiguous_images,
})

mmseg_tools_dir, available_tools = _RUNNER.tools_dir, _RUNNER.available_tools
resolve_tool, run_tool, main = _RUNNER.resolve_tool, _RUNNER.run_tool, _RUNNER.main

if __name__ == "__main__":
    main()
