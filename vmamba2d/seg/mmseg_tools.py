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

Two upstream bugs of mmseg 1.2.2 are worked around, each only while its tool runs:

* ``get_flops.py`` passes both ``input_shape`` and ``inputs`` to mmengine's
  ``get_model_complexity_info``, which refuses that (open-mmlab/mmsegmentation#3241, fixed after
  1.2.2 by passing ``input_shape=None``): ``input_shape`` is dropped when ``inputs`` is given.
* ``browse_dataset.py`` hands the visualizer a channel-planar (non-contiguous) image view, on which
  OpenCV cannot draw the class labels (open-mmlab/mmsegmentation#3405): the image is made
  contiguous first.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import runpy
import sys
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

import vmamba2d.seg  # noqa: F401  (must precede every mmseg tool import)

_USAGE = "python -m vmamba2d.seg.mmseg_tools TOOL [TOOL ARGUMENTS ...]"


def mmseg_tools_dir() -> Path:
    """The folder of mmseg's tools: ``mmseg/.mim/tools`` (wheel) or ``<checkout>/tools`` (editable).

    Raises:
        FileNotFoundError when neither exists.
    """
    spec = importlib.util.find_spec("mmseg")
    package = Path(next(iter(spec.submodule_search_locations)))
    candidates = [package / ".mim" / "tools", package.parent / "tools"]
    for folder in candidates:
        if (folder / "analysis_tools").is_dir():
            return folder
    raise FileNotFoundError(f"mmseg's tools folder not found (looked in {', '.join(map(str, candidates))}); "
                            "install the mmsegmentation wheel (`pip install mmsegmentation==1.2.2`)")


def available_tools(tools_dir: Optional[Path] = None) -> List[str]:
    """Tool paths relative to the tools folder, e.g. ``'analysis_tools/get_flops.py'``."""
    tools_dir = tools_dir or mmseg_tools_dir()
    return sorted(str(p.relative_to(tools_dir)) for p in tools_dir.rglob("*.py") if "__pycache__" not in p.parts)


def resolve_tool(name: str, tools_dir: Optional[Path] = None) -> Path:
    """The tool file for ``name``: a relative path (``analysis_tools/get_flops.py``, ``.py`` optional)
    or a bare file name that is unique among the tools (``get_flops``).

    Raises:
        ValueError naming the candidates when ``name`` matches no tool or several.
    """
    tools_dir = tools_dir or mmseg_tools_dir()
    tools = available_tools(tools_dir)
    wanted = name if name.endswith(".py") else name + ".py"
    matches = [t for t in tools if t == wanted] or [t for t in tools if Path(t).name == wanted]
    if len(matches) != 1:
        problem = "is ambiguous: " + ", ".join(matches) if matches else "matches no tool"
        raise ValueError(f"mmseg tool {name!r} {problem}. Tools in {tools_dir}: {', '.join(tools)}")
    return tools_dir / matches[0]


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


_UPSTREAM_FIXES = {
    "analysis_tools/get_flops.py": _complexity_info_takes_inputs_only,
    "analysis_tools/browse_dataset.py": _visualizer_gets_contiguous_images,
    "misc/browse_dataset.py": _visualizer_gets_contiguous_images,
}


def run_tool(name: str, argv: Sequence[str]) -> None:
    """Run mmseg tool ``name`` with command-line arguments ``argv``, as ``python TOOL ARGV`` would
    (``sys.argv`` and ``sys.path[0]`` set to the tool's, module name ``__main__``)."""
    tools_dir = mmseg_tools_dir()
    path = resolve_tool(name, tools_dir)
    fix = _UPSTREAM_FIXES.get(path.relative_to(tools_dir).as_posix(), contextlib.nullcontext)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(path), *argv]
    sys.path.insert(0, str(path.parent))
    try:
        with fix():
            runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Command line: ``TOOL [ARGS...]`` runs an mmseg tool; ``--list`` prints the tools found."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        usage=f"{_USAGE}\n       {_USAGE.split(' TOOL')[0]} --list",
        description="Run one of mmsegmentation's tools with mmcv-lite and vmamba2d's backbones. Arguments "
                    "after TOOL go to the tool (see `... TOOL --help`).")
    parser.add_argument("tool", nargs="?", help="e.g. analysis_tools/get_flops.py, misc/print_config.py, "
                                                "analysis_tools/benchmark.py, train.py")
    parser.add_argument("--list", action="store_true", help="list mmseg's tools and exit")
    # everything from TOOL on belongs to the tool, including its own --help
    split = next((i for i, arg in enumerate(argv) if not arg.startswith("-")), len(argv))
    args = parser.parse_args(argv[: split + 1])
    if args.list:
        print("\n".join(available_tools()))
        return
    if args.tool is None:
        parser.error("name the mmseg tool to run (--list shows them)")
    try:
        resolve_tool(args.tool)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    run_tool(args.tool, argv[split + 1:])


if __name__ == "__main__":
    main()
