"""The public 2D selective-scan ops and their backend choice.

    selective_scan_2d(u, delta, A, B, C, D, delta_bias, delta_softplus, *, height, width, ...)
        the single-route scan of (batch, dim, H * W) maps
    cross_selective_scan_2d(u, delta, A, B, C, D, delta_bias, delta_softplus, *, routes, ...)
        the scans of one (batch, dim, H, W) map along K routes, summed back onto the map

Each validates its arguments (:mod:`vmamba2d.ops.validation`), resolves ``backend`` and calls that
backend's implementation. The readable pure-PyTorch reference of both is in
:mod:`vmamba2d.ops.reference`, with the same arguments; every backend is tested against it.

Backends:
    ``"cuda"``      compiled CUDA kernel (``vmamba2d._C_cuda``; :mod:`vmamba2d.ops.compiled`), CUDA tensors.
    ``"triton"``    Triton kernels (:mod:`vmamba2d.ops.triton`), compiled on first use: CUDA tensors,
                    or CPU tensors under ``TRITON_INTERPRET=1`` (Triton's interpreter; for tests).
                    triton is imported only when this backend is considered.
    ``"cpu"``       compiled C++ kernel (``vmamba2d._C_cpu`` or its JIT build), CPU tensors.
    ``"torch"``     vectorised pure PyTorch: any device, autograd, ONNX / torch.export friendly.
    ``"reference"`` the literal row/column loop (slow; for tests).
    ``"auto"``      the fastest available for the inputs' device; ``VMAMBA2D_SCAN_BACKEND``
                    overrides what it picks. CUDA tensors: ``"cuda"`` when the extension is built
                    with a kernel image for the GPU, else ``"triton"`` when Triton imports, else
                    ``"torch"``; CPU tensors: ``"cpu"``, else ``"torch"``. Each fallback warns once
                    per device type, naming why.

The four-route op runs natively (every route scanned in place on the map) on ``cpu``, ``cuda``
and ``triton``; on ``torch`` / ``reference`` it is :func:`cross_scan_per_route`, one single-route
scan per route on route-order copies. With ``delta_proj_weight``, delta is low-rank and the op
projects it (VMamba's per-route ``dt_proj``): the ``cpu`` kernel projects each channel's step
sizes where it reads them; the other backends project the whole delta with one batched matmul
first (:mod:`vmamba2d.ops.delta_proj`).
"""
from __future__ import annotations

import os
import warnings
from typing import Optional, Tuple

import torch

from .compiled import extensions
from .compiled.cross_ops import cross_selective_scan_2d_compiled
from .compiled.ops import selective_scan_2d_compiled
from . import plan as scan_plan
from . import tuning
from .delta_proj import project_delta
from .reference import SINGLE_ROUTE_SCANS, scan_per_route
from .routes import Route, RoutesArg, resolve_routes
from .triton import launch as triton_launch
from .triton import rows_plan as triton_rows_plan
from .triton.cross_ops import cross_selective_scan_2d_triton
from .triton.ops import selective_scan_2d_triton
from .validation import check_cross_scan_inputs, check_out_dtype, check_scan_inputs

Tensor = torch.Tensor

BACKENDS = ("auto", "cuda", "triton", "cpu", "torch", "reference")
BACKEND_ENV_VAR = "VMAMBA2D_SCAN_BACKEND"
# Largest state size each compiled kernel is built for (per-state registers / buffers).
MAX_NSTATE = {"cpu": 256, "cuda": 64, "triton": triton_launch.MAX_NSTATE}

_warned_fallbacks: set[str] = set()


# torch.compile treats the answer as a constant instead of tracing the import / JIT build.
@torch.compiler.assume_constant_result
def _kernel_available(name: str) -> bool:
    loader = extensions.cuda_extension if name == "cuda" else extensions.cpu_extension
    return loader() is not None


@torch.compiler.assume_constant_result
def _triton_unavailable_reason() -> str:
    """Why Triton cannot be imported ("" when it can)."""
    return triton_launch.triton_unavailable_reason() or ""


@torch.compiler.assume_constant_result
def _cuda_kernel_unusable_reason(device: torch.device) -> str:
    """Why the CUDA extension cannot run on ``device`` ("" when it can)."""
    if extensions.cuda_kernel_usable(device):
        return ""
    return extensions.failure_reason("cuda")


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
        f"the compiled cpu scan kernel is unavailable ({extensions.failure_reason('cpu')}); "
        "using the slower pure-PyTorch backend",
    )
    return "torch"


def _backend_override() -> Optional[str]:
    """The backend ``VMAMBA2D_SCAN_BACKEND`` pins for ``backend="auto"`` calls: None when it is unset,
    empty or ``auto``; ValueError for a name that is not a backend."""
    override = os.environ.get(BACKEND_ENV_VAR, "").strip()
    if override not in BACKENDS and override:
        raise ValueError(f"{BACKEND_ENV_VAR} must be one of {BACKENDS}, got {override!r}")
    return override if override not in ("", "auto") else None


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The concrete backend that ``backend`` means for ``dtype`` tensors on ``device``.

    Raises ValueError for an unknown name or a kernel that cannot take ``device``'s tensors, and
    RuntimeError when an explicitly requested kernel is not available.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        override = _backend_override()
        if override is None:
            return _auto_backend(device, dtype)
        backend = override
    if backend in ("cpu", "cuda"):
        if device.type != backend:
            raise ValueError(f"backend={backend!r} needs {backend} tensors, but the inputs are on {device}")
        problem = (
            _cuda_kernel_unusable_reason(device) if backend == "cuda"
            else "" if _kernel_available("cpu") else extensions.failure_reason("cpu")
        )
        if problem:
            raise RuntimeError(f"backend={backend!r} requested but its kernel cannot run: {problem}")
    if backend == "triton":
        missing = _triton_unavailable_reason()
        if missing:
            raise RuntimeError(f"backend='triton' needs Triton: {missing}")
        problem = triton_launch.triton_device_problem(device)
        if problem:
            raise ValueError(problem)
    return backend


def _cuda_compiler_info(on_gpu: bool) -> dict:
    """cuda_compiler ("nvcc": the built extension, "nvrtc": compiled at first use, None: neither),
    nvrtc_version, kernel_cache (its folder) and kernels_cached (the current GPU's, or None)."""
    from .compiled import kernel_cache, nvrtc, nvrtc_backend

    source = extensions.extension_source("cuda")
    try:
        version = nvrtc.find_toolchain().version_text
    except nvrtc.NvrtcUnavailable:
        version = None
    cached = nvrtc_backend.kernels_cached(torch.cuda.current_device()) if on_gpu and source == "nvrtc" else None
    return {"cuda_compiler": {"built": "nvcc", "nvrtc": "nvrtc"}.get(source), "nvrtc_version": version,
            "kernel_cache": str(kernel_cache.default_cache_dir()), "kernels_cached": cached}


def backend_info() -> dict:
    """Which kernels are importable and what ``backend="auto"`` picks.

    Returns a dict with ``cpu_extension`` / ``cuda_extension`` (bool: built and importable),
    ``cpu_extension_source`` (``"built"``, ``"jit"`` or None), ``triton`` (bool: Triton imports)
    and ``triton_version`` (str or None), ``auto_cpu`` / ``auto_cuda`` (the backend auto resolves
    to for fp32 tensors of each device type; for CUDA, judged on the current GPU, or without a
    GPU on whether the extension is built), ``env_override`` (the backend
    ``VMAMBA2D_SCAN_BACKEND`` pins for ``backend="auto"``; None when unset, empty or ``auto``), ``cuda_available`` (torch sees a GPU),
    ``cuda_kernel_arch`` (compute capability x 10 of the CUDA kernel code that runs on the current
    GPU, e.g. 86 for the sm_86 code an RTX 3090 / 4090 runs; None without a usable kernel),
    ``triton_forward`` (the rule choosing the Triton single-route forward, row-streaming or
    tiled, and the ``VMAMBA2D_TRITON_PLAN`` pin or None), ``scan_plan`` (the rule choosing the GPU
    scan design, PL / RS / v3, vmamba2d.ops.plan) and ``scan_tuning`` (the launch-knob tuner's
    ``VMAMBA2D_TUNE`` setting, its cache folder and the choices made so far in this process),
    ``cuda_compiler`` (``"nvcc"``: the built extension, ``"nvrtc"``: compiled at first use, None),
    ``nvrtc_version``, ``kernel_cache`` (the NVRTC kernel cache's folder), ``kernels_cached``
    (every NVRTC kernel of the current GPU's arch is cached; None off the NVRTC path or a GPU) and
    ``cross_scan`` (how :func:`cross_selective_scan_2d` runs on the ``auto_cpu`` /
    ``auto_cuda`` backends: ``"native"``, routes scanned in place, or ``"per-route"``, one
    single-route scan per route on route-order copies), ``cpu_isa`` (the instruction-set build of
    the CPU kernel this CPU runs: ``"avx512"``, ``"avx2"`` or ``"baseline"``; None without the
    extension) and ``cpu_channel_lanes`` (the CPU four-route forward of float32 channels-last maps
    with ``delta_proj_weight``, the models' call, runs one channel per vector lane -- the AVX-512
    build, unless ``VMAMBA2D_CPU_LANES=0``, on calls with at least one 16-channel task per thread;
    else one channel's plane at a time).
    """
    cpu_ok = _kernel_available("cpu")
    cpu_module = extensions.cpu_extension() if cpu_ok else None
    cuda_ok = _kernel_available("cuda")
    triton_ver = triton_launch.triton_version()
    gpu = torch.cuda.is_available()
    cuda_runs = extensions.cuda_kernel_usable(torch.device("cuda")) if gpu and cuda_ok else cuda_ok
    override = _backend_override()
    auto_cpu = override or ("cpu" if cpu_ok else "torch")
    auto_cuda = override or ("cuda" if cuda_runs else "triton" if triton_ver else "torch")
    return {
        "cpu_extension": cpu_ok,
        "cpu_extension_source": extensions.extension_source("cpu"),
        "cuda_extension": cuda_ok,
        "cuda_available": gpu,
        "cuda_kernel_arch": extensions.cuda_kernel_arch(torch.cuda.current_device()) if gpu and cuda_runs else None,
        **_cuda_compiler_info(gpu and cuda_ok),
        "triton": triton_ver is not None,
        "triton_version": triton_ver,
        "triton_forward": triton_rows_plan.describe(),
        "scan_plan": scan_plan.describe(),
        "scan_tuning": tuning.describe(),
        "auto_cpu": auto_cpu,
        "auto_cuda": auto_cuda,
        "env_override": override,
        "cross_scan": {"cpu": cross_scan_mode(auto_cpu), "cuda": cross_scan_mode(auto_cuda)},
        "cpu_isa": cpu_module.isa() if cpu_module is not None else None,
        "cpu_channel_lanes": bool(cpu_module.channel_lanes()) if cpu_module is not None else False,
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
        out_dtype: floating dtype of y; defaults to u's dtype. All accumulation is in fp32 (fp64 for fp64
            inputs).
    Returns:
        y: (batch, dim, L).
    """
    check_scan_inputs(u, delta, A, B, C, D, delta_bias, height, width)
    out_dtype = check_out_dtype(out_dtype, u.dtype)
    name = resolve_backend(backend, u.device, u.dtype)
    _check_nstate(name, A)
    if name == "triton":
        return selective_scan_2d_triton(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_dtype)
    if name in ("cpu", "cuda"):
        return selective_scan_2d_compiled(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_dtype)
    return SINGLE_ROUTE_SCANS[name](u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_dtype)


def _check_nstate(backend: str, A: Tensor) -> None:
    nstate = A.shape[1]
    if backend in MAX_NSTATE and nstate > MAX_NSTATE[backend]:
        raise ValueError(f"A has N={nstate} states; backend {backend!r} supports at most N={MAX_NSTATE[backend]}")


def cross_scan_per_route(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    routes: Tuple[Route, ...],
    backend: str,
    out_dtype: torch.dtype,
) -> Tensor:
    """The four-route op as one single-route scan per route on route-order copies
    (:func:`vmamba2d.ops.reference.scan_per_route`): how ``torch`` and ``reference`` run it, and on
    another backend its single-route op per route (for comparisons). Shapes as
    :func:`cross_selective_scan_2d` (full-rank delta); ``routes`` resolved."""
    scan = SINGLE_ROUTE_SCANS.get(backend)
    if scan is None:

        def scan(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_dtype):
            return selective_scan_2d(u, delta, A, B, C, D, delta_bias, delta_softplus, height=height, width=width,
                                     backend=backend, out_dtype=out_dtype)

    return scan_per_route(scan, u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_dtype)


def cross_scan_mode(backend: str) -> str:
    """How the four-route op runs on a concrete backend: ``"native"`` (routes scanned in place)
    or ``"per-route"`` (one single-route scan per route on route-order copies)."""
    return "native" if backend in ("cpu", "cuda", "triton") else "per-route"


def cross_selective_scan_2d(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor] = None,
    delta_bias: Optional[Tensor] = None,
    delta_softplus: bool = True,
    *,
    routes: RoutesArg = "cross",
    backend: str = "auto",
    out_dtype: Optional[torch.dtype] = None,
    delta_proj_weight: Optional[Tensor] = None,
) -> Tensor:
    """Selective scans of one map along K routes, summed back onto the map.

    Args:
        u: (batch, dim, H, W) input map (H, W >= 1; batch and dim may be 0), shared by every route.
        delta: (batch, K, dim, H, W) per-route step sizes before bias / softplus, in map order.
        A: (K * dim, N) decay rates (negative); route k's channel d is row ``k * dim + d``.
        B, C: (batch, K, N, H, W) per-route input / output projections in map order (one group
            per route: shared by the route's channels).
        D, delta_bias: optional (K * dim,) per-route skip weights / step-size biases.
        delta_softplus: apply softplus to delta (+ bias).
        routes: a route-set name (``"cross"``: the paper's four 2D routes, ``"corners"``: one 2D
            route from each corner) or a sequence of K :class:`~vmamba2d.ops.routes.Route`
            (flat routes for 1D scans, e.g. ``route_set("cross", scan="1d")`` for VMamba).
        backend: one of ``vmamba2d.ops.BACKENDS``.
        out_dtype: floating dtype of y; defaults to u's. Accumulation is in fp32 (fp64 for fp64 inputs).
        delta_proj_weight: optional (K, dim, R) per-route step-size projection. When given, delta
            is the low-rank (batch, K, R, H, W) and route k's step sizes are
            ``sum_r delta_proj_weight[k, d, r] * delta[b, k, r]`` (then bias and softplus as
            above); the ``cpu`` kernel computes them where it reads them (the full-rank delta is
            never stored). Differentiable in both.
    Returns:
        y: (batch, dim, H, W), the sum over routes k = 0..K-1 (in that order) of route k's scan
        output mapped back to map order.
    """
    route_tuple = resolve_routes(routes)
    check_cross_scan_inputs(u, delta, A, B, C, D, delta_bias, len(route_tuple), delta_proj_weight)
    out_dtype = check_out_dtype(out_dtype, u.dtype)
    name = resolve_backend(backend, u.device, u.dtype)
    _check_nstate(name, A)
    codes = [r.code for r in route_tuple]
    if name in ("cpu", "cuda"):  # the compiled op takes the low-rank delta itself
        return cross_selective_scan_2d_compiled(
            u, delta, A, B, C, D, delta_bias, delta_softplus, codes, out_dtype, delta_proj_weight
        )
    if delta_proj_weight is not None:
        delta = project_delta(delta, delta_proj_weight)
    if name == "triton":
        return cross_selective_scan_2d_triton(u, delta, A, B, C, D, delta_bias, delta_softplus, codes, out_dtype)
    return cross_scan_per_route(u, delta, A, B, C, D, delta_bias, delta_softplus, route_tuple, name, out_dtype)
