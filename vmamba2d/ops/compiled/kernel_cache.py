"""On-disk cache of the NVRTC-compiled CUDA kernels.

Folder: ``$VMAMBA2D_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/vmamba2d`` (``~/.cache/vmamba2d``),
then ``nvrtc/<key[:2]>/<key>.bin`` with ``key`` = :func:`vmamba2d.ops.compiled.nvrtc.cache_key`
(sources, options, target, NVRTC version, CUDA headers). One file per kernel image: a magic line,
a JSON header (its key, the symbol, ptxas's report, the image's sha256) and the image.

Writes are compile-then-rename: a process writes a private temporary file in the same folder and
``os.replace``\\ s it into place, so concurrent first uses (DDP ranks, dataloader workers) may each
compile but readers only ever see a whole entry. An entry that fails its checks (torn, truncated,
another key's) is compiled again with a one-line warning. A cache folder that cannot be written
falls back to a per-user temporary folder with a warning.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
import threading
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from vmamba2d.ops.compiled import nvrtc
from vmamba2d.ops.compiled.cuda_kernels import KernelSpec

CACHE_ENV = "VMAMBA2D_CACHE_DIR"
MAGIC = b"vmamba2d-kernel-1\n"
_lock = threading.Lock()
_announced = False


def default_cache_dir() -> Path:
    """$VMAMBA2D_CACHE_DIR, else $XDG_CACHE_HOME/vmamba2d, else ~/.cache/vmamba2d."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "vmamba2d"


def _fallback_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"vmamba2d-cache-{os.getuid() if hasattr(os, 'getuid') else 'user'}"


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-", delete=True)
        probe.close()
        return True
    except OSError:
        return False


@functools.lru_cache(maxsize=None)
def _usable_dir(requested: Path) -> Path:
    if _writable(requested):
        return requested
    fallback = _fallback_dir()
    warnings.warn(f"vmamba2d: the kernel cache folder {requested} is not writable; using {fallback} "
                  f"(set {CACHE_ENV} to a writable folder to keep compiled kernels)", RuntimeWarning, stacklevel=3)
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def cache_dir(requested: Optional[Path] = None) -> Path:
    """The folder entries are read from and written to: ``requested`` (default_cache_dir() when
    None) when writable, else the temporary fallback (warned once per folder)."""
    return _usable_dir(Path(requested) if requested is not None else default_cache_dir())


def entry_path(folder: Path, key: str) -> Path:
    return folder / "nvrtc" / key[:2] / f"{key}.bin"


def encode_entry(key: str, kernel: nvrtc.CompiledKernel) -> bytes:
    header = {
        "key": key,
        "spec": kernel.spec_name,
        "gpu_arch": kernel.gpu_arch,
        "target": asdict(kernel.target),
        "lowered_name": kernel.lowered_name,
        "resources": asdict(kernel.resources),
        "seconds": kernel.seconds,
        "image_sha256": hashlib.sha256(kernel.image).hexdigest(),
        "image_bytes": len(kernel.image),
    }
    text = json.dumps(header, sort_keys=True).encode()
    return MAGIC + len(text).to_bytes(4, "little") + text + kernel.image


class BadEntry(ValueError):
    """A cache file that is not a whole entry of the expected key."""


def decode_entry(data: bytes, key: str) -> nvrtc.CompiledKernel:
    """The kernel of a cache file's bytes; raises BadEntry saying what is wrong with them."""
    if not data.startswith(MAGIC):
        raise BadEntry("not a vmamba2d kernel entry")
    start = len(MAGIC) + 4
    size = int.from_bytes(data[len(MAGIC):start], "little")
    try:
        header = json.loads(data[start:start + size])
    except ValueError as err:
        raise BadEntry(f"unreadable header ({err})") from None
    if not isinstance(header, dict) or header.get("key") != key:
        raise BadEntry("written for another key")
    image = data[start + size:]
    if len(image) != header.get("image_bytes") or hashlib.sha256(image).hexdigest() != header.get("image_sha256"):
        raise BadEntry("image truncated or altered")
    try:
        return nvrtc.CompiledKernel(
            spec_name=header["spec"], gpu_arch=header["gpu_arch"], target=nvrtc.Target(**header["target"]),
            image=image, lowered_name=header["lowered_name"], resources=nvrtc.Resources(**header["resources"]),
            seconds=header["seconds"])
    except (KeyError, TypeError) as err:
        raise BadEntry(f"incomplete header ({err})") from None


def write_entry(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (private temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def lookup(spec: KernelSpec, arch: int, folder: Optional[Path] = None,
           toolchain: Optional[nvrtc.Toolchain] = None) -> tuple[Optional[nvrtc.CompiledKernel], Path, str]:
    """The cached kernel (None when absent or bad), its entry path and key. Reads only."""
    toolchain = toolchain or nvrtc.find_toolchain()
    key = nvrtc.cache_key(toolchain, spec, nvrtc.target_for(arch, toolchain.archs))
    path = entry_path(cache_dir(folder), key)
    try:
        return decode_entry(path.read_bytes(), key), path, key
    except (FileNotFoundError, BadEntry):
        return None, path, key


def _announce(kernel: nvrtc.CompiledKernel, folder: Path) -> None:
    global _announced
    with _lock:
        if _announced:
            return
        _announced = True
    print(f"vmamba2d: compiled the CUDA kernel {kernel.spec_name} for sm_{kernel.gpu_arch} with NVRTC in "
          f"{kernel.seconds:.1f} s (each kernel the model uses compiles once, ~1-3 s; cached in {folder}; "
          f"`python -m vmamba2d.ops.precompile` compiles them ahead of time)", file=sys.stderr)


def get_kernel(spec: KernelSpec, arch: int, folder: Optional[Path] = None,
               toolchain: Optional[nvrtc.Toolchain] = None, announce: bool = True) -> tuple[nvrtc.CompiledKernel, bool]:
    """The kernel ``spec`` for GPU arch ``arch`` from the cache, compiled and stored on a miss.

    Returns (kernel, was_cached). A bad entry is compiled again with a one-line warning. The first
    compile of the process prints its time once (``announce``).

    Raises:
        NvrtcUnavailable / NvrtcCompileError: see nvrtc.compile_kernel.
    """
    toolchain = toolchain or nvrtc.find_toolchain()
    target = nvrtc.target_for(arch, toolchain.archs)
    key = nvrtc.cache_key(toolchain, spec, target)
    root = cache_dir(folder)
    path = entry_path(root, key)
    try:
        kernel = decode_entry(path.read_bytes(), key)
        return kernel, True
    except FileNotFoundError:
        pass
    except BadEntry as err:
        warnings.warn(f"vmamba2d: cached kernel {path} is unusable ({err}); compiling it again",
                      RuntimeWarning, stacklevel=2)
    kernel = nvrtc.compile_kernel(spec, arch, toolchain)
    write_entry(path, encode_entry(key, kernel))
    if announce:
        _announce(kernel, root)
    return kernel, False
