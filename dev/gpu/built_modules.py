"""Loading what the GPU tools build or import by path: this repository's own Python files outside an
installed package, and compiled extension modules (the exported earlier kernel, the 1D anchor) that
are not on sys.path."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_by_path(name: str, path: Path) -> ModuleType:
    """The Python file at ``path`` run as module ``name``, registered in sys.modules (where the
    dataclasses it defines look their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_extension(name: str, path: Path) -> ModuleType:
    """The compiled extension module file at ``path`` imported as ``name`` (its PyInit_ name). Import
    torch first when the module links against it."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
