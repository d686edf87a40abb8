"""Loading the repository's scripts (benchmarks/, dev/gpu/, seg/, det/) in tests: they are files, not modules of
an installed package, so each is loaded by path under a module name of its own."""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_script(relative_path: str, module_name: str | None = None) -> types.ModuleType:
    """Execute the script at REPO / relative_path (e.g. "benchmarks/bench_model.py") as a fresh module
    registered in sys.modules under module_name (default: "script_" + its path's stem), where the
    dataclasses it defines look their module up."""
    path = REPO / relative_path
    name = module_name or f"script_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str) -> types.ModuleType:
    """benchmarks/<name>.py as module "benchmark_<name>"."""
    return load_script(f"benchmarks/{name}.py", f"benchmark_{name}")


def load_gpu_tool(name: str) -> types.ModuleType:
    """dev/gpu/<name>.py under its own name, with dev/gpu/ importable (the tools import each other)."""
    tools = str(REPO / "dev" / "gpu")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    return load_script(f"dev/gpu/{name}.py", name)
