"""The Triton 2D selective scan as ``torch.library`` custom ops, and what every Triton op shares
(device checks, tiling, dtypes).

    vmamba2d::selective_scan_2d_triton_fwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus,
                                           height, width, out_fp32, save_carries=False)
                                           -> (y, vcarry, hcarry)
    vmamba2d::selective_scan_2d_triton_bwd(u, delta, A, B, C, D?, delta_bias?, delta_softplus,
                                           height, width, dy, vcarry, hcarry)
                                           -> (du, ddelta, dA, dB, dC, dD, ddelta_bias)

The single-route op runs the kernels of the four-route op (``_triton_kernels``, launched by
``_triton_cross_scan``) as one configuration of them: one route (code 0: rows first, from the top
left) and each of the G groups of B / C its own map (u (batch, dim, L) is read as
(batch * G, dim / G, H, W); map b * G + g takes the parameter rows of group g). With
``save_carries`` the forward also returns the states entering each tile, and the backward
rebuilds every tile's states from them (no second forward sweep). Both ops have fake
implementations (``torch.compile(fullgraph=True)`` traces them); the forward op's autograd
formula calls the backward op.

Dtypes: u / delta / B / C / dy may be fp16, bf16, fp32 or fp64, A / D / delta_bias fp32 or fp64;
the kernels accumulate in fp32 (fp64 when any scan input is fp64) and write every gradient in its
input's dtype. The kernel module is imported (and the kernels built) on the first launch. On CPU
tensors the kernels run only through Triton's interpreter: ``TRITON_INTERPRET=1`` must be set before
triton is first imported (triton builds its own ``@jit`` helpers then), i.e. before
``import vmamba2d``, which imports triton through torchvision / torch._dynamo.

``VMAMBA2D_TRITON_TILE=HxW`` (powers of two) overrides the tile shape, for tuning and for tests.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

import torch

from .scan_autograd import backward_fake, register_single_route_autograd

Tensor = torch.Tensor

FWD_OP_NAME = "vmamba2d::selective_scan_2d_triton_fwd"
BWD_OP_NAME = "vmamba2d::selective_scan_2d_triton_bwd"
TILE_ENV_VAR = "VMAMBA2D_TRITON_TILE"
# The Triton kernel module, and one of its kernels (tells how the module was built).
KERNELS_MODULE = "vmamba2d.ops._triton_kernels"
PROBE_KERNEL = "scan2d_fwd_kernel"
LAUNCHER_MODULE = "vmamba2d.ops._triton_cross_scan"
# The single-route op's scan: route code 0 (rows first, from the top left).
SINGLE_ROUTE = [0]
MAX_NSTATE = 64
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def triton_version() -> Optional[str]:
    """Triton's version if it can be imported (importing it if needed), else None."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton
    except Exception:  # a broken install (e.g. missing shared library) means "not available"
        return None
    return getattr(triton, "__version__", "unknown")


def triton_unavailable_reason() -> Optional[str]:
    """Why Triton cannot be used (None when it can be imported)."""
    if importlib.util.find_spec("triton") is None:
        return "the 'triton' package is not installed (it comes with torch's CUDA builds on Linux)"
    try:
        import triton  # noqa: F401
    except Exception as err:
        return f"'import triton' failed: {err}"
    return None


def _interpret_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def _launcher() -> ModuleType:
    """The kernels' launcher module (imported on use: it imports this one)."""
    return importlib.import_module(LAUNCHER_MODULE)


def _interpreted(jit_function) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(jit_function, InterpretedFunction)


def _triton_library_interpreted() -> bool:
    """Whether triton's own ``@jit`` helpers (``tl.zeros``, ``tl.sum``, ...) were built for the interpreter."""
    import triton.language.standard

    return _interpreted(triton.language.standard.zeros)


@torch.compiler.assume_constant_result
def triton_device_problem(device: torch.device) -> str:
    """Why the Triton kernels cannot take ``device``'s tensors ("" when they can; Triton assumed importable)."""
    if device.type == "cuda":
        return ""
    if device.type != "cpu":
        return f"backend='triton' takes CUDA tensors (or CPU tensors under TRITON_INTERPRET=1), got {device}"
    how = "set TRITON_INTERPRET=1 in the environment before importing vmamba2d (or triton)"
    kernels = sys.modules.get(KERNELS_MODULE)
    if kernels is not None and not _interpreted(getattr(kernels, PROBE_KERNEL)):
        return f"backend='triton' got CPU tensors but its kernels were built for the GPU; {how}"
    if kernels is None and not _interpret_requested():
        return f"backend='triton' needs CUDA tensors; CPU tensors run only in Triton's interpreter: {how}"
    if not _triton_library_interpreted():
        return f"backend='triton' got CPU tensors but triton was imported before TRITON_INTERPRET=1 was set; {how}"
    return ""


def check_triton_device(device: torch.device) -> None:
    """Raise RuntimeError when Triton is missing, ValueError when it cannot take ``device``'s tensors."""
    reason = triton_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"backend='triton' needs Triton: {reason}")
    problem = triton_device_problem(device)
    if problem:
        raise ValueError(problem)


def _next_pow2(value: int) -> int:
    return 1 << max(0, (int(value) - 1).bit_length())


def _tile_override() -> Optional[tuple[int, int]]:
    raw = os.environ.get(TILE_ENV_VAR, "").strip()
    if not raw:
        return None
    parts = raw.lower().split("x")
    try:
        tile = tuple(int(p) for p in parts)
    except ValueError:
        tile = ()
    if len(tile) != 2 or any(t < 1 or t & (t - 1) for t in tile):
        raise ValueError(f"{TILE_ENV_VAR} must be 'HxW' with powers of two, e.g. '16x32', got {raw!r}")
    return tile  # type: ignore[return-value]


@dataclass(frozen=True)
class Tiling:
    """How the maps are cut: channels per program, padded states, tile shape, tile counts."""

    block_d: int
    block_n: int
    tile_h: int
    tile_w: int
    n_chan_blocks: int
    n_tile_rows: int
    n_tile_cols: int


def choose_tiling(chans_per_group: int, nstate: int, height: int, width: int, block_elements: int) -> Tiling:
    """A register block of at most ``block_elements`` = channels x states x tile rows x tile cols.

    States are padded to a power of two; a program takes several channels of a group (sharing the
    B / C tiles) while at least 256 cells remain per tile; the tile is as wide as the map when
    that fits, else squarer.
    """
    block_n = _next_pow2(nstate)
    block_d = min(_next_pow2(chans_per_group), max(1, block_elements // (block_n * 256)))
    cells = max(16, block_elements // (block_d * block_n))
    full_h, full_w = _next_pow2(height), _next_pow2(width)
    override = _tile_override()
    if override is not None:
        tile_h, tile_w = override
    else:
        tile_w = min(full_w, cells)
        tile_h = min(full_h, max(1, cells // tile_w))
        while tile_w > 2 * tile_h and tile_h * 2 <= full_h:
            tile_w //= 2
            tile_h *= 2
    return Tiling(
        block_d=block_d,
        block_n=block_n,
        tile_h=tile_h,
        tile_w=tile_w,
        n_chan_blocks=-(-chans_per_group // block_d),
        n_tile_rows=-(-height // tile_h),
        n_tile_cols=-(-width // tile_w),
    )


def _acc_dtype(*tensors: Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _tl_dtype(dtype: torch.dtype):
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def _check_op_inputs(u: Tensor, A: Tensor, B: Tensor) -> None:
    check_triton_device(u.device)
    if A.shape[1] > MAX_NSTATE:
        raise ValueError(f"A has N={A.shape[1]} states; backend 'triton' supports at most N={MAX_NSTATE}")
    if u.dtype not in _SUPPORTED_DTYPES or B.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"backend 'triton' takes float16, bfloat16, float32 or float64 inputs, got {u.dtype}")


def _as_maps(u: Tensor, delta: Tensor, B: Tensor, C: Tensor, height: int, width: int) -> tuple[Tensor, ...]:
    """The single-route op's tensors as the kernels' maps, one per (batch, group of B / C):
    u (batch * G, dim / G, H, W), delta (batch * G, 1, dim / G, H, W), B / C (batch * G, 1, N, H, W)."""
    batch, dim, _ = u.shape
    groups, nstate = B.shape[1], B.shape[2]
    maps = batch * groups
    chans = dim // groups
    return (u.view(maps, chans, height, width), delta.view(maps, 1, chans, height, width),
            B.view(maps, 1, nstate, height, width), C.view(maps, 1, nstate, height, width))


@torch.library.custom_op(FWD_OP_NAME, mutates_args=())
def selective_scan_2d_triton_fwd(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    height: int,
    width: int,
    out_fp32: bool,
    save_carries: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Triton forward: (y, vcarry, hcarry). y (batch, dim, L), fp32 if ``out_fp32`` else u's dtype;
    the carries are 1-D buffers for the backward op (empty unless ``save_carries``).

    Inputs contiguous: u, delta (batch, dim, L); A (dim, N); B, C (batch, groups, N, L); D,
    delta_bias (dim,) or None.
    """
    _check_op_inputs(u, A, B)
    maps = _as_maps(u, delta, B, C, height, width)
    y, vcarry, hcarry = _launcher().launch_forward(*maps[:2], A, *maps[2:], D, delta_bias, delta_softplus,
                                                   SINGLE_ROUTE, out_fp32, save_carries, B.shape[1])
    return y.view(u.shape), vcarry, hcarry


@selective_scan_2d_triton_fwd.register_fake
def _fwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_fp32, save_carries=False):
    batch, dim, _ = u.shape
    groups = B.shape[1]
    carries = _launcher().empty_carries(batch * groups, dim // groups, A.shape[1], height, width, 1, save_carries,
                                        _acc_dtype(u, delta, B, C), u)
    return (u.new_empty(u.shape, dtype=torch.float32 if out_fp32 else u.dtype), *carries)


@torch.library.custom_op(BWD_OP_NAME, mutates_args=())
def selective_scan_2d_triton_bwd(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    height: int,
    width: int,
    dy: Tensor,
    vcarry: Tensor,
    hcarry: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Triton backward: (du, ddelta, dA, dB, dC, dD, ddelta_bias), each shaped and typed like its input.

    dy (batch, dim, L) contiguous; ``vcarry`` / ``hcarry``: what the forward op returned with
    ``save_carries`` on these inputs. dD / ddelta_bias are empty (shape (0,)) when D / delta_bias is None.
    """
    _check_op_inputs(u, A, B)
    u_maps, delta_maps, B_maps, C_maps = _as_maps(u, delta, B, C, height, width)
    du, ddelta, dA, dB, dC, dD, dbias = _launcher().launch_backward(
        u_maps, delta_maps, A, B_maps, C_maps, D, delta_bias, delta_softplus, SINGLE_ROUTE, vcarry, hcarry,
        dy.view(u_maps.shape), B.shape[1])
    return du.view(u.shape), ddelta.view(delta.shape), dA, dB.view(B.shape), dC.view(C.shape), dD, dbias


@selective_scan_2d_triton_bwd.register_fake
def _bwd_fake(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy, vcarry, hcarry):
    return backward_fake(u, delta, A, B, C, D, delta_bias)


register_single_route_autograd(selective_scan_2d_triton_fwd, selective_scan_2d_triton_bwd)


def selective_scan_2d_triton(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    delta_bias: Optional[Tensor],
    delta_softplus: bool,
    height: int,
    width: int,
    out_dtype: torch.dtype,
) -> Tensor:
    """2D selective scan with the Triton kernels (differentiable).

    Args (validated by :func:`vmamba2d.ops.validation.check_scan_inputs`): u, delta (batch, dim, L);
    A (dim, N); B, C (batch, groups, N, L); D, delta_bias (dim,) or None; L == height * width.
    Any strides; u / delta / B / C of one floating dtype (fp16, bf16, fp32, fp64).
    Returns: y (batch, dim, L) in ``out_dtype``.
    """
    scan_dtype = u.dtype
    for t in (delta, B, C):
        scan_dtype = torch.promote_types(scan_dtype, t.dtype)
    param_dtype = torch.float64 if scan_dtype == torch.float64 else torch.float32

    def prepare(t: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
        return None if t is None else t.to(dtype).contiguous()

    tensors = (u, delta, A, B, C, D, delta_bias)
    save_carries = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    out_fp32 = out_dtype == torch.float32 and scan_dtype != torch.float32
    y, _, _ = selective_scan_2d_triton_fwd(
        prepare(u, scan_dtype), prepare(delta, scan_dtype), prepare(A, param_dtype),
        prepare(B, scan_dtype), prepare(C, scan_dtype), prepare(D, param_dtype),
        prepare(delta_bias, param_dtype), bool(delta_softplus), int(height), int(width), out_fp32, save_carries,
    )
    return y.to(out_dtype)
