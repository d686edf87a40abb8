"""Test-only torch extensions that run CUDA kernel bodies on the CPU (host emulation), compiled by
the C++ compiler alone (no nvcc) from sources in csrc/cuda.

Each extension is built once into build/emulation/<name> and reused while its sources are unchanged
(torch.utils.cpp_extension.load compares them; a lock file serialises concurrent builds).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[2]
CUDA_SOURCES = REPO / "csrc" / "cuda"
BUILD_ROOT = REPO / "build" / "emulation"

# The v4 row-streaming kernels' emulation. Emulation sources live in csrc/cuda/emulation, outside
# the folder setup.py globs for the nvcc-built extension.
ROWS_SOURCES = ("emulation/scan2d_rows_emulate.cpp",)
# The RS backward's emulation and its carry-saving forward (every 2D route).
ROWS_BACKWARD_SOURCES = ("emulation/scan2d_rows_backward_emulate.cpp",)
# The v4 one-plane-per-lane kernel's emulation (PL).
PLANES_SOURCES = ("emulation/scan2d_planes_emulate.cpp",)
# The v3 kernels' emulation, race detector and launch planner (_emulate_*, _launch_plan, ...: the
# bindings vmamba2d._C_cuda has too, csrc/cuda/scan2d_emulation_bindings.h).
V3_SOURCES = ("emulation/scan2d_v3_emulation_module.cpp", "selective_scan_2d_emulate.cpp")


# The emulation sources include ATen and torch's pybind11 casters (torch/csrc/utils/pybind.h), not
# <torch/extension.h>: the C++ frontend that one pulls in took 23 s of every module's build on the
# 2-core VM, ATen and the casters 12 s.
# The compiler's optimisation for the emulation modules. The v4 modules instantiate their kernel
# bodies for every element type, lane width, access width and route (hundreds of instances): at -O1
# the RS module took 268 s to build on the 2-core VM and at -O0 101 s, while the tests that run it
# took 11 s either way; the v3 module builds in under a minute at -O1 and its tests run its
# emulation much longer, so it keeps -O1.
V4_CFLAGS = ("-O0",)
V3_CFLAGS = ("-O1",)


def build_emulation(name: str, sources: Sequence[str], extra_cflags: Sequence[str] = V3_CFLAGS):
    """Compiles (or reuses) the extension ``name`` from ``sources`` (paths relative to csrc/cuda, which
    is the include path) with the host C++ compiler and ``extra_cflags``, and returns the loaded module."""
    from torch.utils import cpp_extension

    if not sources:
        raise ValueError("sources: expected at least one file under csrc/cuda")
    paths = [CUDA_SOURCES / s for s in sources]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"sources: no such files {missing}")
    build_dir = BUILD_ROOT / name
    build_dir.mkdir(parents=True, exist_ok=True)
    jobs = os.environ.get("MAX_JOBS")
    os.environ.setdefault("MAX_JOBS", "2")
    try:
        return cpp_extension.load(
            name=name,
            sources=[str(p) for p in paths],
            extra_cflags=list(extra_cflags),
            extra_include_paths=[str(CUDA_SOURCES)],
            build_directory=str(build_dir),
            with_cuda=False,
            verbose=False,
        )
    finally:
        if jobs is None:
            os.environ.pop("MAX_JOBS", None)


@functools.lru_cache(maxsize=None)
def rows_emulation():
    """The RS emulation module (rows_forward, rows_plan, rows_vector_accesses, rows_self_check)."""
    return build_emulation("vmamba2d_rows_emulation", ROWS_SOURCES, V4_CFLAGS)


@functools.lru_cache(maxsize=None)
def v3_emulation():
    """The v3 emulation module (the _emulate_* / _launch_plan / _softplus ... functions of _C_cuda)."""
    return build_emulation("vmamba2d_v3_emulation", V3_SOURCES)


@functools.lru_cache(maxsize=None)
def planes_emulation():
    """The PL emulation module (planes_forward, planes_smem_bytes, planes_counters)."""
    return build_emulation("vmamba2d_planes_emulation", PLANES_SOURCES, V4_CFLAGS)


@functools.lru_cache(maxsize=None)
def rows_backward_emulation():
    """The RS backward emulation module (rows_forward_save, rows_backward, rows_backward_self_check)."""
    return build_emulation("vmamba2d_rows_backward_emulation", ROWS_BACKWARD_SOURCES, V4_CFLAGS)
