"""Compiling the CUDA kernels with NVRTC: the toolchain, the kernels' sources, one compile.

A CUDA build of torch brings everything this needs, with no nvcc and no GPU: the NVRTC library
(``nvidia-cuda-nvrtc``), the CUDA headers (``nvidia/cu13/include``; ``nvidia/cuda_runtime/include``
with the cu12 wheels) and ``cuda-bindings`` (``cuda.bindings.nvrtc``). One compile is one
:class:`~vmamba2d.ops.compiled.cuda_kernels.KernelSpec` (a kernel instantiation) for one arch: a
cubin for the archs this NVRTC targets, PTX of its newest arch for newer GPUs (the driver
JIT-compiles it). ptxas's resource report (``--ptxas-options=-v``) comes back with the image.

The device code is the same ``csrc/cuda`` headers the host emulation compiles; NVRTC ships no C++
standard headers, so ``csrc/cuda/nvrtc_std`` supplies the few pieces the kernels use.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vmamba2d.ops.compiled.cuda_kernels import KernelSpec

PACKAGE_DIR = Path(__file__).resolve().parents[2]
# A wheel carries the kernel sources as package data (setup.py copies them); a checkout and an
# editable install read the repository's csrc/cuda.
KERNEL_SOURCE_DIRS = (PACKAGE_DIR / "csrc" / "cuda", PACKAGE_DIR.parent / "csrc" / "cuda")
STD_SUBDIR = "nvrtc_std"
# The nvcc build's flags (vmamba2d/_cuda_archs.py NVCC_FLAGS and torch's COMMON_NVCC_FLAGS) in
# NVRTC's spelling; -default-device is NVRTC's form of --expt-relaxed-constexpr plus nvcc's
# implicit device lambdas (NVRTC rejects unannotated functions otherwise).
COMPILE_OPTIONS = (
    "-std=c++20",
    "-lineinfo",
    "-default-device",
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--ptxas-options=-v",
)
# Files whose content pins the CUDA headers' version in the cache key.
HEADER_FINGERPRINT_FILES = ("cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp")
INSTALL_HINT = ("install a CUDA build of torch (its wheels bring nvidia-cuda-nvrtc, the CUDA headers "
                "and cuda-bindings), or `pip install cuda-bindings nvidia-cuda-nvrtc` matching torch's CUDA")


class NvrtcUnavailable(RuntimeError):
    """NVRTC, cuda-bindings or the CUDA headers are missing; the message names which and how to get it."""


class NvrtcCompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries NVRTC's log."""


@dataclass(frozen=True)
class Toolchain:
    """What one compile needs: the NVRTC bindings, its version and archs, and the include folders."""

    nvrtc: object  # the cuda.bindings.nvrtc module
    version: tuple[int, int]
    archs: tuple[int, ...]  # the sm_XX (compute capability x 10) NVRTC emits cubins for
    cuda_include: Path
    kernel_dir: Path

    @property
    def std_dir(self) -> Path:
        return self.kernel_dir / STD_SUBDIR

    @property
    def version_text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


@dataclass(frozen=True)
class Target:
    """What to emit for a GPU arch: a cubin for ``sm_<arch>``, or PTX of ``compute_<arch>``."""

    arch: int
    kind: str  # "cubin" or "ptx"

    @property
    def option(self) -> str:
        prefix = "sm" if self.kind == "cubin" else "compute"
        return f"--gpu-architecture={prefix}_{self.arch}"


@dataclass(frozen=True)
class Resources:
    """ptxas's figures for one kernel image (all zero / unknown for PTX, which has none yet)."""

    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    static_smem: int = 0
    barriers: int = 0


@dataclass(frozen=True)
class CompiledKernel:
    """One NVRTC compile: the image, the symbol to load from it and ptxas's report."""

    spec_name: str
    gpu_arch: int  # the device arch it was compiled for
    target: Target
    image: bytes
    lowered_name: str
    resources: Resources = field(default_factory=Resources)
    log: str = ""
    seconds: float = 0.0


def _check(result: tuple, what: str) -> tuple:
    """The values after cuda-bindings' status; raises on a non-success status."""
    status = result[0]
    if int(status) != 0:
        raise RuntimeError(f"{what} failed: {status!r}")
    return result[1:]


def kernel_source_dir() -> Optional[Path]:
    """The folder of the CUDA kernel sources (package data, else the checkout's csrc/cuda)."""
    for folder in KERNEL_SOURCE_DIRS:
        if (folder / "scan2d_kernels.cuh").is_file() and (folder / STD_SUBDIR).is_dir():
            return folder
    return None


def _site_dirs() -> list[Path]:
    found = []
    for entry in sys.path:
        path = Path(entry or ".")
        if path.name in ("site-packages", "dist-packages") and path.is_dir():
            found.append(path)
    return found


def cuda_include_candidates() -> list[Path]:
    """Where the CUDA headers are looked for, in order: the NVIDIA wheels next to torch (cu13, then
    cu12's layout), $CUDA_HOME / $CUDA_PATH, /usr/local/cuda."""
    candidates = []
    for site in _site_dirs():
        nvidia = site / "nvidia"
        candidates += [nvidia / "cu13" / "include", nvidia / "cuda_runtime" / "include",
                       nvidia / "cuda_nvrtc" / "include"]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    return candidates


def find_cuda_include() -> Optional[Path]:
    """The first candidate folder that has cuda_fp16.h and cuda_bf16.h."""
    for folder in cuda_include_candidates():
        if (folder / "cuda_fp16.h").is_file() and (folder / "cuda_bf16.h").is_file():
            return folder
    return None


@functools.lru_cache(maxsize=None)
def find_toolchain() -> Toolchain:
    """The NVRTC toolchain of this environment (looked up once per process).

    Raises:
        NvrtcUnavailable: cuda-bindings, the NVRTC library, the CUDA headers or the kernel sources
            are missing (the message names which, and how to get them).
    """
    try:
        from cuda.bindings import nvrtc
    except ImportError as err:
        raise NvrtcUnavailable(f"cuda-bindings is not importable ({err}); {INSTALL_HINT}") from err
    try:
        major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
        (archs,) = _check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    except Exception as err:  # the bindings load libnvrtc lazily: a missing library shows here
        raise NvrtcUnavailable(f"the NVRTC library could not be loaded ({err}); {INSTALL_HINT}") from err
    include = find_cuda_include()
    if include is None:
        looked = ", ".join(str(p) for p in cuda_include_candidates())
        raise NvrtcUnavailable(f"no CUDA headers (cuda_fp16.h, cuda_bf16.h) found in {looked}; {INSTALL_HINT}")
    kernel_dir = kernel_source_dir()
    if kernel_dir is None:
        looked = ", ".join(str(p) for p in KERNEL_SOURCE_DIRS)
        raise NvrtcUnavailable(f"the CUDA kernel sources are missing (looked in {looked}); reinstall vmamba2d")
    return Toolchain(nvrtc=nvrtc, version=(int(major), int(minor)), archs=tuple(sorted(int(a) for a in archs)),
                     cuda_include=include, kernel_dir=kernel_dir)


def target_for(arch: int, supported: tuple[int, ...]) -> Target:
    """A cubin when NVRTC targets ``arch``; PTX of the newest arch it knows for a newer GPU.

    Raises:
        ValueError: ``arch`` is older than every arch this NVRTC targets.
    """
    if arch in supported:
        return Target(arch, "cubin")
    newer_known = [a for a in supported if a <= arch]
    if not newer_known:
        raise ValueError(f"arch must be one NVRTC {supported} targets or newer, got sm_{arch}")
    return Target(max(newer_known), "ptx")


_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_ANGLE_INCLUDE = re.compile(r"^\s*#\s*include\s*<([^>]+)>", re.MULTILINE)


def source_closure(entry: str, kernel_dir: Path) -> dict[str, bytes]:
    """The entry file and every file of ``kernel_dir`` it includes, transitively: relative path ->
    content (quoted includes from kernel_dir, angle includes from its nvrtc_std when there)."""
    found: dict[str, bytes] = {}
    pending = [entry]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        data = (kernel_dir / name).read_bytes()
        found[name] = data
        text = data.decode("utf-8", errors="replace")
        pending += [m for m in _QUOTED_INCLUDE.findall(text) if (kernel_dir / m).is_file()]
        pending += [f"{STD_SUBDIR}/{m}" for m in _ANGLE_INCLUDE.findall(text)
                    if (kernel_dir / STD_SUBDIR / m).is_file()]
    return found


def program_source(spec: KernelSpec) -> str:
    """The NVRTC program's text: the spec's defines, then its source file."""
    lines = [f"#define {name} {value}".rstrip() for name, value in spec.defines]
    lines.append(f'#include "{spec.source}"')
    return "\n".join(lines) + "\n"


def compile_options(toolchain: Toolchain, target: Target) -> list[str]:
    return [target.option, *COMPILE_OPTIONS, f"-I{toolchain.std_dir}", f"-I{toolchain.kernel_dir}",
            f"-I{toolchain.cuda_include}"]


def cache_key(toolchain: Toolchain, spec: KernelSpec, target: Target) -> str:
    """sha256 of everything the image depends on: the kernel's sources, the program, the options
    (folders left out, so a moved install keeps its cache), the target, NVRTC's version and the
    CUDA headers' content."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

    add("format", b"vmamba2d-nvrtc-1")
    add("program", program_source(spec).encode())
    add("symbol", spec.symbol.encode())
    add("options", "\0".join(COMPILE_OPTIONS).encode())
    add("target", target.option.encode())
    add("nvrtc", toolchain.version_text.encode())
    for name, data in sorted(source_closure(spec.source, toolchain.kernel_dir).items()):
        add("source:" + name, data)
    for name in HEADER_FINGERPRINT_FILES:
        path = toolchain.cuda_include / name
        add("header:" + name, path.read_bytes() if path.is_file() else b"")
    return digest.hexdigest()


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def parse_resources(log: str, symbol: str) -> Resources:
    """ptxas's -v figures of entry ``symbol`` in an NVRTC program log (zeros when absent)."""
    values = {}
    current = None
    for line in log.splitlines():
        if match := _ENTRY.search(line):
            current = match.group(1)
        elif current != symbol:
            continue
        elif match := _FRAME.search(line):
            values["stack_bytes"], values["spill_stores"], values["spill_loads"] = map(int, match.groups())
        elif match := _USED.search(line):
            values["registers"] = int(match.group(1))
            if smem := _SMEM.search(line):
                values["static_smem"] = int(smem.group(1))
            if barriers := _BARRIERS.search(line):
                values["barriers"] = int(barriers.group(1))
    return Resources(**values)


def _program_log(nvrtc, program) -> str:
    (size,) = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
    buffer = bytearray(size)  # mutable: see _image
    _check(nvrtc.nvrtcGetProgramLog(program, buffer), "nvrtcGetProgramLog")
    return bytes(buffer).rstrip(b"\0 ").decode("utf-8", errors="replace")


def _image(nvrtc, program, kind: str) -> bytes:
    # NVRTC writes into the buffer, so it must be mutable: an empty log has size 1, b" " * 1 is
    # CPython's shared one-byte object, and overwriting it broke torch.save for the whole process
    if kind == "cubin":
        (size,) = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        buffer = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(program, buffer), "nvrtcGetCUBIN")
    else:
        (size,) = _check(nvrtc.nvrtcGetPTXSize(program), "nvrtcGetPTXSize")
        buffer = bytearray(size)
        _check(nvrtc.nvrtcGetPTX(program, buffer), "nvrtcGetPTX")
    return bytes(buffer)


def compile_kernel(spec: KernelSpec, arch: int, toolchain: Optional[Toolchain] = None) -> CompiledKernel:
    """Compile one kernel instantiation for GPU arch ``arch`` (compute capability x 10, e.g. 90).

    Raises:
        NvrtcUnavailable: no toolchain (see find_toolchain).
        NvrtcCompileError: NVRTC rejected the program; the message holds its log.
        ValueError: ``arch`` is older than every arch NVRTC targets.
    """
    toolchain = toolchain or find_toolchain()
    nvrtc = toolchain.nvrtc
    target = target_for(arch, toolchain.archs)
    options = [o.encode() for o in compile_options(toolchain, target)]
    start = time.perf_counter()
    (program,) = _check(nvrtc.nvrtcCreateProgram(program_source(spec).encode(), f"{spec.file_stem}.nvrtc.cu".encode(),
                                                 0, [], []), "nvrtcCreateProgram")
    try:
        if spec.name_expression:
            _check(nvrtc.nvrtcAddNameExpression(program, spec.symbol.encode()), "nvrtcAddNameExpression")
        status = nvrtc.nvrtcCompileProgram(program, len(options), options)[0]
        log = _program_log(nvrtc, program)
        if int(status) != 0:
            raise NvrtcCompileError(f"NVRTC {toolchain.version_text} could not compile {spec.name} for "
                                    f"{target.option.split('=')[1]} ({status!r}):\n{log}")
        if spec.name_expression:
            (lowered,) = _check(nvrtc.nvrtcGetLoweredName(program, spec.symbol.encode()), "nvrtcGetLoweredName")
            lowered = lowered.decode()
        else:
            lowered = spec.symbol
        image = _image(nvrtc, program, target.kind)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    resources = parse_resources(log, lowered) if target.kind == "cubin" else Resources()
    return CompiledKernel(spec_name=spec.name, gpu_arch=arch, target=target, image=image, lowered_name=lowered,
                          resources=resources, log=log, seconds=time.perf_counter() - start)
