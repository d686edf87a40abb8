"""Keeping freed CPU memory for reuse under glibc, so large tensors stop costing page faults.

glibc's malloc serves a block above its mmap threshold (128 KiB at start, raised as mapped blocks
are freed, at most to 32 MiB) with a fresh ``mmap`` and unmaps it when it is freed, and it hands
the free top of its heap back to the kernel above a trim threshold. A vision model's activations on
CPU are such blocks (vmamba2d_tiny's stage-1 MLP maps are 38 MB at batch 8): each new tensor is a
fresh mapping that the kernel zero-fills page by page on first touch, so on a 2-core machine a
ReLU over 9.6 MB takes 4.5 ms instead of 0.6 ms. :func:`keep_freed_memory` raises both thresholds
so freed blocks stay in the heap and the next tensor of that size reuses them (as PyTorch's CUDA
caching allocator does on the GPU). Values are unchanged; the price is that the process keeps its
peak heap instead of returning freed memory to the system.

It suits steps whose tensors have the same sizes every time (training or evaluating at one
input size): the heap settles after a few steps. Where sizes change from step to step the heap
fragments, because a small allocation made while a large block is free splits it: 2DMambaMIL
training on slides of 40 x 40 to 160 x 160 patches held 2.1 GB after 60 slides and 2.9 GB after
300 with the setting, 2.2-2.4 GB over 120 slides without it; a loop that keeps one small tensor per
step next to a freed 40 MB one grows by 40 MB a step. So the MIL scripts do not use it.

The setting is process-wide and cannot be undone (glibc has no call back to its dynamic
thresholds), so the library never makes it on import: the classification scripts (on CPU), the
demo and the model benchmarks make it, and a script of one's own calls it first.
``VMAMBA2D_KEEP_FREED_MEMORY=0`` turns every such call into a no-op. The same effect from the
shell, for any program: ``MALLOC_MMAP_THRESHOLD_=2147483647 MALLOC_TRIM_THRESHOLD_=2147483647``.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import threading
from typing import Optional

__all__ = ["KEPT_BLOCK_BYTES", "OPT_OUT_VARIABLE", "cpu_malloc_info", "keep_freed_memory"]

# The largest value mallopt takes (an int): blocks up to 2 GiB stay in the heap when freed.
KEPT_BLOCK_BYTES = 2**31 - 1
# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_ENV_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
OPT_OUT_VARIABLE = "VMAMBA2D_KEEP_FREED_MEMORY"  # "0": keep_freed_memory() changes nothing

_lock = threading.Lock()
_kept_by_call = False


@functools.lru_cache(maxsize=None)
def _glibc() -> Optional[ctypes.CDLL]:
    """The C library when it is glibc (which has ``mallopt``), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(None)  # the process's own symbols: glibc's among them
    if not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc


def keep_freed_memory(block_bytes: int = KEPT_BLOCK_BYTES) -> bool:
    """Make glibc's malloc keep freed blocks of up to ``block_bytes`` for reuse (process-wide).

    Sets the mmap and trim thresholds to ``block_bytes``: allocations up to that size come from
    the heap, and freed memory stays there instead of going back to the kernel. Returns True when
    set (or set before), False where the C library is not glibc (macOS, Windows, musl) or the
    environment has ``VMAMBA2D_KEEP_FREED_MEMORY=0``: nothing changes then. Calling it again is
    harmless; it cannot be undone. For steps of fixed tensor sizes (see the module's notes).
    """
    if not isinstance(block_bytes, int) or isinstance(block_bytes, bool) or not 0 < block_bytes <= KEPT_BLOCK_BYTES:
        raise ValueError(f"block_bytes must be an int in [1, {KEPT_BLOCK_BYTES}], got {block_bytes!r}")
    switch = os.environ.get(OPT_OUT_VARIABLE, "").strip() or "1"  # set but empty: as unset
    if switch not in ("0", "1"):
        raise ValueError(f"{OPT_OUT_VARIABLE} must be '0' or '1', got {switch!r}")
    global _kept_by_call
    libc = _glibc()
    if libc is None or switch == "0":
        return False
    with _lock:
        for parameter in (_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD):
            if libc.mallopt(parameter, block_bytes) != 1:
                raise RuntimeError(f"glibc's mallopt({parameter}, {block_bytes}) refused the value")
        _kept_by_call = True
    return True


def cpu_malloc_info() -> dict:
    """How this process's C allocator treats freed tensors, for reports and benchmark headers.

    ``{'allocator': 'glibc' | 'other', 'keeps_freed_memory': bool, 'set_by': 'keep_freed_memory()'
    | 'environment' | None}``: whether :func:`keep_freed_memory` ran in this process or the
    process started with glibc's threshold variables set.
    """
    if _glibc() is None:
        return {"allocator": "other", "keeps_freed_memory": False, "set_by": None}
    from_env = all(os.environ.get(name) for name in _ENV_VARIABLES)
    set_by = "keep_freed_memory()" if _kept_by_call else ("environment" if from_env else None)
    return {"allocator": "glibc", "keeps_freed_memory": set_by is not None, "set_by": set_by}
