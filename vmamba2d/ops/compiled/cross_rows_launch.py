"""Launching the v4 four-route forward (CrossRowsForward in csrc/cuda/scan2d_rows.cuh: VMamba's cross
routes in one kernel) through the NVRTC launcher, and the choice between it and v3's per-route kernels
for one call of the CUDA four-route op.

The choice is vmamba2d.ops.plan's rule for the call's routes among the designs this path launches
(``BUILT``: RS and v3; the four-route op has no PL), after the entry's preconditions: the cross
routes (codes 0, 4, 3, 7) in that order, N = 1, A, D, delta_bias contiguous fp32, delta, B, C
contiguous in the op's layout and a plan (rows_plan.cross_plan: 4 (fp16 / bf16), 2 or 1 columns a lane
dividing W; the entry compiled for the plan's blocks per SM).
The op's forward saves nothing for a backward (its backward recomputes from the inputs), so the
call never needs a gradient here. ``VMAMBA2D_SCAN_PLAN=v3`` pins v3 as for the single-route op.
The kernel sums the routes on chip and writes y in the type the caller asks for (fp32, or the
inputs' type): no fp32 y read and rewritten per route, no cast pass.

With the step-size projection (``delta_proj_weight`` (4, dim, R) fp32, delta the low-rank (batch, 4,
R, H, W)) the folding instance reads the low-rank delta and projects each channel's step sizes where
it reads them, where rows_plan.fold_rule says that pays (the plan's ``fold``); else the caller
projects first (vmamba2d.ops.delta_proj.project_delta) and the unfolded kernel or v3 runs.
"""
from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import torch

from vmamba2d.ops import plan as scan_plan
from vmamba2d.ops import tuning
from vmamba2d.ops.compiled import rows_plan
from vmamba2d.ops.compiled.cuda_kernels import KernelSpec, rows_cross_kernel
from vmamba2d.ops.compiled.rows_launch import PLAN_ENV, RowsParams, pinned_plan

BUILT = scan_plan.BUILT["cuda four-route"]  # the designs this path launches (vmamba2d.ops.plan.DESIGNS)
TUNED_KERNEL = "cuda-rs-cross"
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
ROUTES = len(rows_plan.CROSS_ROUTE_CODES)


class RowsFoldParams(ctypes.Structure):
    """csrc/cuda/scan2d_rows_common.h ``struct RowsFoldParams``, field for field (the folding entry's parameter)."""

    _fields_ = [("rows", RowsParams), ("delta_proj", ctypes.c_void_p), ("rank", ctypes.c_int)]


def check_projection(u: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor) -> int:
    """R of a four-route call with the step-size projection, after checking the shapes: weight (4, dim,
    R) and the low-rank delta (batch, 4, R, H, W) for u (batch, dim, H, W).

    Raises:
        ValueError: naming the argument whose shape does not match.
    """
    if u.dim() != 4:
        raise ValueError(f"u: expected (batch, dim, H, W), got shape {tuple(u.shape)}")
    batch, dim, height, width = u.shape
    if weight.dim() != 3 or tuple(weight.shape[:2]) != (ROUTES, dim) or weight.shape[2] < 1:
        raise ValueError(f"delta_proj_weight: expected (4, dim, R) with dim = {dim} and R >= 1, got shape "
                         f"{tuple(weight.shape)}")
    rank = weight.shape[2]
    if tuple(delta.shape) != (batch, ROUTES, rank, height, width):
        raise ValueError(f"delta: with delta_proj_weight, expected the low-rank (batch, 4, R, H, W) = "
                         f"{(batch, ROUTES, rank, height, width)}, got shape {tuple(delta.shape)}")
    return rank


def _float32_or_none(t: Optional[torch.Tensor], size: int) -> bool:
    return t is None or (t.dtype == torch.float32 and t.is_contiguous() and tuple(t.shape) == (size,))


def _layout_holds(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor], planes: Optional[int] = None) -> bool:
    """The four-route entry's layout, delta with ``planes`` planes per route (dim unless given: R of a
    folded call)."""
    if u.dim() != 4:
        return False
    batch, dim, height, width = u.shape
    maps = (batch, ROUTES, 1, height, width)
    return (tuple(delta.shape) == (batch, ROUTES, planes or dim, height, width) and tuple(B.shape) == maps
            and tuple(C.shape) == maps and tuple(A.shape) == (ROUTES * dim, 1) and A.dtype == torch.float32
            and all(t.is_contiguous() for t in (delta, A, B, C))
            and (u.is_contiguous() or u.is_contiguous(memory_format=torch.channels_last))
            and _float32_or_none(D, ROUTES * dim) and _float32_or_none(delta_bias, ROUTES * dim))


def scan_call(u: torch.Tensor, delta: torch.Tensor, B: torch.Tensor, C: torch.Tensor, routes: Sequence[int],
              direction: str) -> scan_plan.ScanCall:
    """What the design rule reads of a four-route call (u (batch, dim, H, W), B (batch, K, N, H, W);
    the input type None where u, delta, B, C differ; N and the map 0 where the shapes are not these)."""
    dtype = u.dtype if all(t.dtype == u.dtype for t in (delta, B, C)) else None
    height, width = (u.shape[2], u.shape[3]) if u.dim() == 4 else (0, 0)
    nstate = B.shape[2] if B.dim() == 5 else 0
    return scan_plan.ScanCall(nstate, height, width, dtype, tuple(int(r) for r in routes), direction, False)


def cross_forward_design(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                         D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor], routes: Sequence[int],
                         out_fp32: bool, delta_proj_weight: Optional[torch.Tensor] = None
                         ) -> tuple[str, Optional[rows_plan.CrossPlan], str]:
    """The design of one four-route forward: ("rs", plan, why) or ("v3", None, why).

    u (batch, dim, H, W), contiguous or channels-last; delta (batch, K, dim, H, W); A (K * dim, N);
    B, C (batch, K, N, H, W); D, delta_bias (K * dim,) or None; routes: the K route codes. With
    delta_proj_weight (K, dim, R), delta is the low-rank (batch, K, R, H, W) and the answer is whether
    the folding kernel takes the call: ("rs", plan with ``fold`` True, why) where rows_plan.fold_rule
    says folding pays (named in the reason); any other answer means the caller projects first
    (vmamba2d.ops.delta_proj.project_delta) and asks again with the full-rank delta.

    Raises:
        ValueError: delta_proj_weight or the low-rank delta of the wrong shape (check_projection).
    """
    rank = None if delta_proj_weight is None else check_projection(u, delta, delta_proj_weight)
    projected = "" if rank is None else "; step sizes projected first"
    if pinned_plan() == "v3":
        return "v3", None, f"{PLAN_ENV}=v3{projected}"
    call = scan_call(u, delta, B, C, routes, "forward")
    height, width = call.height, call.width
    design = scan_plan.choose_design(call, "cuda", BUILT)
    if design.name != "rs":
        return "v3", None, design.reason + projected
    if not _layout_holds(u, delta, A, B, C, D, delta_bias, rank):
        return "v3", None, ("tensors not in the four-route layout with contiguous delta, B, C and fp32 A, D, "
                            "delta_bias: the four-route RS entry's preconditions" + projected)
    y_bytes = 4 if out_fp32 else u.element_size()
    aligned = rows_plan.alignment(delta, B, C, *([u] if u.is_contiguous() else []))
    plan = rows_plan.cross_plan(u.element_size(), y_bytes, width, aligned)
    if plan is None:
        widths = "4, 2 or 1" if rows_plan.cross_max_vec(u.element_size()) == 4 else "2 or 1"
        return "v3", None, (f"{design.reason}, but no lane width of {widths} columns divides W = {width} within 32 "
                            f"lanes{projected}")
    if rank is None:
        return "rs", plan, design.reason
    if delta_proj_weight.dtype not in _DTYPE_NAMES:
        folds, why = False, f"step sizes projected first (delta_proj_weight {delta_proj_weight.dtype}: the folding "\
                            "entry widens fp32 / fp16 / bf16 weights)"
    else:
        folds, why = rows_plan.fold_rule(_DTYPE_NAMES[u.dtype], width, rank, height * width)
    scan_plan.debug_note(("cuda four-route fold", u.dtype, height, width, rank, folds), f"cuda four-route {why}")
    return "rs", plan.folding(u.element_size()) if folds else plan, f"{design.reason}; {why}"


def folds(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
          D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor], routes: Sequence[int], out_fp32: bool,
          delta_proj_weight: torch.Tensor) -> bool:
    """Whether the folding kernel takes a call with the step-size projection (shapes as in
    :func:`cross_forward_design`): the caller passes it the low-rank delta and the weight, else projects first."""
    design, plan, _ = cross_forward_design(u, delta, A, B, C, D, delta_bias, routes, out_fp32, delta_proj_weight)
    return design == "rs" and plan.fold


def plan_spec(plan: rows_plan.CrossPlan, dtype: torch.dtype) -> KernelSpec:
    """The NVRTC table entry of a four-route plan and input type."""
    return rows_cross_kernel(_DTYPE_NAMES[dtype], plan.vec, plan.load, plan.scan_steps, plan.fold, plan.min_blocks,
                             plan.prefetch)


def cross_params(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                 D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor], y: torch.Tensor, softplus: bool,
                 plan: rows_plan.CrossPlan, delta_proj_weight: Optional[torch.Tensor] = None
                 ) -> ctypes.Structure:
    """The kernel's parameter block for contiguous u, y (batch, dim, H, W); other shapes as in
    :func:`cross_forward_design`: RowsParams in the four-route layout (delta_planes = 4 * dim,
    bc_planes = 4, one group), or for a folding plan RowsFoldParams (delta the low-rank (batch, 4,
    R, H, W): delta_planes = 4 * R; the weight (4, dim, R) fp32 and R)."""
    batch, dim, height, width = u.shape
    planes = dim if delta_proj_weight is None else delta_proj_weight.shape[2]
    rows = RowsParams(
        u.data_ptr(), delta.data_ptr(), B.data_ptr(), C.data_ptr(), A.data_ptr(),
        None if D is None else D.data_ptr(), None if delta_bias is None else delta_bias.data_ptr(), y.data_ptr(),
        ROUTES * planes, ROUTES, batch, dim, 1, height, width, plan.seg_lanes, plan.maps_per_warp,
        int(bool(softplus)), int(y.dtype == torch.float32), 0)
    if plan.fold != (delta_proj_weight is not None):
        raise ValueError(f"delta_proj_weight: a {'folding' if plan.fold else 'full-rank'} plan "
                         f"{'needs' if plan.fold else 'takes no'} step-size projection")
    if delta_proj_weight is None:
        return rows
    return RowsFoldParams(rows, delta_proj_weight.data_ptr(), planes)


def tuning_candidates() -> list[dict[str, int]]:
    """Warps per block (4 first; 2, 1): bit-neutral, warp k of the grid runs item k whatever the
    block size. The prefetch depth is the plan's (rows_plan.cross_plan's estimate, compiled with its blocks
    per SM), not a tuner's knob."""
    return [{"warps": w} for w in (rows_plan.ROWS_THREADS // rows_plan.WARP_LANES, 2, 1)]


def tuning_key(u: torch.Tensor, y: torch.Tensor, softplus: bool, plan: rows_plan.CrossPlan, rank: int = 0) -> dict:
    """The tuner's key of a launch (as rows_launch.tuning_key, for the cross routes; ``rank``: R of a
    folding launch, 0 else)."""
    gpu, sms = u.device.type, 0
    if u.is_cuda:
        properties = torch.cuda.get_device_properties(u.device)
        gpu, sms = properties.name, properties.multi_processor_count
    batch, dim, height, width = u.shape
    key = {"gpu": gpu, "sms": sms, "dtype": _DTYPE_NAMES[u.dtype], "y": _DTYPE_NAMES[y.dtype], "batch": batch,
           "dim": dim, "groups": 1, "nstate": 1, "height": height, "width": width,
           "routes": list(rows_plan.CROSS_ROUTE_CODES), "direction": "forward", "softplus": bool(softplus),
           "vec": plan.vec, "load": plan.load, "prefetch": plan.prefetch}
    if rank:
        key["fold_rank"] = rank  # the folding kernel: another kernel, timed on its own
    return key


def launch_cross_forward(launcher, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                         C: torch.Tensor, D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor],
                         softplus: bool, out_fp32: bool, plan: rows_plan.CrossPlan,
                         tuner: Optional[tuning.Tuner] = None,
                         delta_proj_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y (batch, dim, H, W) in u's layout, fp32 if ``out_fp32`` else u's type: the four cross routes'
    sum by one launch of the four-route kernel on the current stream (``launcher``:
    cuda_launch.KernelLauncher), warps per block chosen by ``tuner`` (tuning.default_tuner() for CUDA
    tensors; other tensors -- a recording launcher's tests -- take 4 unless a tuner is given). A
    channels-last u is read through one contiguous copy and y returned channels-last (as v3). A
    folding plan (``plan.fold``) takes the low-rank delta (batch, 4, R, H, W) and delta_proj_weight
    (4, dim, R) in fp32 / fp16 / bf16 (the kernel reads it as fp32: a copy of this small tensor where
    it is not contiguous fp32; widening is exact)."""
    layout = torch.contiguous_format if u.is_contiguous() else torch.channels_last  # cross_ops.map_format
    u_map = u.contiguous()
    y = torch.empty(u_map.shape, dtype=torch.float32 if out_fp32 else u.dtype, device=u.device)
    if y.numel() == 0:
        return y.contiguous(memory_format=layout)
    if delta_proj_weight is not None:
        delta_proj_weight = delta_proj_weight.to(torch.float32).contiguous()
    params = bytes(cross_params(u_map, delta, A, B, C, D, delta_bias, y, softplus, plan, delta_proj_weight))
    rank = 0 if delta_proj_weight is None else delta_proj_weight.shape[2]
    spec = plan_spec(plan, u.dtype)

    def run(knobs) -> None:
        warps = knobs["warps"]
        launcher.launch(spec, (plan.blocks(u.shape[0], u.shape[1], warps), 1, 1), warps * rows_plan.WARP_LANES, 0,
                        [params])

    candidates = tuning_candidates()
    if u.is_cuda or tuner is not None:
        knobs = (tuner or tuning.default_tuner()).choose(TUNED_KERNEL, tuning_key(u_map, y, softplus, plan, rank),
                                                         candidates, run).knobs
    else:
        knobs = candidates[0]
    run(knobs)
    return y.contiguous(memory_format=layout)


def launch_forward(launcher, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor], softplus: bool,
                   routes: Sequence[int], out_fp32: bool,
                   delta_proj_weight: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """y of the four-route forward by the four-route kernel where :func:`cross_forward_design` picks RS,
    else None (the caller runs v3's per-route kernels). Shapes as in :func:`cross_forward_design`; with
    delta_proj_weight the call must be one the folding kernel takes (:func:`folds`).

    Raises:
        ValueError: delta_proj_weight given for a call the folding kernel does not take.
    """
    design, plan, why = cross_forward_design(u, delta, A, B, C, D, delta_bias, routes, out_fp32, delta_proj_weight)
    if delta_proj_weight is not None and not (design == "rs" and plan.fold):
        raise ValueError(f"delta_proj_weight: the folding kernel does not take this call ({why}); project the "
                         "step sizes first")
    if design != "rs":
        return None
    return launch_cross_forward(launcher, u, delta, A, B, C, D, delta_bias, softplus, out_fp32, plan,
                                delta_proj_weight=delta_proj_weight)
