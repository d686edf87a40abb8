"""Environment settings of the scan ops that take one of a few words (``VMAMBA2D_SCAN_PLAN``, ``VMAMBA2D_SCAN_BACKWARD``,
``VMAMBA2D_TRITON_PLAN``, ``VMAMBA2D_CUDA_KERNELS``): read when used, never at import."""
from __future__ import annotations

import os
from typing import Sequence


def env_choice(name: str, choices: Sequence[str], default: str) -> str:
    """The value of environment variable ``name``: one of ``choices``, case and surrounding spaces
    ignored; ``default`` when it is unset or empty.

    Raises:
        ValueError: any other value, naming the variable and what it takes.
    """
    value = os.environ.get(name, "").strip().lower() or default
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
    return value
