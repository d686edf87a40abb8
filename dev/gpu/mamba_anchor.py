#!/usr/bin/env python3
"""mamba_ssm's 1D selective scan (the CUB scan the paper's Table 3 compares against), built from its
package-registry sdist as a forward-only module, so that one GPU run times it beside our 2D scan on
the same tensors (``dev/gpu/bench_anchor.py``).

Two steps, because the GPU machine has no network and its own torch:

    python dev/gpu/mamba_anchor.py fetch   # here: the pinned sdist -> build/mamba-anchor (sources only)
    python dev/gpu/mamba_anchor.py build   # on the GPU machine: compiles the forward for that GPU's arch

``fetch`` runs ``pip download`` of ``mamba-ssm==VERSION`` (the sdist, no dependencies), checks its
sha256 against ``SDIST_SHA256`` and unpacks only ``csrc/selective_scan/`` (and the package's
LICENSE) into the folder, with ``INFO_FILE`` naming version and hash. Nothing of it is committed
(``build/`` is ignored by git); the device tool's ``carry`` takes the folder along.

``build`` compiles ``selective_scan.cpp`` and the three ``selective_scan_fwd_*.cu`` files, and none of
the six backward files (they take most of the package's compile time): ``selective_scan.cpp``
references the backward template ``selective_scan_bwd_cuda<input_t, weight_t>`` for every
instantiation its dispatch macros name, so the build adds one generated C++ file
(``BACKWARD_FILE``) defining exactly those specializations, each raising "the anchor is built
forward-only". The arch is ``TORCH_CUDA_ARCH_LIST`` when set, else the current GPU's; the nvcc
flags are upstream's (``NVCC_FLAGS``) without its -gencode list. The module (binding ``fwd``) is
``MODULE_NAME``, loaded by path with ``load``.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

from built_modules import load_by_path, load_extension

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "mamba-ssm"
VERSION = "2.3.2.post1"
SDIST_NAME = f"mamba_ssm-{VERSION}.tar.gz"
SDIST_SHA256 = "104cc47e9101e5401a675fa2b784f2952b9b037f3b1dd83b5ac544394e95d028"
DEFAULT_DIR = REPO / "build" / "mamba-anchor"
SOURCE_FOLDER = "csrc/selective_scan"
INFO_FILE = "ANCHOR.json"
MODULE_NAME = "vmamba2d_mamba_anchor"
BACKWARD_FILE = "anchor_backward_forward_only.cpp"
BUILD_KEY_FILE = "BUILD_KEY.json"  # what the objects in the build folder were compiled with
FORWARD_ONLY_MESSAGE = "the anchor is built forward-only (dev/gpu/mamba_anchor.py): no backward"
# Upstream's flags for the selective-scan extension (its setup.py), less -gencode (one arch here),
# --threads (parallel over -gencode targets), --ptxas-options=-v (a report, not a setting) and
# -std=c++17: torch's cpp_extension adds the standard its headers need (C++20 for torch 2.14 here).
CXX_FLAGS = ("-O3",)
NVCC_FLAGS = ("-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
              "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
              "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
              "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math", "-lineinfo")
BACKWARD_TEMPLATE = "selective_scan_bwd_cuda"


# ------------------------------------------------------------------------------------------------
# fetch
# ------------------------------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_sdist(out: Path, python: str = sys.executable) -> Path:
    """``pip download`` of the pinned sdist into ``out`` (needs the network); returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    command = [python, "-m", "pip", "download", f"{PACKAGE}=={VERSION}", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "--dest", str(out)]
    # the sdist's setup.py runs while pip reads its metadata; this keeps it from probing CUDA there
    env = dict(os.environ, MAMBA_SKIP_CUDA_BUILD="TRUE")
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    sdist = out / SDIST_NAME
    if result.returncode != 0 or not sdist.is_file():
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
        raise SystemExit(f"mamba_anchor: `{' '.join(command)}` did not leave {sdist} (exit {result.returncode}):\n{tail}")
    return sdist


def unpack_sources(sdist: Path, out: Path, expected_sha256: Optional[str] = SDIST_SHA256) -> dict:
    """Check ``sdist``'s hash (when ``expected_sha256`` is given) and extract only its
    ``SOURCE_FOLDER`` files and LICENSE into ``out`` (replacing an earlier unpack); writes and
    returns the info (version, sdist name, sha256, files)."""
    digest = sha256_of(sdist)
    if expected_sha256 is not None and digest != expected_sha256:
        raise SystemExit(f"mamba_anchor: {sdist.name} has sha256 {digest}, expected {expected_sha256} "
                         f"(the pinned {PACKAGE} {VERSION} sdist)")
    wanted: list[tuple[tarfile.TarInfo, str]] = []
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) != 2 or not member.isfile():
                continue
            inner = parts[1]
            in_sources = inner.startswith(SOURCE_FOLDER + "/") and "/" not in inner[len(SOURCE_FOLDER) + 1:]
            if in_sources or inner == "LICENSE":
                wanted.append((member, inner))
        if not any(inner.startswith(SOURCE_FOLDER) for _, inner in wanted):
            raise SystemExit(f"mamba_anchor: {sdist.name} has no files under <top>/{SOURCE_FOLDER}/")
        target = out / SOURCE_FOLDER
        if target.exists():
            for path in target.iterdir():
                path.unlink()
        target.mkdir(parents=True, exist_ok=True)
        for member, inner in wanted:
            data = tar.extractfile(member).read()  # written by name: no path from the archive is trusted
            (out / inner).write_bytes(data)
    info = {"package": PACKAGE, "version": VERSION, "sdist": sdist.name, "sha256": digest,
            "files": sorted(inner for _, inner in wanted)}
    (out / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return info


def read_info(folder: Path) -> Optional[dict]:
    """The fetch's ``INFO_FILE``, or None when ``folder`` holds no fetched sources."""
    path = folder / INFO_FILE
    return json.loads(path.read_text()) if path.is_file() else None


# ------------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------------
def forward_sources(source_dir: Path) -> list[Path]:
    """The translation units of the forward: the binding file and the ``selective_scan_fwd_*.cu``."""
    binding = source_dir / "selective_scan.cpp"
    forwards = sorted(source_dir.glob("selective_scan_fwd_*.cu"))
    if not binding.is_file() or not forwards:
        raise SystemExit(f"mamba_anchor: {source_dir} lacks selective_scan.cpp or selective_scan_fwd_*.cu "
                         "(run `python dev/gpu/mamba_anchor.py fetch` first)")
    return [binding, *forwards]


def _macro_bodies(text: str) -> dict[str, str]:
    """``#define NAME(...) body`` of ``text`` (continuation lines joined), by name."""
    joined = text.replace("\\\n", " ")
    return {m.group(1): m.group(2) for m in re.finditer(r"^[ \t]*#define[ \t]+(\w+)\([^)]*\)(.*)$", joined, re.M)}


def referenced_instantiations(cpp_text: str, template: str = BACKWARD_TEMPLATE) -> list[tuple[str, str]]:
    """The (input_t, weight_t) pairs ``template<input_t, weight_t>`` is called with in ``cpp_text``:
    each call must sit inside two dispatch macros (one defining ``input_t``, one ``weight_t``), whose
    ``using input_t = ...;`` / ``using weight_t = ...;`` branches give the types, in their order."""
    bodies = _macro_bodies(cpp_text)
    code = "\n".join(line for line in cpp_text.splitlines() if not line.lstrip().startswith("#"))
    pairs: list[tuple[str, str]] = []
    calls = list(re.finditer(rf"\b{re.escape(template)}\s*<\s*input_t\s*,\s*weight_t\s*>\s*\(", code))
    if not calls:
        raise SystemExit(f"mamba_anchor: selective_scan.cpp never calls {template}<input_t, weight_t>; "
                         "its layout changed, the forward-only build does not know what to define")
    for call in calls:
        before = code[:call.start()]
        types = {}
        for macro in reversed(re.findall(r"\b(DISPATCH_\w+)\s*\(", before)):
            for alias in ("input_t", "weight_t"):
                found = re.findall(rf"using\s+{alias}\s*=\s*([^;]+?)\s*;", bodies.get(macro, ""))
                if found and alias not in types:
                    types[alias] = found
            if len(types) == 2:
                break
        if len(types) != 2:
            raise SystemExit(f"mamba_anchor: cannot tell which types the dispatch macros around a call of {template} "
                             "name in selective_scan.cpp")
        for pair in itertools.product(types["input_t"], types["weight_t"]):
            if pair not in pairs:
                pairs.append(pair)
    return pairs


def backward_source(pairs: Sequence[tuple[str, str]]) -> str:
    """C++ defining ``BACKWARD_TEMPLATE<input_t, weight_t>`` for each pair, each raising
    ``FORWARD_ONLY_MESSAGE`` (a c10::Error: RuntimeError in Python) instead of running a backward."""
    lines = [
        "// Generated by vmamba2d's dev/gpu/mamba_anchor.py: the backward of the forward-only anchor build.",
        "// selective_scan.cpp's bwd binding references these; their kernels are not compiled.",
        "#include <cstdint>",
        "#include <cuda_runtime_api.h>",
        "#include <c10/util/BFloat16.h>",
        "#include <c10/util/Exception.h>",
        "#include <c10/util/Half.h>",
        "#include <c10/util/complex.h>",
        '#include "selective_scan.h"',
        "",
        "template <typename input_t, typename weight_t>",
        f"void {BACKWARD_TEMPLATE}(SSMParamsBwd &params, cudaStream_t stream);",
    ]
    for input_t, weight_t in pairs:
        lines += ["", "template <>",
                  f"void {BACKWARD_TEMPLATE}<{input_t}, {weight_t}>(SSMParamsBwd &, cudaStream_t) {{",
                  f'    TORCH_CHECK(false, "{FORWARD_ONLY_MESSAGE} ({input_t}, {weight_t})");',
                  "}"]
    return "\n".join(lines) + "\n"


def build_arch(environ: Optional[dict] = None) -> str:
    """``TORCH_CUDA_ARCH_LIST`` when set, else the current GPU's capability ("9.0")."""
    environ = os.environ if environ is None else environ
    if environ.get("TORCH_CUDA_ARCH_LIST"):
        return environ["TORCH_CUDA_ARCH_LIST"]
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("mamba_anchor: no GPU visible and TORCH_CUDA_ARCH_LIST unset: which arch to build for? "
                         "(e.g. TORCH_CUDA_ARCH_LIST=9.0)")
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def built_module(folder: Path) -> Optional[Path]:
    """The compiled module in ``folder``'s build directory, or None before ``build``."""
    found = (folder / "build" / f"{MODULE_NAME}.so")
    return found if found.is_file() else None


def build(folder: Path, jobs: int, verbose: bool = False) -> Path:
    """Compile the forward-only module from the sources ``fetch`` put in ``folder`` (into
    ``folder``/build); returns the module file. Needs torch with CUDA headers and nvcc, not a GPU
    when TORCH_CUDA_ARCH_LIST is set."""
    if read_info(folder) is None:
        raise SystemExit(f"mamba_anchor: {folder} holds no fetched sources; run `python dev/gpu/mamba_anchor.py fetch` "
                         "(make mamba-anchor) where the network works, and carry that folder here")
    source_dir = folder / SOURCE_FOLDER
    sources = forward_sources(source_dir)
    pairs = referenced_instantiations((source_dir / "selective_scan.cpp").read_text())
    os.environ["TORCH_CUDA_ARCH_LIST"] = build_arch()
    os.environ["MAX_JOBS"] = str(jobs)  # --jobs decides, also over a MAX_JOBS inherited from make
    archs = load_by_path("vmamba2d_cuda_archs", REPO / "vmamba2d" / "_cuda_archs.py")
    archs.point_cuda_home_at_nvcc_toolkit()  # before torch's cpp_extension reads CUDA_HOME
    _put_ninja_on_path()
    import torch
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        raise SystemExit("mamba_anchor: torch's cpp_extension.load needs ninja, which is neither on PATH nor beside "
                         f"{sys.executable}")
    out = folder / "build"
    key = {"torch": torch.__version__, "arch": os.environ["TORCH_CUDA_ARCH_LIST"], "cxx": list(CXX_FLAGS),
           "nvcc": list(NVCC_FLAGS), "sources": str(source_dir.resolve())}
    _start_build_dir(out, key)
    backward = out / BACKWARD_FILE
    text = backward_source(pairs)
    if not backward.is_file() or backward.read_text() != text:  # unchanged: ninja keeps its object
        backward.write_text(text)

    cpp_extension.load(name=MODULE_NAME, sources=[str(p) for p in (*sources, backward)],
                       extra_cflags=list(CXX_FLAGS), extra_cuda_cflags=list(NVCC_FLAGS),
                       extra_include_paths=[str(source_dir)], build_directory=str(out), with_cuda=True,
                       verbose=verbose)
    module = built_module(folder)
    if module is None:
        raise SystemExit(f"mamba_anchor: the build left no {MODULE_NAME}.so in {out}")
    return module


def _put_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH, which lacks the venv's bin folder (where pip put ninja) when
    the venv's python runs without the venv activated."""
    beside = Path(sys.executable).parent
    if shutil.which("ninja") is None and (beside / "ninja").is_file():
        os.environ["PATH"] = os.pathsep.join(filter(None, [str(beside), os.environ.get("PATH", "")]))


def _start_build_dir(out: Path, key: dict) -> None:
    """Empty ``out`` unless its ``BUILD_KEY_FILE`` equals ``key``: objects of another torch, arch or
    checkout (a folder carried from the machine that validated the build) must not be linked in,
    and ninja would take them for up to date when they are newer than the sources."""
    stamp = out / BUILD_KEY_FILE
    if out.is_dir() and (not stamp.is_file() or json.loads(stamp.read_text()) != key):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(key, indent=1) + "\n")


def load(path: Path) -> ModuleType:
    """Import the module ``build`` made (``path``: the module file or the fetch folder); import
    torch first. Its ``fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus)`` returns [y, x]."""
    if path.is_dir():
        found = built_module(path)
        if found is None:
            raise FileNotFoundError(f"no built {MODULE_NAME} module in {path / 'build'} (run `mamba_anchor.py build`)")
        path = found
    return load_extension(MODULE_NAME, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["fetch", "build"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the anchor's folder")
    parser.add_argument("--sdist", type=Path, help="fetch: unpack this already downloaded sdist instead of downloading")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="build: parallel compile jobs")
    parser.add_argument("--verbose", action="store_true", help="build: show the compile commands")
    args = parser.parse_args(argv)
    if args.action == "fetch":
        sdist = args.sdist if args.sdist is not None else download_sdist(args.dir)
        info = unpack_sources(sdist, args.dir)
        print(f"fetched {PACKAGE} {info['version']} ({info['sdist']}, sha256 {info['sha256'][:16]}...): "
              f"{len(info['files'])} files into {args.dir}")
    else:
        start = time.monotonic()
        module = build(args.dir, args.jobs, args.verbose)
        print(f"built {module} for TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']} "
              f"in {time.monotonic() - start:.0f} s ({args.jobs} jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
