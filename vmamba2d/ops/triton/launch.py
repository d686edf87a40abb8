"""What the Triton scan ops share: whether Triton can run here, the tiling, and the launches of
the kernels (:mod:`vmamba2d.ops.triton.kernels`, imported -- and triton with it -- on the first
launch).

``launch_forward`` / ``launch_backward`` run the kernels for both ops: the four-route op
(:mod:`~vmamba2d.ops.triton.cross_ops`) with one parameter group, the single-route op
(:mod:`~vmamba2d.ops.triton.ops`) with route code 0 and its groups of B / C as maps (one
configuration of the same kernels).

On CPU tensors the kernels run only through Triton's interpreter: ``TRITON_INTERPRET=1`` must be
set before triton is first imported (triton builds its own ``@jit`` helpers then).
``VMAMBA2D_TRITON_TILE=HxW`` (powers of two) overrides the tile shape, for tuning and for tests.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import List, Optional

import torch

Tensor = torch.Tensor

TILE_ENV_VAR = "VMAMBA2D_TRITON_TILE"
# The Triton kernel module, and one of its kernels (tells how the module was built).
KERNELS_MODULE = "vmamba2d.ops.triton.kernels"
PROBE_KERNEL = "scan2d_fwd_kernel"
MAX_NSTATE = 64
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Elements of one [channels, states, rows, cols] register block (the same tiling in both
# directions: the backward reads the carries the forward saved), two per thread: 4 warps per
# program, more when N > 16 makes the block larger (a tile keeps at least 16 cells). Register
# caps: forward 128 (4 programs, 16 warps per SM on sm_80 / sm_90); backward 168 for several
# routes on 4 warps (3 programs, 12 warps), else 128 (one route's body, or programs of 8 / 16
# warps: 16 warps per SM); without spills up to N = 16 (uncapped, ptxas picks fewer registers and
# spills a few bytes, or more and fewer programs fit); at N = 32 / 64 the backward spills a few
# bytes (up to 20 B) rather than halve its resident warps. Chosen from compiles without a GPU
# (tests/ops/triton/test_scan_triton.py holds the figures), not timed on a GPU.
BLOCK_ELEMENTS = 256
ELEMENTS_PER_THREAD = 2
FWD_MAX_REGISTERS = 128
BWD_MAX_REGISTERS = 168
BWD_NARROW_MAX_REGISTERS = 128
# Channel blocks one program runs tile by tile (B / C loaded once per tile for all of them; the
# backward sums their dB / dC on chip): at most MAX_SETS, a divisor of the number of blocks, and
# only while the grid keeps MIN_PROGRAMS programs (about two waves of resident forward programs on
# an H100, 132 SMs x 4): a batch-1 scan such as 2DMambaMIL's keeps one block per program. Not
# timed on a GPU.
MAX_SETS = 8
MIN_PROGRAMS = 1024
ROUTE_BITS = 4



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


def acc_dtype(*tensors: Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def tl_dtype(dtype: torch.dtype):
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def check_op_inputs(u: Tensor, A: Tensor, B: Tensor) -> None:
    check_triton_device(u.device)
    if A.shape[1] > MAX_NSTATE:
        raise ValueError(f"A has N={A.shape[1]} states; backend 'triton' supports at most N={MAX_NSTATE}")
    if u.dtype not in SUPPORTED_DTYPES or B.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"backend 'triton' takes float16, bfloat16, float32 or float64 inputs, got {u.dtype}")


def kernels() -> ModuleType:
    """The kernel module (imports triton on first use)."""
    return importlib.import_module(KERNELS_MODULE)


def route_constant(routes: List[int]) -> int:
    """The route codes packed into one integer, ``ROUTE_BITS`` per route (route k at bit 4k)."""
    packed = 0
    for k, code in enumerate(routes):
        packed |= int(code) << (ROUTE_BITS * k)
    return packed


def cross_tiling(dim: int, nstate: int, height: int, width: int) -> Tiling:
    """The tiling of one map (``VMAMBA2D_TRITON_TILE`` overrides the tile shape)."""
    return choose_tiling(dim, nstate, height, width, BLOCK_ELEMENTS)


def _carry_numels(maps: int, dim: int, nstate: int, height: int, width: int, num_routes: int,
                  save: bool) -> tuple[int, int]:
    """Elements of the (vertical, horizontal) carry buffers the forward kernel takes."""
    t = cross_tiling(dim, nstate, height, width)
    per_route = maps * t.n_chan_blocks * num_routes * t.block_d * t.block_n
    vertical = per_route * (t.n_tile_rows if save else 1) * t.n_tile_cols * t.tile_w
    horizontal = per_route * t.n_tile_rows * t.n_tile_cols * t.tile_h if save else 0
    return vertical, horizontal


def launch_config(t: Tiling, direction: str, num_routes: int) -> tuple[int, int]:
    """(num_warps, register cap) of the ``direction`` ("fwd" / "bwd") kernel's launch."""
    warps = max(4, t.block_d * t.block_n * t.tile_h * t.tile_w // (32 * ELEMENTS_PER_THREAD))
    if direction == "fwd":
        return warps, FWD_MAX_REGISTERS
    return warps, BWD_MAX_REGISTERS if warps == 4 and num_routes > 1 else BWD_NARROW_MAX_REGISTERS


def program_sets(n_chan_blocks: int, maps: int) -> int:
    """Channel blocks per program: the largest divisor of ``n_chan_blocks`` up to ``MAX_SETS`` that
    leaves at least ``MIN_PROGRAMS`` programs for ``maps`` maps (1 when none does)."""
    return max((s for s in range(1, MAX_SETS + 1)
                if n_chan_blocks % s == 0 and maps * n_chan_blocks // s >= MIN_PROGRAMS), default=1)


def grid_args(u: Tensor, A: Tensor, t: Tiling) -> tuple:
    _, dim, height, width = u.shape
    n_chunks = -(-(height * width) // (t.tile_h * t.tile_w))
    return (dim, A.shape[1], height, width, t.n_chan_blocks, t.n_tile_rows, t.n_tile_cols, n_chunks)


def width_alignment(width: int) -> int:
    """The largest power of two up to 16 dividing ``width`` (a hint: every map row starts there)."""
    return min(16, width & -width) if width > 0 else 1


def constexprs(routes: List[int], D: Optional[Tensor], delta_bias: Optional[Tensor], delta_softplus: bool,
                t: Tiling, acc: torch.dtype, width: int) -> dict:
    return dict(ROUTES=route_constant(routes), NUM_ROUTES=len(routes), HAS_D=D is not None,
                HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus), BLOCK_D=t.block_d,
                BLOCK_N=t.block_n, TILE_H=t.tile_h, TILE_W=t.tile_w, WIDTH_ALIGN=width_alignment(width),
                ACC=tl_dtype(acc))


MAX_ROUTES = 15  # the packed route codes stay within 60 bits


def check_routes(routes: List[int], delta: Tensor) -> None:
    if len(routes) != delta.shape[1] or any(not 0 <= int(c) < 1 << ROUTE_BITS for c in routes):
        raise ValueError(f"routes must be {delta.shape[1]} route codes in [0, 16), got {list(routes)}")
    if len(routes) > MAX_ROUTES:
        raise ValueError(f"backend 'triton' scans at most {MAX_ROUTES} routes in one op, got {len(routes)}")


def launch_forward(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                   delta_bias: Optional[Tensor], delta_softplus: bool, routes: List[int], out_fp32: bool,
                   save_carries: bool, param_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Run ``scan2d_fwd_kernel`` over ``maps`` maps: (y, vcarry, hcarry) as the four-route forward op.

    Inputs contiguous, validated: u (maps, dim, H, W), delta (maps, K, dim, H, W), A
    (param_groups * K * dim, N), B / C (maps, K, N, H, W), D / delta_bias (param_groups * K * dim,)
    or None; map m reads the parameter rows of group m % param_groups.
    """
    maps, dim, height, width = u.shape
    acc = acc_dtype(u, delta, B, C)
    y = torch.empty(u.shape, device=u.device, dtype=torch.float32 if out_fp32 else u.dtype)
    v_numel, h_numel = _carry_numels(maps, dim, A.shape[1], height, width, len(routes), save_carries)
    vcarry = torch.empty(v_numel, device=u.device, dtype=acc)
    hcarry = torch.empty(h_numel, device=u.device, dtype=acc)
    if u.numel() == 0:
        return y, vcarry, hcarry
    t = cross_tiling(dim, A.shape[1], height, width)
    sets = program_sets(t.n_chan_blocks, maps)
    yacc = y if y.dtype == acc or len(routes) == 1 else torch.empty(u.shape, device=u.device, dtype=acc)
    hstate = torch.empty(maps * t.n_chan_blocks * t.block_d * t.block_n * t.tile_h, device=u.device, dtype=acc)
    grid = grid_args(u, A, t)
    warps, max_registers = launch_config(t, "fwd", len(routes))
    kernels().scan2d_fwd_kernel[(maps * (t.n_chan_blocks // sets),)](
        u, delta, A, B, C, D if D is not None else u, delta_bias if delta_bias is not None else u, y, yacc,
        vcarry, hcarry if save_carries else vcarry, hstate, *grid[:5], t.n_chan_blocks // sets, sets, *grid[5:],
        param_groups, SAVE_CARRIES=save_carries, **constexprs(routes, D, delta_bias, delta_softplus, t, acc, width),
        num_warps=warps, maxnreg=max_registers,
    )
    if not save_carries:
        vcarry = vcarry.new_empty(0)
    return y, vcarry, hcarry


def empty_carries(maps: int, dim: int, nstate: int, height: int, width: int, num_routes: int, save: bool,
                   dtype: torch.dtype, like: Tensor) -> tuple[Tensor, Tensor]:
    """Empty (vcarry, hcarry) as ``launch_forward`` returns them (for fake implementations)."""
    v_numel, h_numel = _carry_numels(maps, dim, nstate, height, width, num_routes, True) if save else (0, 0)
    return like.new_empty(v_numel, dtype=dtype), like.new_empty(h_numel, dtype=dtype)


def launch_backward(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                    delta_bias: Optional[Tensor], delta_softplus: bool, routes: List[int], vcarry: Tensor,
                    hcarry: Tensor, dy: Tensor, param_groups: int) -> tuple[Tensor, ...]:
    """Run ``scan2d_bwd_kernel`` from the carries ``launch_forward`` saved: (du, ddelta, dA, dB, dC, dD,
    ddelta_bias), each shaped and typed like its input (dD / ddelta_bias empty when D / delta_bias is
    None). Inputs as ``launch_forward``; dy (maps, dim, H, W) contiguous."""
    maps, dim, height, width = u.shape
    num_routes, nstate = len(routes), A.shape[1]
    acc = acc_dtype(u, delta, B, C)
    expected = _carry_numels(maps, dim, nstate, height, width, num_routes, True)
    if (vcarry.numel(), hcarry.numel()) != expected:
        raise ValueError(f"the saved carries have {vcarry.numel()} / {hcarry.numel()} elements, expected "
                         f"{expected[0]} / {expected[1]}: run the forward op with save_carries=True on these inputs")
    t = cross_tiling(dim, nstate, height, width)
    sets = program_sets(t.n_chan_blocks, maps)
    n_groups = t.n_chan_blocks // sets
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dB_part = torch.zeros(maps, num_routes, n_groups, nstate, height, width, device=u.device, dtype=acc)
    dC_part = torch.zeros_like(dB_part)
    dA_part = torch.zeros(maps, num_routes * dim, nstate, device=u.device, dtype=acc)
    dD_part = torch.zeros(maps, num_routes * dim, device=u.device, dtype=acc)
    dbias_part = torch.zeros_like(dD_part)
    if u.numel() > 0:
        blocks = maps * t.n_chan_blocks
        vadj = torch.empty(blocks * t.block_d * t.block_n * t.n_tile_cols * t.tile_w, device=u.device, dtype=acc)
        hadj = torch.empty(blocks * t.block_d * t.block_n * t.tile_h, device=u.device, dtype=acc)
        duacc = du if du.dtype == acc or num_routes == 1 else torch.empty(u.shape, device=u.device, dtype=acc)
        grid = grid_args(u, A, t)
        warps, max_registers = launch_config(t, "bwd", num_routes)
        kernels().scan2d_bwd_kernel[(maps * n_groups,)](
            u, delta, A, B, C, D if D is not None else u, delta_bias if delta_bias is not None else u, dy,
            vcarry, hcarry, vadj, hadj, du, duacc, ddelta, dA_part, dB_part, dC_part, dD_part, dbias_part,
            *grid[:5], n_groups, sets, *grid[5:], param_groups,
            **constexprs(routes, D, delta_bias, delta_softplus, t, acc, width),
            num_warps=warps, maxnreg=max_registers,
        )
    else:
        du.zero_()
        ddelta.zero_()
    # Fixed-order sums of the per-program partials: deterministic, no atomics. Maps of one
    # parameter group are summed over the batch (map m = batch index * param_groups + group).
    rows = param_groups * num_routes * dim
    dB = dB_part.sum(dim=2).to(B.dtype)
    dC = dC_part.sum(dim=2).to(C.dtype)
    dA = dA_part.view(maps // param_groups, rows, nstate).sum(dim=0).to(A.dtype)
    dD = dD_part.view(maps // param_groups, rows).sum(dim=0).to(D.dtype) if D is not None else A.new_empty(0)
    dbias = (dbias_part.view(maps // param_groups, rows).sum(dim=0).to(delta_bias.dtype) if delta_bias is not None
             else A.new_empty(0))
    return du, ddelta, dA, dB, dC, dD, dbias
