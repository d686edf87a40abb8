"""Run an OpenMMLab toolkit's own tool scripts (``tools/`` of mmseg or mmdet) after our imports.

The toolkits' tools import ``<toolkit>.models`` / ``.apis`` / ``.utils`` at their top, which with
mmcv-lite fails on ``mmcv._ext`` before a config's ``custom_imports`` could run. A toolkit package
(:mod:`vmamba2d.seg.mmseg_tools`, :mod:`vmamba2d.det.mmdet_tools`) imports its integration first and
then runs the tool file shipped in the installed wheel (``<toolkit>/.mim/tools/``, or ``tools/`` of a
source checkout) as ``__main__`` through :class:`ToolRunner`.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import runpy
import sys
from pathlib import Path
from typing import Callable, ContextManager, Dict, List, Optional, Sequence


class ToolRunner:
    """Find and run the tools of one toolkit.

    Args:
        toolkit: the toolkit's top-level module (``"mmseg"``, ``"mmdet"``).
        wheel: the pip requirement that ships the tools, for error messages
            (``"mmsegmentation==1.2.2"``).
        module: the module users run (``"vmamba2d.seg.mmseg_tools"``), for the usage line.
        fixes: tool path (relative to the tools folder) -> context manager active while it runs
            (workarounds of upstream bugs).
    """

    def __init__(self, toolkit: str, wheel: str, module: str,
                 fixes: Optional[Dict[str, Callable[[], ContextManager]]] = None) -> None:
        self.toolkit = toolkit
        self.wheel = wheel
        self.module = module
        self.fixes = dict(fixes or {})

    def tools_dir(self) -> Path:
        """``<toolkit>/.mim/tools`` (wheel) or ``<checkout>/tools`` (editable install).

        Raises:
            FileNotFoundError when neither exists.
        """
        spec = importlib.util.find_spec(self.toolkit)
        package = Path(next(iter(spec.submodule_search_locations)))
        candidates = [package / ".mim" / "tools", package.parent / "tools"]
        for folder in candidates:
            if (folder / "analysis_tools").is_dir():
                return folder
        raise FileNotFoundError(f"{self.toolkit}'s tools folder not found (looked in "
                                f"{', '.join(map(str, candidates))}); install the wheel (`pip install {self.wheel}`)")

    def available_tools(self, tools_dir: Optional[Path] = None) -> List[str]:
        """Tool paths relative to the tools folder, e.g. ``'analysis_tools/get_flops.py'``."""
        tools_dir = tools_dir or self.tools_dir()
        return sorted(str(p.relative_to(tools_dir)) for p in tools_dir.rglob("*.py")
                      if "__pycache__" not in p.parts)

    def resolve_tool(self, name: str, tools_dir: Optional[Path] = None) -> Path:
        """The tool file for ``name``: a relative path (``analysis_tools/get_flops.py``, ``.py``
        optional) or a bare file name that is unique among the tools (``get_flops``).

        Raises:
            ValueError naming the candidates when ``name`` matches no tool or several.
        """
        tools_dir = tools_dir or self.tools_dir()
        tools = self.available_tools(tools_dir)
        wanted = name if name.endswith(".py") else name + ".py"
        matches = [t for t in tools if t == wanted] or [t for t in tools if Path(t).name == wanted]
        if len(matches) != 1:
            problem = "is ambiguous: " + ", ".join(matches) if matches else "matches no tool"
            raise ValueError(f"{self.toolkit} tool {name!r} {problem}. Tools in {tools_dir}: {', '.join(tools)}")
        return tools_dir / matches[0]

    def run_tool(self, name: str, argv: Sequence[str]) -> None:
        """Run tool ``name`` with command-line arguments ``argv``, as ``python TOOL ARGV`` would
        (``sys.argv`` and ``sys.path[0]`` set to the tool's, module name ``__main__``)."""
        tools_dir = self.tools_dir()
        path = self.resolve_tool(name, tools_dir)
        fix = self.fixes.get(path.relative_to(tools_dir).as_posix(), contextlib.nullcontext)
        saved_argv, saved_path = sys.argv[:], sys.path[:]
        sys.argv = [str(path), *argv]
        sys.path.insert(0, str(path.parent))
        try:
            with fix():
                runpy.run_path(str(path), run_name="__main__")
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path

    def main(self, argv: Optional[Sequence[str]] = None) -> None:
        """Command line: ``TOOL [ARGS...]`` runs a tool; ``--list`` prints the tools found."""
        argv = list(sys.argv[1:] if argv is None else argv)
        usage = f"python -m {self.module} TOOL [TOOL ARGUMENTS ...]"
        parser = argparse.ArgumentParser(
            usage=f"{usage}\n       python -m {self.module} --list",
            description=f"Run one of {self.toolkit}'s tools with mmcv-lite and vmamba2d's backbones. "
                        "Arguments after TOOL go to the tool (see `... TOOL --help`).")
        parser.add_argument("tool", nargs="?", help="e.g. analysis_tools/get_flops.py, misc/print_config.py, "
                                                    "analysis_tools/benchmark.py, train.py")
        parser.add_argument("--list", action="store_true", help=f"list {self.toolkit}'s tools and exit")
        # everything from TOOL on belongs to the tool, including its own --help
        split = next((i for i, arg in enumerate(argv) if not arg.startswith("-")), len(argv))
        args = parser.parse_args(argv[: split + 1])
        if args.list:
            print("\n".join(self.available_tools()))
            return
        if args.tool is None:
            parser.error(f"name the {self.toolkit} tool to run (--list shows them)")
        try:
            self.resolve_tool(args.tool)
        except (ValueError, FileNotFoundError) as error:
            parser.error(str(error))
        self.run_tool(args.tool, argv[split + 1:])
