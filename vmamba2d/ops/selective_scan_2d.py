"""The public 2D selective-scan op and its backend dispatch.

Backends:
    ``"cuda"``      fused CUDA kernel (``vmamba2d._C_cuda``), CUDA tensors.
    ``"cpu"``       compiled C++ kernel (``vmamba2d._C_cpu`` or its JIT build), CPU tensors.
    ``"torch"``     vectorised pure PyTorch: any device, autograd, ONNX / torch.export friendly.
    ``"reference"`` the literal row/column loop (slow; for tests).
    ``"auto"``      the fastest available for the inputs' device; ``VMAMBA2D_SCAN_BACKEND``
                    overrides what it picks. Falling back to ``"torch"`` because a kernel is
                    missing warns once per device type.
"""
from __future__ import annotations

import os
import warnings
from typing import Optional

import torch

from . import _extensions
from .scan_torch import selective_scan_2d_reference, selective_scan_2d_torch
from .validation import check_scan_inputs

Tensor = torch.Tensor

BACKENDS = ("auto", "cuda", "cpu", "torch", "reference")
BACKEND_ENV_VAR = "VMAMBA2D_SCAN_BACKEND"
# Largest state size each compiled kernel is built for (per-state registers / buffers).
MAX_NSTATE = {"cpu": 256, "cuda": 64}

_warned_fallbacks: set[str] = set()


# torch.compile treats the answer as a constant instead of tracing the import / JIT build.
@torch.compiler.assume_constant_result
def _kernel_available(name: str) -> bool:
    loader = _extensions.cuda_extension if name == "cuda" else _extensions.cpu_extension
    return loader() is not None


def _auto_backend(device: torch.device, dtype: torch.dtype) -> str:
    kernel = "cuda" if device.type == "cuda" else "cpu" if device.type == "cpu" else None
    if kernel == "cuda" and dtype == torch.float64:
        return "torch"  # the CUDA kernel takes fp32 / fp16 / bf16 only
    if kernel is not None and _kernel_available(kernel):
        return kernel
    if kernel is not None and kernel not in _warned_fallbacks:
        _warned_fallbacks.add(kernel)
        warnings.warn(
            f"vmamba2d: the compiled {kernel} scan kernel is unavailable "
            f"({_extensions.failure_reason(kernel)}); using the slower pure-PyTorch backend. "
            "See vmamba2d.ops.backend_info().",
            RuntimeWarning,
            stacklevel=3,
        )
    return "torch"


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The concrete backend that ``backend`` means for ``dtype`` tensors on ``device``.

    Raises ValueError for an unknown name or a kernel that cannot take ``device``'s tensors, and
    RuntimeError when an explicitly requested kernel is not available.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        override = os.environ.get(BACKEND_ENV_VAR, "").strip()
        if override and override != "auto":
            if override not in BACKENDS:
                raise ValueError(f"{BACKEND_ENV_VAR} must be one of {BACKENDS}, got {override!r}")
            backend = override
        else:
            return _auto_backend(device, dtype)
    if backend in ("cpu", "cuda"):
        if device.type != backend:
            raise ValueError(f"backend={backend!r} needs {backend} tensors, but the inputs are on {device}")
        if not _kernel_available(backend):
            raise RuntimeError(
                f"backend={backend!r} requested but its kernel is unavailable: "
                f"{_extensions.failure_reason(backend)}"
            )
    return backend


def backend_info() -> dict:
    """Which kernels are importable and what ``backend="auto"`` picks.

    Returns a dict with ``cpu_extension`` / ``cuda_extension`` (bool), ``cpu_extension_source``
    (``"built"``, ``"jit"`` or None), ``auto_cpu`` / ``auto_cuda`` (the backend auto resolves to
    for each device type), ``env_override`` (the value of ``VMAMBA2D_SCAN_BACKEND`` or None) and
    ``cuda_available`` (torch sees a GPU).
    """
    cpu_ok = _kernel_available("cpu")
    cuda_ok = _kernel_available("cuda")
    override = os.environ.get(BACKEND_ENV_VAR) or None
    return {
        "cpu_extension": cpu_ok,
        "cpu_extension_source": _extensions.extension_source("cpu"),
        "cuda_extension": cuda_ok,
        "cuda_available": torch.cuda.is_available(),
        "auto_cpu": override or ("cpu" if cpu_ok else "torch"),
        "auto_cuda": override or ("cuda" if cuda_ok else "torch"),
        "env_override": override,
    }


def selective_scan_2d(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor] = None,
    delta_bias: Optional[Tensor] = None,
    delta_softplus: bool = True,
    *,
    height: int,
    width: int,
    backend: str = "auto",
    out_dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """2D selective scan over ``height x width`` maps (2DMamba, DESIGN.md section 1).

    Args:
        u: (batch, dim, L) input, L = height * width in row-major order.
        delta: (batch, dim, L) step sizes before bias / softplus.
        A: (dim, N) state decay rates (negative), fp32.
        B: (batch, groups, N, L) input projections; channel d uses group d // (dim // groups).
        C: (batch, groups, N, L) output projections.
        D: optional (dim,) skip weights.
        delta_bias: optional (dim,) added to delta before softplus.
        delta_softplus: apply softplus to delta (+ bias).
        height, width: the map's grid.
        backend: one of ``BACKENDS``.
        out_dtype: dtype of y; defaults to u's dtype. All accumulation is in fp32 (fp64 for fp64
            inputs).
    Returns:
        y: (batch, dim, L).
    """
    check_scan_inputs(u, delta, A, B, C, D, delta_bias, height, width)
    name = resolve_backend(backend, u.device, u.dtype)
    nstate = A.shape[1]
    if name in MAX_NSTATE and nstate > MAX_NSTATE[name]:
        raise ValueError(f"A has N={nstate} states; backend {name!r} supports at most N={MAX_NSTATE[name]}")
    out_dtype = u.dtype if out_dtype is None else out_dtype
    if name in ("cpu", "cuda"):
        from .fused import selective_scan_2d_fused

        return selective_scan_2d_fused(
            u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_dtype
        )
    compute_dtype = torch.promote_types(u.dtype, torch.float32)
    cast = lambda t: None if t is None else t.to(compute_dtype)  # noqa: E731
    impl = selective_scan_2d_torch if name == "torch" else selective_scan_2d_reference
    y = impl(
        cast(u), cast(delta), cast(A), cast(B), cast(C), cast(D), cast(delta_bias),
        delta_softplus, height, width,
    )
    return y.to(out_dtype)
