"""Build and install vmamba2d.

Extensions:
    vmamba2d._C_cpu   C++ CPU kernel from csrc/cpu (always, when torch is importable at build time)
    vmamba2d._C_nvrtc host driver of the NVRTC-compiled CUDA kernels from csrc/nvrtc (C++ compiler
                      only; when torch has CUDA)
    vmamba2d._C_cuda  the same CUDA kernels compiled ahead of time by nvcc from csrc/cuda: only with
                      VMAMBA2D_NVCC_BUILD=1 (a CUDA toolkit matching torch's CUDA is then needed).
                      Users never need it: the kernels are compiled by NVRTC at first use on a GPU.
                      It exists for kernel developers (ptxas / SASS reports of the nvcc build, the
                      GPU check's nvcc-vs-NVRTC comparison).

Build with the project's torch already installed: ``pip install --no-build-isolation -e .``.
Every wheel also carries the CPU kernel's C++ sources (csrc/cpu/*.h, *.cpp) as package data under
vmamba2d/csrc/cpu: an install built without torch (an isolated ``pip install .``, the wheel of
``python -m build``) JIT-compiles the kernel from them on first use (vmamba2d/ops/compiled/extensions.py).
It carries the CUDA kernels' device sources (csrc/cuda/*.cuh, *.h, nvrtc_std/) and the NVRTC host
driver (csrc/nvrtc) the same way: NVRTC compiles the kernels from them at first use on a GPU
(vmamba2d/ops/compiled/nvrtc.py), no nvcc needed.

Environment variables:
    TORCH_CUDA_ARCH_LIST        archs of the nvcc build (default: 7.0, 7.5, 8.0, 8.6, 9.0 + PTX of
                                9.0, minus the archs the toolkit's nvcc no longer supports; see
                                vmamba2d/_cuda_archs.py)
    VMAMBA2D_NVCC_BUILD=1       also build vmamba2d._C_cuda with nvcc (off by default)
    VMAMBA2D_SKIP_CPU_BUILD=1   never build the CPU extension (it is then JIT-compiled on first use)
    VMAMBA2D_SKIP_NVRTC_HOST_BUILD=1  never build vmamba2d._C_nvrtc (JIT-compiled on first use)
    MAX_JOBS                    parallel compile jobs (ninja)
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# -fno-trapping-math lets GCC vectorise the CPU scan's clamped exp / softplus loops (same results).
CXX_FLAGS = ["-O3", "-std=c++20", "-fno-trapping-math"]
# at::parallel_for is a header template that runs serially unless the extension itself is built
# with OpenMP; libgomp resolves to the copy torch already loaded (same soname).
OPENMP_FLAGS = ["-fopenmp"]


# csrc/<folder> files the wheel carries under vmamba2d/csrc/<folder> (the CPU kernel's JIT build,
# NVRTC's kernel sources and standard-header stand-ins, the NVRTC host driver's JIT build).
PACKAGED_SOURCES = {"cpu": ("*.h", "*.cpp"), "cuda": ("*.cuh", "*.h"), "cuda/nvrtc_std": ("*",), "cuda/entries": ("*.cu",),
                     "nvrtc": ("*.cpp",)}


def _source_paths(folder: str, *patterns: str) -> list[Path]:
    found = []
    for pattern in patterns:
        found += sorted((ROOT / "csrc" / folder).glob(pattern))
    return found


def _is_test_only(source: Path) -> bool:
    """The CUDA kernels' host emulation (scan2d_emulate.h, scan2d_emulation_bindings.h): tests build
    it from the checkout (tests/support/cuda_emulation_build.py); the wheel does not carry it."""
    return "emulat" in source.name


def _sources(folder: str, *patterns: str) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in _source_paths(folder, *patterns)]


class BuildPyWithKernelSources(build_py):
    """build_py that also copies the kernels' sources into the package (PACKAGED_SOURCES), for the
    CPU kernel's JIT build and the NVRTC path."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install compiles from the checkout's csrc
            return
        for folder, patterns in PACKAGED_SOURCES.items():
            target = Path(self.build_lib) / "vmamba2d" / "csrc" / folder
            self.mkpath(str(target))
            for source in _source_paths(folder, *patterns):
                if source.is_file() and not _is_test_only(source):
                    self.copy_file(str(source), str(target / source.name))


def _flag(name: str) -> bool:
    return os.environ.get(name, "0") == "1"


def _load_cuda_archs():
    """vmamba2d/_cuda_archs.py, loaded by path (importing the package would need torch and timm)."""
    spec = importlib.util.spec_from_file_location("vmamba2d_cuda_archs", ROOT / "vmamba2d" / "_cuda_archs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _choose_cuda_arch_list(cuda_home: str) -> str:
    """TORCH_CUDA_ARCH_LIST when set, else the default archs that this toolkit's nvcc supports.

    Prints which default archs were dropped and why (nvcc 13 no longer compiles sm_70).
    """
    archs = _load_cuda_archs()
    nvcc = str(Path(cuda_home) / "bin" / "nvcc")
    label = f"nvcc {archs.nvcc_release(nvcc)} ({nvcc})"
    supported = archs.nvcc_supported_archs(nvcc)
    override = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if override:
        unsupported = [a for a in archs.parse_arch_list(override)
                       if supported is not None and a.rstrip("af") not in supported]
        if unsupported:
            print(f"vmamba2d: warning: TORCH_CUDA_ARCH_LIST={override} names {unsupported}, which "
                  f"{label} does not list in --list-gpu-arch; the build will likely fail.")
        return override
    if supported is None:
        print(f"vmamba2d: could not run `{nvcc} --list-gpu-arch`; using the full default arch list.")
    choice = archs.default_arch_choice(supported, label)
    if choice.dropped:
        print(f"vmamba2d: default CUDA archs {', '.join(choice.dropped)} dropped: {choice.reason}.")
    return choice.arch_list


# Shared with dev/gpu/ptxas_report.py, which compiles the kernels the same way.
NVCC_FLAGS = list(_load_cuda_archs().NVCC_FLAGS)


def _extensions() -> tuple[list, dict]:
    _load_cuda_archs().point_cuda_home_at_nvcc_toolkit()
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
    except ImportError:
        print("vmamba2d: torch is not importable at build time; skipping the compiled kernels "
              "(the CPU kernel will be JIT-compiled on first use).")
        return [], {}

    extensions = []
    cpu_sources = _sources("cpu", "*.cpp")
    if _flag("VMAMBA2D_SKIP_CPU_BUILD"):
        print("vmamba2d: VMAMBA2D_SKIP_CPU_BUILD=1, not building the CPU extension.")
    elif not cpu_sources:
        print("vmamba2d: no C++ sources under csrc/cpu; not building the CPU extension.")
    else:
        extensions.append(CppExtension(
            "vmamba2d._C_cpu", cpu_sources, extra_compile_args={"cxx": CXX_FLAGS + OPENMP_FLAGS},
            extra_link_args=OPENMP_FLAGS,
        ))

    if torch.version.cuda is not None and not _flag("VMAMBA2D_SKIP_NVRTC_HOST_BUILD"):
        extensions.append(CppExtension(
            "vmamba2d._C_nvrtc", _sources("nvrtc", "*.cpp"), include_dirs=[str(ROOT / "csrc" / "cuda")],
            extra_compile_args={"cxx": ["-O2", "-std=c++20"]},
        ))

    cuda_sources = _sources("cuda", "*.cpp", "*.cu")
    if not _flag("VMAMBA2D_NVCC_BUILD"):
        print("vmamba2d: not building the nvcc CUDA extension (NVRTC compiles the CUDA kernels at first "
              "use on a GPU; VMAMBA2D_NVCC_BUILD=1 builds vmamba2d._C_cuda too).")
    elif not cuda_sources:
        print("vmamba2d: no CUDA sources under csrc/cuda; not building the CUDA extension.")
    elif torch.version.cuda is None:
        print(f"vmamba2d: torch {torch.__version__} is a CPU-only build; not building the CUDA "
              "extension (install a CUDA-enabled torch to build it).")
    elif CUDA_HOME is None:
        print("vmamba2d: no CUDA toolkit found (set CUDA_HOME or put nvcc on PATH); "
              "not building the CUDA extension.")
    else:
        os.environ["TORCH_CUDA_ARCH_LIST"] = _choose_cuda_arch_list(CUDA_HOME)
        print(f"vmamba2d: building the CUDA extension with {CUDA_HOME} for "
              f"TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}")
        extensions.append(CUDAExtension(
            "vmamba2d._C_cuda", cuda_sources,
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS},
        ))
    return extensions, {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, ext_cmdclass = _extensions()

# Metadata, dependencies, commands and package data: pyproject.toml.
setup(
    ext_modules=ext_modules,
    cmdclass={"build_py": BuildPyWithKernelSources, **ext_cmdclass},
)
