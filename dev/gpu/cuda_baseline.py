#!/usr/bin/env python3
"""An earlier version of the CUDA scan kernel, built next to this checkout's, so that one GPU run
times both on the same tensors (``dev/gpu/bench_cuda_versions.py``).

Two steps, because the GPU machine has no git history and its own torch:

    python dev/gpu/cuda_baseline.py export   # here: csrc/cuda at BASELINE_COMMIT -> build/cuda-baseline
    python dev/gpu/cuda_baseline.py build    # on the GPU machine: compiles it there as one module

``export`` needs git; ``build`` needs torch with CUDA and nvcc (``TORCH_CUDA_ARCH_LIST`` picks the
archs, as for ``setup.py``). The module keeps the kernel's own Python binding (``forward`` /
``backward``, unchanged between the versions compared) under the name ``MODULE_NAME``.
``build/`` is ignored by git; the device tool's ``carry`` takes the exported folder along.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

from built_modules import load_by_path, load_extension

REPO = Path(__file__).resolve().parents[2]
# Kernel v2: the last commit before the v3 work of issue 19 (launch planner by resident slots).
BASELINE_COMMIT = "7bdd96f"
DEFAULT_DIR = REPO / "build" / "cuda-baseline"
MODULE_NAME = "vmamba2d_cuda_baseline"
SOURCE_FOLDER = "csrc/cuda"
INFO_FILE = "BASELINE.json"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def export(commit: str, out: Path) -> dict:
    """Write ``SOURCE_FOLDER`` as it was at ``commit`` into ``out`` (replacing an earlier export),
    with ``INFO_FILE`` naming the commit. Returns that info."""
    try:
        full = _git("rev-parse", "--verify", f"{commit}^{{commit}}")
    except (OSError, subprocess.CalledProcessError) as err:
        raise SystemExit(f"cuda_baseline: cannot resolve commit {commit!r} with git here ({err}); "
                         "export on a clone that has the project's history") from err
    archive = subprocess.run(["git", "archive", "--format=tar", full, SOURCE_FOLDER], cwd=REPO,
                             capture_output=True, check=True).stdout
    target = out / SOURCE_FOLDER
    if target.exists():
        for path in sorted(target.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = tar.getmembers()
        if not any(m.isfile() for m in members):
            raise SystemExit(f"cuda_baseline: commit {full[:10]} has no files under {SOURCE_FOLDER}")
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.8.17 / 3.11.4
        tar.extractall(out, members=members, **safe)
    info = {"commit": full, "short": full[:7], "date": _git("show", "-s", "--format=%cI", full),
            "subject": _git("show", "-s", "--format=%s", full)[:120]}
    (out / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return info


def read_info(folder: Path) -> Optional[dict]:
    """The export's ``INFO_FILE``, or None when ``folder`` holds no export."""
    path = folder / INFO_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def sources(folder: Path) -> list[str]:
    """The exported kernel's translation units (the files ``setup.py`` compiles into ``_C_cuda``)."""
    src = folder / SOURCE_FOLDER
    return sorted(str(p) for pattern in ("*.cpp", "*.cu") for p in src.glob(pattern))


def built_module(folder: Path) -> Optional[Path]:
    """The compiled module in ``folder``, or None before ``build``."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = sorted(p for p in folder.glob(f"{MODULE_NAME}*") if p.name.endswith(suffixes))
    return found[0] if found else None


def build(folder: Path, jobs: int) -> Path:
    """Compile the export in ``folder`` with this checkout's nvcc / C++ flags; returns the module."""
    if read_info(folder) is None:
        raise SystemExit(f"cuda_baseline: {folder} holds no export; run `python dev/gpu/cuda_baseline.py export` "
                         "first (on a machine with git)")
    files = sources(folder)
    if not files:
        raise SystemExit(f"cuda_baseline: no .cpp / .cu files under {folder / SOURCE_FOLDER}")
    archs = load_by_path("vmamba2d_cuda_archs", REPO / "vmamba2d" / "_cuda_archs.py")
    archs.point_cuda_home_at_nvcc_toolkit()  # before torch's cpp_extension reads CUDA_HOME
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    os.environ["MAX_JOBS"] = str(jobs)  # --jobs decides, also over a MAX_JOBS inherited from make
    extension = CUDAExtension(MODULE_NAME, files,
                              extra_compile_args={"cxx": ["-O3", "-std=c++20"], "nvcc": list(archs.NVCC_FLAGS)})
    setup(name=MODULE_NAME, ext_modules=[extension], cmdclass={"build_ext": BuildExtension},
          script_args=["-q", "build_ext", "--build-lib", str(folder), "--build-temp", str(folder / "tmp")])
    module = built_module(folder)
    if module is None:
        raise SystemExit(f"cuda_baseline: the build left no {MODULE_NAME} module in {folder}")
    return module


def load(path: Path) -> ModuleType:
    """Import a module ``build`` made (``path``: the module file or its folder). Import torch first."""
    if path.is_dir():
        found = built_module(path)
        if found is None:
            raise FileNotFoundError(f"no built {MODULE_NAME} module in {path} (run `cuda_baseline.py build`)")
        path = found
    return load_extension(MODULE_NAME, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["export", "build"])
    parser.add_argument("--commit", default=BASELINE_COMMIT, help="export: the commit to take csrc/cuda from")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the export's folder")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="build: parallel compile jobs")
    args = parser.parse_args(argv)
    if args.action == "export":
        info = export(args.commit, args.dir)
        print(f"exported {SOURCE_FOLDER} of {info['short']} ({info['date']}: {info['subject']}) to {args.dir}")
    else:
        print(f"built {build(args.dir, args.jobs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
