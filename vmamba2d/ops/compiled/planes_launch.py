"""Launching the v4 one-plane-per-lane forward (PL, csrc/cuda/scan2d_planes.cuh) through the NVRTC
launcher: its plan (copy width, chunk, persistent grid), its shared memory (a mirror of
``planes_layout`` in csrc/cuda/scan2d_planes_common.h) and its parameter block.

PL takes the N = 1 single-route scan of small maps: H * W <= 64 cells (the model's 7 x 7 stage; any
shape of up to 64 cells, square or not), any route code 0-15, fp32 / fp16 / bf16 inputs of one type
(y in that type or fp32), D and delta_bias optional, u / delta / B / C / y aligned to at least 4
bytes. Which design runs a call is the planner's rule (rows_plan / the op's dispatch); this module
only plans and launches PL where it is asked to.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Optional

import torch

from vmamba2d.ops.compiled.cuda_kernels import KernelSpec, planes_kernel

MAX_CELLS = 64  # kMaxCells
PLANES_THREADS = 128  # kPlanesThreads: the entry's largest CTA (launch bounds)
MIN_BLOCKS = 8  # kPlanesMinBlocks: the entry's registers are capped for 8 CTAs of 128 threads
CHUNKS = (128, 64, 32)  # maps per chunk (= threads per CTA), widest first
COPY_WIDTHS = (16, 8, 4)
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class PlanesParams(ctypes.Structure):
    """csrc/cuda/scan2d_planes_common.h ``struct PlanesParams``, field for field (the kernel's parameter)."""

    _fields_ = [
        ("u", ctypes.c_void_p), ("delta", ctypes.c_void_p), ("B", ctypes.c_void_p), ("C", ctypes.c_void_p),
        ("A", ctypes.c_void_p), ("D", ctypes.c_void_p), ("delta_bias", ctypes.c_void_p), ("y", ctypes.c_void_p),
        ("delta_planes", ctypes.c_longlong), ("bc_planes", ctypes.c_longlong),
        ("batch", ctypes.c_int), ("dim", ctypes.c_int), ("groups", ctypes.c_int), ("height", ctypes.c_int),
        ("width", ctypes.c_int), ("route", ctypes.c_int), ("chunk", ctypes.c_int), ("copy_bytes", ctypes.c_int),
        ("softplus", ctypes.c_int), ("y_fp32", ctypes.c_int),
    ]


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def _bank_ways(nbytes: int) -> int:
    words = nbytes // 4
    return min(words & -words, 32)


def plane_pitch(length: int, elem: int, copy: int) -> int:
    """Bytes from one staged plane to the next (``planes_pitch``): a plane of whole copies takes one
    copy of padding where that spreads a warp's loads of a cell over more banks; others are packed."""
    plane = length * elem
    if plane % copy:
        return plane
    return plane + copy if _bank_ways(plane + copy) < _bank_ways(plane) else plane


def _region(planes: int, segments: int, length: int, elem: int, copy: int) -> int:
    return _round16(planes * plane_pitch(length, elem, copy) + 2 * copy * segments)


def smem_bytes(batch: int, dim: int, groups: int, height: int, width: int, delta_planes: int, bc_planes: int,
               chunk: int, copy_bytes: int, elem: int, y_fp32: bool) -> int:
    """Dynamic shared memory of a launch, in bytes: ``planes_layout(p, elem).total`` (two buffers of
    u, delta, B, C regions, plus an fp32 y region where y is fp32 and the inputs are not).

    batch x dim maps of height x width cells; delta_planes / bc_planes: planes per batch entry of delta
    and B / C (dim / groups for the single-route layout); elem: input element bytes.
    """
    del batch  # a chunk's layout does not depend on it
    length = height * width
    batches = min(chunk, -(-(chunk - 1) // dim) + 1)
    keys = min(chunk, -(-(chunk - 1) // (dim // groups)) + 1)
    u = _region(chunk, 1, length, elem, copy_bytes)
    delta = _region(chunk, 1 if delta_planes == dim else batches, length, elem, copy_bytes)
    bc = _region(keys, 1 if bc_planes == groups else batches, length, elem, copy_bytes)
    buffer = u + delta + 2 * bc
    y_apart = y_fp32 and elem != 4
    return 2 * buffer + (_region(chunk, 1, length, 4, copy_bytes) if y_apart else 0)


@dataclass(frozen=True)
class PlanesPlan:
    """One PL launch: what the entry compiles in (shape, route, copy width) and the CTA it runs.

    height, width: the plane (height * width <= 64); route: the route code; copy_bytes: bytes per
    asynchronous copy and staged store (16, 8 or 4); chunk: maps per chunk = threads per CTA;
    smem: dynamic shared memory per CTA; ctas_per_sm: CTAs resident per SM (shared memory, registers).
    """

    height: int
    width: int
    route: int
    copy_bytes: int
    chunk: int
    smem: int
    ctas_per_sm: int

    def spec(self, dtype: torch.dtype) -> KernelSpec:
        """The NVRTC table entry of this plan for the input type."""
        return planes_kernel(_DTYPE_NAMES[dtype], self.height, self.width, self.route, self.copy_bytes)

    def grid(self, batch: int, dim: int, sm_count: int) -> int:
        """Persistent CTAs for batch x dim maps: every resident slot of the GPU, at most one per chunk."""
        chunks = -(-batch * dim // self.chunk)
        return max(1, min(chunks, sm_count * self.ctas_per_sm))


def copy_width(*tensors: Optional[torch.Tensor]) -> int:
    """The widest of 16, 8, 4 bytes every tensor's address is aligned to (0: none)."""
    return next((w for w in COPY_WIDTHS if all(t is None or t.data_ptr() % w == 0 for t in tensors)), 0)


def planes_plan(elem: int, y_fp32: bool, batch: int, dim: int, groups: int, height: int, width: int, route: int,
                alignment: int, smem_per_block: int, smem_per_sm: int, reserved_smem: int = 0,
                delta_planes: Optional[int] = None, bc_planes: Optional[int] = None) -> Optional[PlanesPlan]:
    """The PL plan of a call, or None where PL cannot run it (also for no maps at all).

    elem: input element bytes (4 or 2); y_fp32: y in fp32; batch x dim maps in groups of B / C,
    height x width cells, route code 0-15; alignment: copy_width of the tensors (u, delta, B, C, y);
    smem_per_block / smem_per_sm / reserved_smem: the device's opt-in limit per CTA, shared memory per
    SM and the driver's reservation per CTA (cuda_launch.DeviceInfo). The widest chunk of CHUNKS whose
    layout fits smem_per_block wins (the copy width is the alignment's).
    """
    if height * width > MAX_CELLS or height < 1 or width < 1 or not 0 <= route < 16:
        return None
    if alignment not in COPY_WIDTHS or elem > alignment or not 0 < batch * dim < 2 ** 31 or groups < 1 \
            or dim % groups:
        return None
    delta_planes = dim if delta_planes is None else delta_planes
    bc_planes = groups if bc_planes is None else bc_planes
    for chunk in CHUNKS:
        smem = smem_bytes(batch, dim, groups, height, width, delta_planes, bc_planes, chunk, alignment, elem, y_fp32)
        if smem <= smem_per_block:
            ctas = min(MIN_BLOCKS * PLANES_THREADS // chunk, smem_per_sm // (smem + reserved_smem))
            if ctas >= 1:
                return PlanesPlan(height, width, route, alignment, chunk, smem, ctas)
    return None


def planes_params(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor], y: torch.Tensor, softplus: bool,
                  plan: PlanesPlan) -> PlanesParams:
    """The kernel's parameter block of one single-route launch: u, delta, y (batch, dim, L); A (dim, 1);
    B, C (batch, groups, 1, L); D, delta_bias (dim,) or None."""
    batch, dim, _ = u.shape
    groups = B.shape[1]
    return PlanesParams(
        u.data_ptr(), delta.data_ptr(), B.data_ptr(), C.data_ptr(), A.data_ptr(),
        None if D is None else D.data_ptr(), None if delta_bias is None else delta_bias.data_ptr(), y.data_ptr(),
        dim, groups, batch, dim, groups, plan.height, plan.width, plan.route, plan.chunk, plan.copy_bytes,
        int(bool(softplus)), int(y.dtype == torch.float32))


def launch_planes_forward(launcher, device_info, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor,
                          B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor],
                          delta_bias: Optional[torch.Tensor], softplus: bool, height: int, width: int, route: int,
                          out_fp32: bool) -> torch.Tensor:
    """y (batch, dim, L), fp32 if ``out_fp32`` else u's type: the route's 2D scan (N = 1) by PL, on the
    current stream (``launcher``: cuda_launch.KernelLauncher; ``device_info``: its DeviceInfo of the
    tensors' device).

    Accepts contiguous u, delta (batch, dim, L) and B, C (batch, groups, 1, L) of one type (fp32, fp16,
    bf16), A (dim, 1) and D, delta_bias (dim,) or None in fp32, L = height * width <= 64, route 0-15,
    every tensor 4-byte aligned.

    Raises:
        ValueError: a call PL cannot run (the message says which condition fails).
    """
    if u.dtype not in _DTYPE_NAMES or any(t.dtype != u.dtype for t in (delta, B, C)):
        raise ValueError(f"u, delta, B, C: expected one of fp32 / fp16 / bf16, got {u.dtype}, {delta.dtype}, "
                         f"{B.dtype}, {C.dtype}")
    batch, dim, length = u.shape
    if B.dim() != 4 or B.shape[2] != 1 or length != height * width:
        raise ValueError(f"B: expected (batch, groups, 1, {height} * {width}), got {tuple(B.shape)}")
    if not all(t.is_contiguous() for t in (u, delta, A, B, C)) or any(
            t is not None and (t.dtype != torch.float32 or not t.is_contiguous()) for t in (A, D, delta_bias)):
        raise ValueError("u, delta, B, C: expected contiguous tensors; A, D, delta_bias: contiguous fp32")
    y = torch.empty(u.shape, dtype=torch.float32 if out_fp32 else u.dtype, device=u.device)
    if y.numel() == 0:
        return y
    plan = planes_plan(u.element_size(), out_fp32, batch, dim, B.shape[1], height, width, route,
                       copy_width(u, delta, B, C, y), device_info.smem_per_block, device_info.smem_per_sm,
                       device_info.reserved_smem_per_block)
    if plan is None:
        raise ValueError(f"PL cannot run a {height} x {width} map (route {route}, {u.dtype}) with these tensors: it "
                         f"needs H * W <= {MAX_CELLS}, route 0-15, 4-byte aligned tensors and a chunk of at least "
                         f"{CHUNKS[-1]} maps in {device_info.smem_per_block} bytes of shared memory")
    params = planes_params(u, delta, A, B, C, D, delta_bias, y, softplus, plan)
    grid = (plan.grid(batch, dim, device_info.sm_count), 1, 1)
    launcher.launch(plan.spec(u.dtype), grid, plan.chunk, plan.smem, [bytes(params)])
    return y
