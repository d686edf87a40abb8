"""The layout of a C++ struct of csrc/cuda as the host C++ compiler builds it, to hold a ctypes
mirror of a kernel's parameter block to it."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc" / "cuda"


def ctypes_layout(struct: type[ctypes.Structure]) -> list[int]:
    """The offset of each of ``struct``'s fields, then its size."""
    return [getattr(struct, name).offset for name, _ in struct._fields_] + [ctypes.sizeof(struct)]


def cxx_layout(folder: Path, header: str, type_name: str, struct: type[ctypes.Structure]) -> list[int]:
    """offsetof of each of ``struct``'s fields in the C++ type ``type_name`` of ``header`` (under
    csrc/cuda), then its sizeof, from a program compiled in ``folder``; skips the test without a C++
    compiler."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    prints = "".join(f'  std::printf("%zu ", offsetof(P, {name}));\n' for name, _ in struct._fields_)
    (folder / "layout.cpp").write_text(
        f'#include <cstddef>\n#include <cstdio>\n#include "{header}"\n'
        f"using P = {type_name};\nint main() {{\n" + prints + '  std::printf("%zu\\n", sizeof(P));\n}\n')
    subprocess.run([cxx, "-std=c++17", f"-I{CSRC}", str(folder / "layout.cpp"), "-o", str(folder / "layout")],
                   check=True)
    out = subprocess.run([str(folder / "layout")], check=True, capture_output=True, text=True).stdout.split()
    return [int(v) for v in out]
