"""The public 2D selective-scan op and its backend dispatch.

Backends:
    ``"cuda"``      fused CUDA kernel (``vmamba2d._C_cuda``), CUDA tensors.
    ``"triton"``    Triton kernels (``scan_triton``), compiled on first use: CUDA tensors, or CPU
                    tensors under ``TRITON_INTERPRET=1`` (Triton's interpreter; for tests).
    ``"cpu"``       compiled C++ kernel (``vmamba2d._C_cpu`` or its JIT build), CPU tensors.
    ``"torch"``     vectorised pure PyTorch: any device, autograd, ONNX / torch.export friendly.
    ``"reference"`` the literal row/column loop (slow; for tests).
    ``"auto"``      the fastest available for the inputs' device; ``VMAMBA2D_SCAN_BACKEND``
                    overrides what it picks. CUDA tensors: ``"cuda"`` when the extension is built
                    with a kernel image for the GPU, else ``"triton"`` when Triton imports, else
                    ``"torch"``; CPU tensors: ``"cpu"``, else ``"torch"``. Each fallback warns once
                    per device type, naming why.
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

BACKENDS = ("auto", "cuda", "triton", "cpu", "torch", "reference")
BACKEND_ENV_VAR = "VMAMBA2D_SCAN_BACKEND"
# Largest state size each compiled kernel is built for (per-state registers / buffers).
MAX_NSTATE = {"cpu": 256, "cuda": 64, "triton": 64}

_warned_fallbacks: set[str] = set()


# torch.compile treats the answer as a constant instead of tracing the import / JIT build.
@torch.compiler.assume_constant_result
def _kernel_available(name: str) -> bool:
    loader = _extensions.cuda_extension if name == "cuda" else _extensions.cpu_extension
    return loader() is not None


@torch.compiler.assume_constant_result
def _triton_unavailable_reason() -> str:
    """Why Triton cannot be imported ("" when it can)."""
    from .scan_triton import triton_unavailable_reason

    return triton_unavailable_reason() or ""


@torch.compiler.assume_constant_result
def _cuda_kernel_unusable_reason(device: torch.device) -> str:
    """Why the CUDA extension cannot run on ``device`` ("" when it can)."""
    if _extensions.cuda_kernel_usable(device):
        return ""
    return _extensions.failure_reason("cuda")


def _warn_fallback_once(device_type: str, message: str) -> None:
    if device_type in _warned_fallbacks:
        return
    _warned_fallbacks.add(device_type)
    warnings.warn(f"vmamba2d: {message}. See vmamba2d.ops.backend_info().", RuntimeWarning, stacklevel=4)


def _auto_cuda_backend(device: torch.device, dtype: torch.dtype) -> str:
    if dtype == torch.float64:
        return "torch"  # the GPU kernels are built for fp32 / fp16 / bf16
    cuda_problem = _cuda_kernel_unusable_reason(device)
    if not cuda_problem:
        return "cuda"
    triton_problem = _triton_unavailable_reason()
    if not triton_problem:
        _warn_fallback_once(
            "cuda", f"the CUDA scan kernel cannot run here ({cuda_problem}); using the Triton backend"
        )
        return "triton"
    _warn_fallback_once(
        "cuda",
        f"no GPU scan kernel: the CUDA kernel cannot run here ({cuda_problem}) and Triton is "
        f"unavailable ({triton_problem}); using the slower pure-PyTorch backend",
    )
    return "torch"


def _auto_backend(device: torch.device, dtype: torch.dtype) -> str:
    if device.type == "cuda":
        return _auto_cuda_backend(device, dtype)
    if device.type != "cpu":
        return "torch"
    if _kernel_available("cpu"):
        return "cpu"
    _warn_fallback_once(
        "cpu",
        f"the compiled cpu scan kernel is unavailable ({_extensions.failure_reason('cpu')}); "
        "using the slower pure-PyTorch backend",
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
        problem = (
            _cuda_kernel_unusable_reason(device) if backend == "cuda"
            else "" if _kernel_available("cpu") else _extensions.failure_reason("cpu")
        )
        if problem:
            raise RuntimeError(f"backend={backend!r} requested but its kernel cannot run: {problem}")
    if backend == "triton":
        from .scan_triton import triton_device_problem

        missing = _triton_unavailable_reason()
        if missing:
            raise RuntimeError(f"backend='triton' needs Triton: {missing}")
        problem = triton_device_problem(device)
        if problem:
            raise ValueError(problem)
    return backend


def backend_info() -> dict:
    """Which kernels are importable and what ``backend="auto"`` picks.

    Returns a dict with ``cpu_extension`` / ``cuda_extension`` (bool: built and importable),
    ``cpu_extension_source`` (``"built"``, ``"jit"`` or None), ``triton`` (bool: Triton imports)
    and ``triton_version`` (str or None), ``auto_cpu`` / ``auto_cuda`` (the backend auto resolves
    to for fp32 tensors of each device type; for CUDA, judged on the current GPU, or without a
    GPU on whether the extension is built), ``env_override`` (the value of
    ``VMAMBA2D_SCAN_BACKEND`` or None), ``cuda_available`` (torch sees a GPU),
    ``cuda_kernel_arch`` (compute capability x 10 of the CUDA kernel code that runs on the current
    GPU, e.g. 86 for the sm_86 code an RTX 3090 / 4090 runs; None without a usable kernel) and
    ``cross_scan`` (how :func:`vmamba2d.ops.cross_selective_scan_2d` runs on the ``auto_cpu`` /
    ``auto_cuda`` backends: ``"native"``, routes scanned in place, or ``"per-route"``, one
    single-route scan per route on route-order copies), ``cpu_isa`` (the instruction-set build of
    the CPU kernel this CPU runs: ``"avx512"``, ``"avx2"`` or ``"baseline"``; None without the
    extension) and ``cpu_channel_lanes`` (the CPU four-route forward of float32 channels-last maps
    with ``delta_proj_weight``, the models' call, runs one channel per vector lane -- the AVX-512
    build, unless ``VMAMBA2D_CPU_LANES=0``, on calls with at least one 16-channel task per thread;
    else one channel's plane at a time).
    """
    from .cross_scan import cross_scan_mode
    from .scan_triton import triton_version

    cpu_ok = _kernel_available("cpu")
    cpu_module = _extensions.cpu_extension() if cpu_ok else None
    cuda_ok = _kernel_available("cuda")
    triton_ver = triton_version()
    gpu = torch.cuda.is_available()
    cuda_runs = _extensions.cuda_kernel_usable(torch.device("cuda")) if gpu and cuda_ok else cuda_ok
    override = os.environ.get(BACKEND_ENV_VAR) or None
    auto_cpu = override or ("cpu" if cpu_ok else "torch")
    auto_cuda = override or ("cuda" if cuda_runs else "triton" if triton_ver else "torch")
    return {
        "cpu_extension": cpu_ok,
        "cpu_extension_source": _extensions.extension_source("cpu"),
        "cuda_extension": cuda_ok,
        "cuda_available": gpu,
        "cuda_kernel_arch": _extensions.cuda_kernel_arch(torch.cuda.current_device()) if gpu and cuda_runs else None,
        "triton": triton_ver is not None,
        "triton_version": triton_ver,
        "auto_cpu": auto_cpu,
        "auto_cuda": auto_cuda,
        "env_override": override,
        "cross_scan": {"cpu": cross_scan_mode(auto_cpu), "cuda": cross_scan_mode(auto_cuda)},
        "cpu_isa": cpu_module.isa() if cpu_module is not None else None,
        # a JIT build cached by an older version has no channel_lanes: it has no channel-lane kernel
        "cpu_channel_lanes": bool(getattr(cpu_module, "channel_lanes", lambda: False)()),
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
    """2D selective scan over ``height x width`` maps (2DMamba; docs/scan.md).

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
    if name == "triton":
        from .scan_triton import selective_scan_2d_triton

        return selective_scan_2d_triton(
            u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_dtype
        )
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
