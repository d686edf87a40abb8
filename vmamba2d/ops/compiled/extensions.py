"""Locating the compiled scan kernels: the built extension, or a JIT build of the CPU kernel.

``setup.py`` builds ``vmamba2d._C_cpu`` and ``vmamba2d._C_cuda`` when torch is importable at build
time (``pip install --no-build-isolation``). An install without them (an isolated ``pip install .``,
a source checkout) compiles the CPU kernel on first use with ninja through
``torch.utils.cpp_extension.load``, from the C++ sources a wheel carries as package data
(``vmamba2d/csrc/cpu``) or a checkout has in ``csrc/cpu``. Each lookup runs once per process;
failures are remembered with their reason so ``backend_info()`` can report them.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator, Optional

from ..settings import env_choice

PACKAGE_DIR = Path(__file__).resolve().parents[2]
# An installed wheel carries the sources inside the package (setup.py copies them there); a source
# checkout and an editable install read the repository's csrc/cpu.
CPU_SOURCE_DIRS = (PACKAGE_DIR / "csrc" / "cpu", PACKAGE_DIR.parent / "csrc" / "cpu")
CPU_SOURCE_PATTERNS = ("*.h", "*.cpp")
# -fno-trapping-math lets GCC vectorise the CPU scan's clamped exp / softplus loops (same results).
CPU_CXX_FLAGS = ["-O3", "-std=c++20", "-fno-trapping-math"]
# Without OpenMP in the extension's own build, at::parallel_for (a header template) runs serially.
OPENMP_FLAGS = ["-fopenmp"]
JIT_PROGRESS_LINE = "compiling the vmamba2d CPU kernel, about a minute, once"
_COMPILER_ERROR = re.compile(r"\berror\b|not found|no such file", re.IGNORECASE)

# Which CUDA kernels run where both exist: "auto" (the nvcc build where there is one, else NVRTC),
# "nvrtc" (NVRTC even beside an nvcc build: what a pip install runs) or "built" (the nvcc build only).
CUDA_KERNELS_ENV = "VMAMBA2D_CUDA_KERNELS"
CUDA_KERNELS_CHOICES = ("auto", "nvrtc", "built")

_failure_reasons: dict[str, str] = {}
_sources: dict[str, str] = {}


def cuda_kernels_setting() -> str:
    """The ``VMAMBA2D_CUDA_KERNELS`` setting: "auto" (unset), "nvrtc" or "built".

    Raises:
        ValueError: any other value.
    """
    return env_choice(CUDA_KERNELS_ENV, CUDA_KERNELS_CHOICES, "auto")


def _import_built(module_name: str) -> Optional[ModuleType]:
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        _failure_reasons[module_name] = f"{module_name} not importable ({err})"
        return None


def cpu_sources_dir() -> Optional[Path]:
    """The folder whose C++ files the JIT build compiles (package data, else the checkout's)."""
    for folder in CPU_SOURCE_DIRS:
        if any(folder.glob("*.cpp")):
            return folder
    return None


def _jit_extension_name(sources_dir: Path) -> str:
    """The JIT module's name: torch's version, then a hash of everything the build depends on.

    torch's extension cache keeps one build folder per name, so a torch upgrade, a changed source
    file, other flags or another install location each get a fresh build instead of a stale one.
    """
    import torch

    digest = hashlib.sha256()
    for part in (str(sources_dir), sys.version, torch.__version__, str(torch.version.cuda),
                 *CPU_CXX_FLAGS, *OPENMP_FLAGS):
        digest.update(part.encode() + b"\0")
    for path in _source_files(sources_dir):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    torch_tag = re.sub(r"\W", "_", torch.__version__)
    return f"vmamba2d_cpu_torch{torch_tag}_{digest.hexdigest()[:12]}"


def _source_files(sources_dir: Path) -> list[Path]:
    return sorted(p for pattern in CPU_SOURCE_PATTERNS for p in sources_dir.glob(pattern))


def _ninja_from_its_package() -> Optional[str]:
    """The folder of the ``ninja`` executable that the ninja package installed, if any.

    torch runs ``ninja`` from PATH, which lacks the venv's bin folder when its python is run
    without activating the venv.
    """
    try:
        files = importlib.metadata.files("ninja") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name in ("ninja", "ninja.exe"):
            path = Path(file.locate()).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path.parent)
    return None


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    folder = None if shutil.which("ninja") else _ninja_from_its_package()
    if folder is None:
        yield
        return
    original = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join(filter(None, [folder, original]))
    try:
        yield
    finally:
        os.environ["PATH"] = original


def _build_error_summary(err: Exception, log_path: Optional[Path]) -> str:
    """One line for a failed JIT build: torch's headline and the compiler's error lines.

    torch puts ninja's whole output (every compile command) into the exception; that goes to
    ``log_path`` instead, and the summary names the file.
    """
    text = str(err).strip()
    lines = text.splitlines() or [""]
    headline = lines[0].split(": [", 1)[0]  # torch: "Error building extension 'name': <ninja output>"
    errors = [line.strip() for line in lines[1:] if _COMPILER_ERROR.search(line)]
    summary = f"{type(err).__name__}: {headline}"
    if errors:
        summary += ": " + "; ".join(dict.fromkeys(errors[:3]))
    if log_path is not None and len(lines) > 1:
        with contextlib.suppress(OSError):
            log_path.write_text(text + "\n")
            summary += f"; full output in {log_path}"
    return summary


def _jit_build_cpu() -> Optional[ModuleType]:
    sources_dir = cpu_sources_dir()
    if sources_dir is None:
        searched = " or ".join(str(folder) for folder in CPU_SOURCE_DIRS)
        _failure_reasons["jit"] = f"no C++ sources under {searched} to JIT-compile"
        return None
    build_dir = None
    try:
        from torch.utils.cpp_extension import get_default_build_root, load

        name = _jit_extension_name(sources_dir)
        build_dir = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / name
        build_dir.mkdir(parents=True, exist_ok=True)
        if not (build_dir / f"{name}.so").is_file():
            print(f"{JIT_PROGRESS_LINE} (into {build_dir})", file=sys.stderr, flush=True)
        with _ninja_on_path():
            return load(
                name=name,
                sources=[str(p) for p in _source_files(sources_dir) if p.suffix == ".cpp"],
                extra_cflags=CPU_CXX_FLAGS + OPENMP_FLAGS,
                extra_ldflags=OPENMP_FLAGS,
                build_directory=str(build_dir),
                verbose=os.environ.get("VMAMBA2D_JIT_VERBOSE", "0") == "1",
            )
    except Exception as err:  # compiler missing, ninja missing, build error: all mean "no kernel"
        log_path = None if build_dir is None else build_dir / "build_error.log"
        _failure_reasons["jit"] = f"JIT build of {sources_dir} failed ({_build_error_summary(err, log_path)})"
        return None


@functools.lru_cache(maxsize=None)
def cpu_extension() -> Optional[ModuleType]:
    """The compiled CPU kernel module (built, else JIT-built), or None if neither works.

    The JIT build lands in torch's extension cache (``TORCH_EXTENSIONS_DIR``, by default
    ``~/.cache/torch_extensions``) and is reused by later processes. Set
    ``VMAMBA2D_DISABLE_JIT=1`` to skip it.
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
    """The CUDA kernels: the nvcc-built extension where one was built, else the NVRTC path
    (compiled at first use, vmamba2d/ops/compiled/nvrtc_backend.py), else None with the reason.
    ``VMAMBA2D_CUDA_KERNELS=nvrtc`` takes the NVRTC path even beside an nvcc build, ``=built`` the
    nvcc build only (:func:`cuda_kernels_setting`)."""
    setting = cuda_kernels_setting()
    if setting != "nvrtc":
        module = _import_built("vmamba2d._C_cuda")
        if module is not None:
            _sources["cuda"] = "built"
            return module
        if setting == "built":
            _failure_reasons["vmamba2d._C_cuda"] = (
                f"{CUDA_KERNELS_ENV}=built, but there is no nvcc-built vmamba2d._C_cuda "
                f"({_failure_reasons.get('vmamba2d._C_cuda', 'not importable')}): build it with "
                "VMAMBA2D_NVCC_BUILD=1 (docs/install.md) or unset the variable")
            return None
    from . import nvrtc, nvrtc_backend

    try:
        module = nvrtc_backend.nvrtc_kernels()
    except nvrtc.NvrtcUnavailable as err:
        _failure_reasons["vmamba2d._C_cuda"] = f"no nvcc-built extension and no NVRTC path: {err}"
        return None
    _sources["cuda"] = "nvrtc"
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
    if _sources.get("cuda") == "nvrtc":
        _failure_reasons["vmamba2d._C_cuda"] = (
            f"NVRTC targets no arch as old as {torch.cuda.get_device_name(device_index)} (sm_{major}{minor})")
        return False
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


@functools.lru_cache(maxsize=None)
def cuda_kernel_arch(device_index: int) -> Optional[int]:
    """Compute capability x 10 of the CUDA kernel code that runs on GPU ``device_index`` (e.g. 86:
    the code built for sm_86, which differs from the other archs'), or None where the extension
    holds no kernel for that GPU."""
    if not _cuda_kernel_usable_on(device_index):
        return None
    return int(cuda_extension().kernel_image_arch(device_index))


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


def kernel_module(device) -> ModuleType:
    """The extension module that runs the kernels on ``device`` (a torch.device of type cpu or cuda).

    Raises ValueError for another device type, RuntimeError (with the reason) when the extension
    is unavailable.
    """
    if device.type == "cuda":
        module, kind = cuda_extension(), "cuda"
    elif device.type == "cpu":
        module, kind = cpu_extension(), "cpu"
    else:
        raise ValueError(f"the compiled 2D scan kernels take CPU or CUDA tensors, got {device}")
    if module is None:
        raise RuntimeError(f"the {kind} 2D scan kernel is unavailable: {failure_reason(kind)}")
    return module
