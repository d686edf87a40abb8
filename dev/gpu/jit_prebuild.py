#!/usr/bin/env python3
"""Compile the C++ parts a checkout without a build JIT-compiles at first use -- the NVRTC path's
host driver (vmamba2d._C_nvrtc) and the CPU kernel (vmamba2d._C_cpu) -- into torch's extension
cache, side by side in two processes, so that the later steps of ``make gpu-check`` (each its own
process) load them instead of compiling them inside their own time budgets. Run beside the
precompile step; where a built module is importable, nothing is compiled.

On 2026-11-29 (benchmarks/gpu-check-20261129-1903-h200-0c5e707.md) bench-v4 spent most of its 35 s
compiling the host driver, and the tests step was most likely stopped while a test JIT-compiled the CPU
kernel (no later step printed the CPU kernel's compile line; pytest captured the test's).

    python3 dev/gpu/jit_prebuild.py        # exit 0: both available, 1: one failed (its reason printed)
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# name -> code that loads (building where needed) the part and exits 1, saying why, when it cannot
PARTS = {
    "NVRTC host driver": "from vmamba2d.ops.compiled import nvrtc_backend; nvrtc_backend.host_extension()",
    "CPU kernel": ("import sys; from vmamba2d.ops.compiled import extensions; "
                   "sys.exit(0 if extensions.cpu_extension() is not None else extensions.failure_reason('cpu'))"),
}
# Run first in each child: SIGTERM (gpu_check stopping the step at its budget) becomes SystemExit, so the
# build's `finally` clauses run. Before torch's OS-level build lock (this checkout's torch has it, a GPU
# machine's may not), torch removed its lock file only in a `finally`, and a lock file left by a killed
# build made every later load of that module wait for it forever.
ON_TERM = "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)); "


def main() -> int:
    children = {name: subprocess.Popen([sys.executable, "-c", ON_TERM + code], cwd=REPO)
                for name, code in PARTS.items()}
    failed = []
    for name, child in children.items():
        ok = child.wait() == 0
        print(f"jit_prebuild: {name}: {'available' if ok else 'FAILED'}", flush=True)
        if not ok:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
