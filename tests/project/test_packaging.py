"""Packaging: ``python -m build``'s sdist and wheel, and what a user gets from the wheel.

The wheel is built in isolation (no torch, as ``pip install .`` and ``pip install git+...`` build
it), so it has no compiled extension: it must carry the CPU kernel's sources and JIT-compile them
on first use. The whole chain runs once: build, check the sdist's and the wheel's files, install
the wheel into a fresh venv that reuses this environment's torch (a .pth file, no second torch
download), scan on CPU there, then check that a second process reuses the cached build. The
wheel declares every command of pyproject.toml's ``[project.scripts]``, carries every shipped config,
and in the fresh venv the commands are on the venv's bin/ and find the configs by name.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

import vmamba2d
from vmamba2d.ops.compiled import extensions

REPO_ROOT = Path(__file__).resolve().parents[2]
# Not part of a source tree: environments, build outputs, caches, compiled extensions.
SCRIPTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
NOT_SOURCE = {".git", ".venv", "build", "dist", "out", "work_dirs", "__pycache__", ".pytest_cache"}

USER_SCRIPT = """
    import sys
    import warnings

    import torch
    import vmamba2d
    from vmamba2d.ops import backend_info, selective_scan_2d
    from vmamba2d.ops.compiled import extensions

    assert vmamba2d.__file__.startswith(sys.prefix), f"not the installed package: {vmamba2d.__file__}"
    u = torch.randn(1, 2, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    B = torch.randn(1, 1, 3, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    A = -torch.rand(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) - 0.1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = selective_scan_2d(u, u, A, B, B, height=3, width=4)
    fallbacks = [str(w.message) for w in caught if "pure-PyTorch" in str(w.message)]
    assert not fallbacks, fallbacks
    torch.testing.assert_close(y, selective_scan_2d(u, u, A, B, B, height=3, width=4, backend="reference"))
    info = backend_info()
    assert info["cpu_extension_source"] == "jit" and info["auto_cpu"] == "cpu", info
    assert extensions.cpu_sources_dir().is_relative_to(sys.prefix), extensions.cpu_sources_dir()
    assert extensions.cpu_extension().openmp(), "the JIT build must parallelise with OpenMP"
    if torch.version.cuda is not None:  # a CUDA torch: the kernels come from NVRTC, no nvcc anywhere
        from vmamba2d.ops.compiled import cuda_kernels, nvrtc

        assert info["cuda_extension"] and info["cuda_compiler"] == "nvrtc" and info["nvrtc_version"], info
        assert nvrtc.kernel_source_dir().is_relative_to(sys.prefix), nvrtc.kernel_source_dir()
        image = nvrtc.compile_kernel(cuda_kernels.kernel_spec("carry_scan"), 90)
        assert image.target.arch == 90 and image.resources.registers > 0, image.resources
    print("ok", vmamba2d.__version__)
"""


def _copy_source_tree(destination: Path) -> Path:
    def ignored(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in NOT_SOURCE or n.endswith((".egg-info", ".so"))}

    return Path(shutil.copytree(REPO_ROOT, destination, ignore=ignored))


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _kernel_source_names(folder: Path) -> set[str]:
    return {p.name for pattern in extensions.CPU_SOURCE_PATTERNS for p in folder.glob(pattern)}


def _check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    required = {"setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "constraints.txt",
                "vmamba2d/__init__.py", "vmamba2d/_cuda_archs.py"}
    cuda_sources = {f"csrc/cuda/{p.name}" for p in (REPO_ROOT / "csrc" / "cuda").iterdir() if p.is_file()}
    cpu_sources = {f"csrc/cpu/{name}" for name in _kernel_source_names(REPO_ROOT / "csrc" / "cpu")}
    assert not (required | cpu_sources | cuda_sources) - names, sorted((required | cpu_sources | cuda_sources) - names)
    assert not [n for n in names if n.endswith((".so", ".pyc"))], names


def _check_wheel(wheel: Path) -> None:
    assert wheel.name.endswith("-py3-none-any.whl"), f"an isolated build compiles nothing: {wheel.name}"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"vmamba2d-{vmamba2d.__version__}.dist-info/METADATA").decode()
        entry_points = archive.read(f"vmamba2d-{vmamba2d.__version__}.dist-info/entry_points.txt").decode()
    packaged = {n.rsplit("/", 1)[1] for n in names if n.startswith("vmamba2d/csrc/cpu/")}
    assert packaged == _kernel_source_names(REPO_ROOT / "csrc" / "cpu")
    # NVRTC's kernel sources and the host driver's; never the test-only host emulation
    for required in ("cuda/scan2d_kernels.cuh", "cuda/scan2d_rows.cuh", "cuda/entries/scan2d_rows_entry.cu",
                     "nvrtc/selective_scan_2d_nvrtc.cpp"):
        assert f"vmamba2d/csrc/{required}" in names, required
    assert any(n.startswith("vmamba2d/csrc/cuda/nvrtc_std/") for n in names)
    assert not [n for n in names if "emulat" in n.rsplit("/", 1)[-1]], sorted(n for n in names if "emulat" in n)
    assert f"vmamba2d-{vmamba2d.__version__}.dist-info/licenses/LICENSE" in names
    assert re.search(rf"^Version: {re.escape(vmamba2d.__version__)}$", metadata, re.M), metadata[:300]
    assert re.search(r"^License-Expression: MIT$", metadata, re.M) and "Requires-Dist: ninja" in metadata
    assert re.search(r'^Requires-Dist: mmsegmentation==1.2.2; extra == "seg"$', metadata, re.M), metadata
    declared = dict(re.findall(r"^([\w-]+) = (\S+)$", entry_points.split("[console_scripts]", 1)[1], re.M))
    assert declared == SCRIPTS, declared
    configs = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "vmamba2d" / "configs").rglob("*")
               if p.is_file() and p.suffix in (".py", ".yaml")}
    assert configs and not configs - names, sorted(configs - names)


def _fresh_venv_reusing_torch(folder: Path) -> Path:
    """A venv whose own site-packages come first, then this environment's (torch, timm, pip)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site_packages = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    # A plain path line: this environment's .pth files (its editable vmamba2d) are not processed.
    (Path(site_packages.stdout.strip()) / "reuse_test_environment.pth").write_text(
        sysconfig.get_path("purelib") + "\n")
    return python


@pytest.mark.slow
def test_built_wheel_installs_and_jit_compiles_the_cpu_kernel(tmp_path):
    source = _copy_source_tree(tmp_path / "source")
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)], cwd=tmp_path)
    (sdist,) = dist.glob("vmamba2d-*.tar.gz")
    (wheel,) = dist.glob("vmamba2d-*.whl")
    _check_sdist(sdist)
    _check_wheel(wheel)

    python = _fresh_venv_reusing_torch(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VMAMBA2D_DISABLE_JIT", "VMAMBA2D_SCAN_BACKEND", "TORCH_EXTENSIONS_DIR")}
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "torch_extensions")
    _run([str(python), "-m", "pip", "install", "--no-input", str(wheel)], cwd=tmp_path, env=env)

    script = textwrap.dedent(USER_SCRIPT)
    first = _run([str(python), "-c", script], cwd=tmp_path, env=env)
    assert first.stdout.split() == ["ok", vmamba2d.__version__], first.stdout
    assert first.stderr.count(extensions.JIT_PROGRESS_LINE) == 1, first.stderr
    cached = _run([str(python), "-c", script], cwd=tmp_path, env=env)
    assert extensions.JIT_PROGRESS_LINE not in cached.stderr, cached.stderr

    bin_dir = python.parent
    assert sorted(p.name for p in bin_dir.glob("vmamba2d-*")) == sorted(SCRIPTS)
    usage = _run([str(bin_dir / "vmamba2d-train"), "--help"], cwd=tmp_path, env=env)
    assert usage.stdout.startswith("usage: vmamba2d-train"), usage.stdout[:200]
    listed = _run([str(bin_dir / "vmamba2d-seg-train"), "--list"], cwd=tmp_path, env=env).stdout.split()
    assert "upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512" in listed
    assert all("site-packages" in path for path in listed[1::2]), listed  # the wheel's configs, not the checkout's
    _run([str(bin_dir / "vmamba2d-tiny-data"), "data", "--only", "imagenet"], cwd=tmp_path, env=env)
    assert (tmp_path / "data" / "imagenet" / "train").is_dir()
    recipe = _run([str(python), "-c", "from vmamba2d.classification.config import resolve_train_config as r; "
                   "print(r(['--config', 'vmamba2d_tiny', '--data-dir', 'data/imagenet', '--output', 'run']).drop_path)"],
                  cwd=tmp_path, env=env)
    assert recipe.stdout.strip() == "0.2", recipe.stdout


def test_jit_build_finds_ninja_of_the_ninja_package_when_path_lacks_it(monkeypatch):
    monkeypatch.setattr(extensions.shutil, "which", lambda name: None)
    monkeypatch.setenv("PATH", "/nonexistent")
    with extensions._ninja_on_path():
        first = Path(os.environ["PATH"].split(os.pathsep)[0])
        assert os.access(first / "ninja", os.X_OK), os.environ["PATH"]
    assert os.environ["PATH"] == "/nonexistent"
