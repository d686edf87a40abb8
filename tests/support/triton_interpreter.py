"""What the Triton interpreter case files (tests/ops/triton/triton_interpreted_*cases.py) share: the
module-level skip outside ``TRITON_INTERPRET=1`` and a record of the kernels launched. Importing
this module imports neither triton nor vmamba2d (the case files import it before their check)."""
from __future__ import annotations

import os

import pytest


def require_interpreter(runner: str) -> None:
    """Skips the calling case module unless ``TRITON_INTERPRET=1`` was set before triton was imported
    (``runner``: the test file that runs the module so, in a fresh Python) and triton is installed."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip(f"run through {runner} (needs TRITON_INTERPRET=1 before triton is imported)",
                    allow_module_level=True)
    pytest.importorskip("triton")


def record_kernel_launches(monkeypatch) -> list[str]:
    """The names of the Triton kernels taken from vmamba2d.ops.triton.launch.kernels() from now on
    (each launch takes its kernel there), in order, in the list returned."""
    from vmamba2d.ops.triton import launch as triton_launch

    launched = []
    original = triton_launch.kernels

    class Recorder:
        def __getattr__(self, name):
            launched.append(name)
            return getattr(original(), name)

    monkeypatch.setattr(triton_launch, "kernels", Recorder)
    return launched
