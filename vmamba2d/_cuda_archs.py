"""CUDA build settings: the default architectures (and which of them nvcc supports), nvcc flags.

Standard library only: ``setup.py`` and ``dev/gpu/ptxas_report.py`` load this file by path, before
(or without) torch and the rest of the package.

Arch strings use torch's ``TORCH_CUDA_ARCH_LIST`` notation: ``"8.6"`` is sm_86; a ``+PTX`` suffix
also embeds PTX for that arch, which newer GPUs JIT-compile at load.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# V100 (7.0), T4 / RTX 20xx (7.5), A100 (8.0), RTX 30xx / A10 (8.6), H100 / H200 (9.0); PTX of the
# newest lets later GPUs (Blackwell, ...) JIT the kernels.
DEFAULT_ARCHS = ("7.0", "7.5", "8.0", "8.6", "9.0")
DEFAULT_PTX_ARCH = "9.0"
# Our nvcc flags for the kernels (torch's BuildExtension adds its own COMMON_NVCC_FLAGS and -gencode).
NVCC_FLAGS = ("-O3", "-std=c++20", "-lineinfo", "--expt-relaxed-constexpr")


@dataclass(frozen=True)
class ArchChoice:
    """The arch list to build, and the requested archs left out (with why)."""

    arch_list: str  # TORCH_CUDA_ARCH_LIST value, e.g. "7.5;8.0;8.6;9.0+PTX"
    archs: tuple[str, ...]  # the "X.Y" archs that get machine code
    dropped: tuple[str, ...]
    reason: str  # why ``dropped`` were left out ("" when none were)


def arch_from_compute_name(name: str) -> Optional[str]:
    """``"compute_86"`` / ``"sm_86"`` -> ``"8.6"``, ``"compute_100"`` -> ``"10.0"``; None otherwise."""
    match = re.fullmatch(r"(?:compute|sm)_(\d+)(\d)[af]?", name.strip())
    return None if match is None else f"{match.group(1)}.{match.group(2)}"


def sm_name(arch: str) -> str:
    """``"8.6"`` -> ``"sm_86"``."""
    major, minor = arch.split(".")
    return f"sm_{major}{minor}"


def nvcc_supported_archs(nvcc: str) -> Optional[frozenset[str]]:
    """The virtual archs ``nvcc --list-gpu-arch`` lists, as ``"X.Y"``; None if nvcc cannot be run."""
    try:
        listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True,
                                timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    archs = {arch_from_compute_name(line) for line in listed.split()}
    archs.discard(None)
    return frozenset(archs) or None


def nvcc_release(nvcc: str) -> str:
    """``"13.0"`` from ``nvcc --version``, or ``"unknown"``."""
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(r"release (\d+\.\d+)", text)
    return match.group(1) if match else "unknown"


def default_arch_choice(supported: Optional[frozenset[str]], nvcc_label: str = "nvcc") -> ArchChoice:
    """``DEFAULT_ARCHS`` (+PTX of ``DEFAULT_PTX_ARCH``) intersected with the archs nvcc supports.

    ``supported`` None (nvcc could not be queried) keeps the whole default list. When the PTX arch
    itself is unsupported, the PTX goes with the newest arch that is kept.
    """
    if supported is None:
        kept, dropped, reason = list(DEFAULT_ARCHS), [], ""
    else:
        kept = [a for a in DEFAULT_ARCHS if a in supported]
        dropped = [a for a in DEFAULT_ARCHS if a not in supported]
        reason = (f"{nvcc_label} does not support them (not in `nvcc --list-gpu-arch`); "
                  "build with an older CUDA toolkit for those GPUs") if dropped else ""
    if not kept:
        raise RuntimeError(f"{nvcc_label} supports none of the default CUDA archs {DEFAULT_ARCHS}; "
                           "set TORCH_CUDA_ARCH_LIST explicitly")
    ptx = DEFAULT_PTX_ARCH if DEFAULT_PTX_ARCH in kept else kept[-1]
    arch_list = ";".join(a + ("+PTX" if a == ptx else "") for a in kept)
    return ArchChoice(arch_list, tuple(kept), tuple(dropped), reason)


def parse_arch_list(arch_list: str) -> tuple[str, ...]:
    """The ``"X.Y"`` archs of a ``TORCH_CUDA_ARCH_LIST`` value (``+PTX`` stripped, named archs
    such as "Hopper" left out, since only torch resolves those)."""
    archs = []
    for item in re.split(r"[;\s,]+", arch_list.strip()):
        arch = item.split("+")[0]
        if re.fullmatch(r"\d+\.\d+[af]?", arch) and arch not in archs:
            archs.append(arch)
    return tuple(archs)


def point_cuda_home_at_nvcc_toolkit() -> None:
    """Set CUDA_HOME (when unset) to the toolkit that the nvcc on PATH really belongs to.

    torch guesses CUDA_HOME as the folder above the first nvcc on PATH; when that nvcc is a wrapper
    script (e.g. /usr/local/bin/nvcc running /usr/local/cuda-13.0/bin/nvcc) the guess has no CUDA
    headers or libcudart and the CUDA extension fails to compile and link. ``nvcc --dryrun``
    prints the real root as ``TOP=``.
    """
    nvcc = shutil.which("nvcc")
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or nvcc is None:
        return
    try:
        dryrun = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True, text=True, timeout=120,
        )
    except (OSError, subprocess.SubprocessError):
        return
    for line in (dryrun.stdout + dryrun.stderr).splitlines():
        if line.startswith("#$ TOP="):
            top = Path(line.split("=", 1)[1].strip()).resolve()
            if (top / "include" / "cuda_runtime_api.h").is_file():
                os.environ["CUDA_HOME"] = str(top)
            return
