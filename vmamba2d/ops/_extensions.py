"""Locating the compiled scan kernels: the built extension, or a JIT build of ``csrc/cpu``.

``setup.py`` builds ``vmamba2d._C_cpu`` (always) and ``vmamba2d._C_cuda`` (when a CUDA toolkit and
a CUDA-enabled torch are present). A plain source checkout has neither, so the CPU kernel is then
compiled on first use with ninja through ``torch.utils.cpp_extension.load``. Each lookup runs once
per process; failures are remembered with their reason so ``backend_info()`` can report them.
"""
from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Optional

CPU_SOURCES_DIR = Path(__file__).resolve().parents[2] / "csrc" / "cpu"
# -fno-trapping-math lets GCC vectorise the CPU scan's clamped exp / softplus loops (same results).
CPU_CXX_FLAGS = ["-O3", "-std=c++20", "-fno-trapping-math"]
# Without OpenMP in the extension's own build, at::parallel_for (a header template) runs serially.
OPENMP_FLAGS = ["-fopenmp"]

_failure_reasons: dict[str, str] = {}
_sources: dict[str, str] = {}


def _import_built(module_name: str) -> Optional[ModuleType]:
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        _failure_reasons[module_name] = f"{module_name} not importable ({err})"
        return None


def _jit_build_cpu() -> Optional[ModuleType]:
    sources = sorted(str(p) for p in CPU_SOURCES_DIR.glob("*.cpp"))
    if not sources:
        _failure_reasons["jit"] = f"no C++ sources under {CPU_SOURCES_DIR} to JIT-compile"
        return None
    try:
        from torch.utils.cpp_extension import load

        return load(
            name="vmamba2d_cpu_jit",
            sources=sources,
            extra_cflags=CPU_CXX_FLAGS + OPENMP_FLAGS,
            extra_ldflags=OPENMP_FLAGS,
            verbose=os.environ.get("VMAMBA2D_JIT_VERBOSE", "0") == "1",
        )
    except Exception as err:  # compiler missing, ninja missing, build error: all mean "no kernel"
        _failure_reasons["jit"] = f"JIT build of {CPU_SOURCES_DIR} failed: {err}"
        return None


@functools.lru_cache(maxsize=None)
def cpu_extension() -> Optional[ModuleType]:
    """The compiled CPU kernel module (built, else JIT-built), or None if neither works.

    Set ``VMAMBA2D_DISABLE_JIT=1`` to skip the JIT build.
    """
    module = _import_built("vmamba2d._C_cpu")
    if module is not None:
        _sources["cpu"] = "built"
        return module
    if os.environ.get("VMAMBA2D_DISABLE_JIT", "0") == "1":
        _failure_reasons["jit"] = "JIT build disabled by VMAMBA2D_DISABLE_JIT=1"
        return None
    module = _jit_build_cpu()
    if module is not None:
        _sources["cpu"] = "jit"
    return module


@functools.lru_cache(maxsize=None)
def cuda_extension() -> Optional[ModuleType]:
    """The compiled CUDA kernel module, or None when it was not built."""
    module = _import_built("vmamba2d._C_cuda")
    if module is not None:
        _sources["cuda"] = "built"
    return module


@functools.lru_cache(maxsize=None)
def _cuda_kernel_usable_on(device_index: int) -> bool:
    module = cuda_extension()
    if module is None:
        return False
    try:
        if module.kernel_image_available(device_index):
            return True
    except RuntimeError as err:  # the CUDA runtime itself failed (e.g. a driver older than it)
        _failure_reasons["vmamba2d._C_cuda"] = f"vmamba2d._C_cuda cannot query GPU {device_index}: {err}"
        return False
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    _failure_reasons["vmamba2d._C_cuda"] = (
        f"vmamba2d._C_cuda has no kernel image for {torch.cuda.get_device_name(device_index)} "
        f"(sm_{major}{minor}); rebuild with TORCH_CUDA_ARCH_LIST including {major}.{minor}"
    )
    return False


def cuda_kernel_usable(device) -> bool:
    """True when the CUDA extension is built and holds a kernel image the GPU ``device`` can run.

    The answer is cached per device index, so per-call cost is a dict lookup.
    """
    index = device.index
    if index is None:
        import torch

        index = torch.cuda.current_device()
    return _cuda_kernel_usable_on(index)


def extension_source(kind: str) -> Optional[str]:
    """``"built"``, ``"jit"`` or None for ``kind`` in {"cpu", "cuda"} (after a lookup)."""
    return _sources.get(kind)


def failure_reason(kind: str) -> str:
    """Why the ``kind`` ("cpu" or "cuda") extension is unavailable, for error messages."""
    if kind == "cpu":
        parts = [_failure_reasons.get("vmamba2d._C_cpu", ""), _failure_reasons.get("jit", "")]
    else:
        parts = [_failure_reasons.get("vmamba2d._C_cuda", "")]
    return "; ".join(p for p in parts if p) or "unknown"
