"""Launching the v4 row-streaming forward (RS) through the NVRTC launcher, and the choice among PL,
RS and the v3 kernel for one call of the single-route CUDA op.

The choice is a fixed rule of the call (never a timing): vmamba2d.ops.plan's rule for route 0 (the
op's route) among the designs this path launches (``BUILT``: PL, RS and v3), after the v4 entries'
preconditions on the tensors (A, D, delta_bias fp32, everything contiguous) and, for PL, a plan on
the GPU (vmamba2d/ops/compiled/planes_launch.py: alignment, shared memory); a design that cannot take
the call passes it to the next one of the rule, and the reason says why.
``VMAMBA2D_SCAN_PLAN=v3`` pins the v3 kernel for every call; ``auto`` (or unset) applies the rule.
The RS launch knobs that leave every output bit unchanged (rows_plan.tuning_candidates: prefetch
depth, warps per block) are chosen by vmamba2d.ops.tuning on the first call per key.
"""
from __future__ import annotations

import ctypes
import dataclasses
from typing import Optional, Union

import torch

from vmamba2d.ops import plan as scan_plan
from vmamba2d.ops import tuning
from vmamba2d.ops.compiled import planes_launch, rows_plan
from vmamba2d.ops.compiled.cuda_kernels import KernelSpec, rows_kernel
from vmamba2d.ops.compiled.cuda_launch import DeviceInfo
from vmamba2d.ops.settings import env_choice

PLAN_ENV = "VMAMBA2D_SCAN_PLAN"
_PLAN_CHOICES = ("auto", "v3")
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
OP_ROUTE = 0  # the single-route op scans from the top-left corner, rows first (Route code 0)
BUILT = scan_plan.BUILT["cuda single-route"]  # the designs this path launches (vmamba2d.ops.plan.DESIGNS)
TUNED_KERNEL = "cuda-rs"


class RowsParams(ctypes.Structure):
    """csrc/cuda/scan2d_rows_common.h ``struct RowsParams``, field for field (the kernel's parameter)."""

    _fields_ = [
        ("u", ctypes.c_void_p), ("delta", ctypes.c_void_p), ("B", ctypes.c_void_p), ("C", ctypes.c_void_p),
        ("A", ctypes.c_void_p), ("D", ctypes.c_void_p), ("delta_bias", ctypes.c_void_p), ("y", ctypes.c_void_p),
        ("delta_planes", ctypes.c_longlong), ("bc_planes", ctypes.c_longlong),
        ("batch", ctypes.c_int), ("dim", ctypes.c_int), ("groups", ctypes.c_int), ("height", ctypes.c_int),
        ("width", ctypes.c_int), ("seg_lanes", ctypes.c_int), ("maps_per_warp", ctypes.c_int),
        ("softplus", ctypes.c_int), ("y_fp32", ctypes.c_int), ("from_bottom", ctypes.c_int),
    ]


def pinned_plan() -> str:
    """The VMAMBA2D_SCAN_PLAN setting: "auto" (unset) or "v3".

    Raises:
        ValueError: any other value.
    """
    return env_choice(PLAN_ENV, _PLAN_CHOICES, "auto")


def _float32_or_none(t: Optional[torch.Tensor]) -> bool:
    return t is None or (t.dtype == torch.float32 and t.is_contiguous())


def forward_design(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor], width: int, out_fp32: bool,
                   save_carries: bool, device: Optional[DeviceInfo] = None
                   ) -> tuple[str, Optional[Union[planes_launch.PlanesPlan, rows_plan.RowsPlan]], str]:
    """The design of one single-route forward: ("pl", PlanesPlan, why), ("rs", RowsPlan, why) or
    ("v3", None, why).

    u, delta (batch, dim, L); A (dim, N); B, C (batch, groups, N, L); D, delta_bias (dim,) or None;
    device: the limits of u's GPU (cuda_launch.DeviceInfo), which PL's shared-memory plan needs --
    without them PL is passed over (the reason says so).
    """
    if pinned_plan() == "v3":
        return "v3", None, f"{PLAN_ENV}=v3"
    dtype = u.dtype if all(t.dtype == u.dtype for t in (delta, B, C)) else None
    height = u.shape[2] // max(width, 1)
    call = scan_plan.ScanCall(B.shape[2], height, width, dtype, (OP_ROUTE,), "forward", save_carries)
    design = scan_plan.choose_design(call, "cuda", BUILT)
    if design.name == "v3":
        return "v3", None, design.reason
    if not (A.dtype == torch.float32 and _float32_or_none(D) and _float32_or_none(delta_bias)
            and all(t.is_contiguous() for t in (u, delta, A, B, C))):
        return "v3", None, ("A, D, delta_bias not contiguous fp32 or inputs not contiguous: the v4 entries' "
                            "preconditions")
    reason = design.reason
    if design.name == "pl":
        plan = None if device is None else planes_launch.planes_plan(
            u.element_size(), out_fp32, u.shape[0], u.shape[1], B.shape[1], height, width, OP_ROUTE,
            planes_launch.copy_width(u, delta, B, C), device.smem_per_block, device.smem_per_sm,
            device.reserved_smem_per_block)
        if plan is not None:
            return "pl", plan, reason
        (_, pl_why), (name, why) = scan_plan.preferred(call, "cuda")[:2]  # PL's row goes on to RS
        missing = "no GPU limits given" if device is None else \
            "no plan for these tensors' alignment or this GPU's shared memory"
        reason = f"PL ({pl_why}): {missing}; {name.upper()}: {why}"
    y_bytes = 4 if out_fp32 else u.element_size()
    plan = rows_plan.rows_plan(u.element_size(), y_bytes, width, OP_ROUTE, rows_plan.alignment(u, delta, B, C))
    return "rs", plan, reason


def plan_spec(plan: rows_plan.RowsPlan, dtype: torch.dtype) -> KernelSpec:
    """The NVRTC table entry of a plan and input type (the RS entry with the plan's macros)."""
    return rows_kernel(_DTYPE_NAMES[dtype], plan.vec, plan.load, plan.prefetch, plan.scan_steps, OP_ROUTE)


def rows_params(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor], y: Optional[torch.Tensor],
                softplus: bool, height: int, width: int, plan: rows_plan.RowsPlan, routes: int = 1,
                route_index: int = 0) -> RowsParams:
    """The kernel's parameter block for one single-route launch (shapes as in :func:`forward_design`);
    y None: a null y (the saving forward then stores the carries only). With ``routes`` > 1, delta
    (batch, routes * dim, L) and B, C (batch, routes * groups, 1, L) hold a multi-route op's planes and
    the launch reads route ``route_index``'s (its first element, the layout's planes per batch entry)."""
    batch, dim, length = u.shape
    groups = B.shape[1] // routes
    delta_at = delta.data_ptr() + route_index * dim * length * delta.element_size()
    bc_skip = route_index * groups * length * B.element_size()
    return RowsParams(
        u.data_ptr(), delta_at, B.data_ptr() + bc_skip, C.data_ptr() + bc_skip, A.data_ptr(),
        None if D is None else D.data_ptr(), None if delta_bias is None else delta_bias.data_ptr(),
        None if y is None else y.data_ptr(), routes * dim, routes * groups, batch, dim, groups, height, width,
        plan.seg_lanes, plan.maps_per_warp, int(bool(softplus)), int(y is not None and y.dtype == torch.float32),
        int(bool(OP_ROUTE & 2)))


def tuning_key(u: torch.Tensor, y: torch.Tensor, B: torch.Tensor, softplus: bool, height: int, width: int,
               plan: rows_plan.RowsPlan) -> dict:
    """The tuner's key of a launch (GPU name and SM count -- the device type and 0 off a GPU --, types,
    shape, N, route, direction, the plan's V and load width)."""
    gpu, sms = u.device.type, 0
    if u.is_cuda:
        properties = torch.cuda.get_device_properties(u.device)
        gpu, sms = properties.name, properties.multi_processor_count
    return {"gpu": gpu, "sms": sms, "dtype": _DTYPE_NAMES[u.dtype],
            "y": _DTYPE_NAMES[y.dtype], "batch": u.shape[0], "dim": u.shape[1], "groups": B.shape[1],
            "nstate": B.shape[2], "height": height, "width": width, "routes": [OP_ROUTE], "direction": "forward",
            "softplus": bool(softplus), "vec": plan.vec, "load": plan.load}


def launch_rows_forward(launcher, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                        C: torch.Tensor, D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor],
                        softplus: bool, height: int, width: int, out_fp32: bool,
                        plan: rows_plan.RowsPlan, tuner: Optional[tuning.Tuner] = None) -> torch.Tensor:
    """y (batch, dim, L), fp32 if ``out_fp32`` else u's type: the RS forward launched on the current
    stream (``launcher``: cuda_launch.KernelLauncher) with the plan's layout and the prefetch depth and
    warps per block that ``tuner`` picks among rows_plan.tuning_candidates: tuning.default_tuner()
    for CUDA tensors; other tensors (a recording launcher's tests) take the plan's own unless a
    tuner is given."""
    y = torch.empty(u.shape, dtype=torch.float32 if out_fp32 else u.dtype, device=u.device)
    if y.numel() == 0:
        return y
    params = bytes(rows_params(u, delta, A, B, C, D, delta_bias, y, softplus, height, width, plan))

    def run(knobs) -> None:
        warps = knobs["warps"]
        spec = plan_spec(dataclasses.replace(plan, prefetch=knobs["prefetch"]), u.dtype)
        launcher.launch(spec, (plan.blocks(u.shape[0], u.shape[1], warps), 1, 1), warps * rows_plan.WARP_LANES, 0,
                        [params])

    candidates = rows_plan.tuning_candidates(plan)
    if u.is_cuda or tuner is not None:
        knobs = (tuner or tuning.default_tuner()).choose(
            TUNED_KERNEL, tuning_key(u, y, B, softplus, height, width, plan), candidates, run).knobs
    else:
        knobs = candidates[0]
    run(knobs)
    return y


def launch_forward(launcher, device: DeviceInfo, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor,
                   B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor],
                   softplus: bool, height: int, width: int, out_fp32: bool,
                   save_carries: bool) -> Optional[torch.Tensor]:
    """y (batch, dim, L) of the single-route forward by the v4 design :func:`forward_design` picks (PL
    or RS, on the current stream; ``launcher``: cuda_launch.KernelLauncher, ``device``: its DeviceInfo
    of the tensors' GPU), or None where it picks v3 (the caller runs the v3 kernel). Shapes as in
    :func:`forward_design`."""
    design, plan, _ = forward_design(u, delta, A, B, C, D, delta_bias, width, out_fp32, save_carries, device)
    if design == "pl":
        return planes_launch.launch_planes_forward(launcher, device, u, delta, A, B, C, D, delta_bias, softplus,
                                                   height, width, OP_ROUTE, out_fp32)
    if design == "rs":
        return launch_rows_forward(launcher, u, delta, A, B, C, D, delta_bias, softplus, height, width, out_fp32,
                                   plan)
    return None
