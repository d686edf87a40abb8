"""The single-route op's backward at N = 1 as the RS backward: one saving forward (its band carries)
and one RS backward of the op's route (rows_backward_launch), where :func:`backward_design` says so
-- the rule's row 0 (vmamba2d.ops.plan) and the ``VMAMBA2D_SCAN_BACKWARD=auto`` opt-in; unset, the
op keeps the v3 backward until a GPU run has measured RS against it, as the four-route op does
(vmamba2d.ops.compiled.cross_rows_backward). The v3 forward's saved carries are not read.
"""
from __future__ import annotations

from typing import Optional

import torch

from vmamba2d.ops import plan as scan_plan
from vmamba2d.ops.compiled import rows_backward_launch as rbl
from vmamba2d.ops.compiled.rows_launch import OP_ROUTE
from vmamba2d.ops.compiled.rows_plan import alignment

Tensor = torch.Tensor
BUILT = scan_plan.BUILT["cuda single-route backward"]
_FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def backward_design(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                    delta_bias: Optional[Tensor], height: int, width: int, dy: Tensor) -> tuple[str, str]:
    """("rs", why) where the single-route backward runs as the RS backward, else ("v3", why): the
    VMAMBA2D_SCAN_BACKWARD pin (v3 unless ``auto``), the rule (direction "backward") on the call's
    shape, then the tensors the RS launchers take -- u, delta, dy (batch, dim, L), B, C (batch,
    groups, 1, L), contiguous; A (dim, 1), D, delta_bias (dim,) or None, fp32; dy in u's type or fp32.

    Raises:
        ValueError: VMAMBA2D_SCAN_BACKWARD set to something else than v3 / auto.
    """
    if scan_plan.backward_pin() == "v3":
        return "v3", (f"{scan_plan.BACKWARD_ENV} unset or v3: the v3 backward until a GPU run has measured the RS "
                      "backward against it")
    dtype = u.dtype if all(t.dtype == u.dtype for t in (delta, B, C)) else None
    call = scan_plan.ScanCall(B.shape[2] if B.dim() == 4 else 0, height, width, dtype, (OP_ROUTE,), "backward")
    design = scan_plan.choose_design(call, "cuda", BUILT)
    if design.name != "rs":
        return "v3", design.reason
    fp32 = A.dtype == torch.float32 and all(t is None or t.dtype == torch.float32 for t in (D, delta_bias))
    contiguous = all(t.is_contiguous() for t in (u, delta, A, B, C, dy))
    if not (fp32 and contiguous and u.dtype in _FLOAT_TYPES and dy.dtype in (u.dtype, torch.float32)):
        return "v3", (f"{design.reason}, but the tensors are not what the RS launchers take (contiguous, fp32 A / "
                      "D / delta_bias, dy in u's type or fp32)")
    return "rs", design.reason


def launch_backward(launcher, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                    delta_bias: Optional[Tensor], softplus: bool, height: int, width: int, dy: Tensor
                    ) -> Optional[tuple]:
    """(du, ddelta, dA, dB, dC, dD, ddelta_bias) of the single-route scan from the RS saving forward
    and backward on u's GPU where :func:`backward_design` picks them (inputs as there; dD /
    ddelta_bias None without D / delta_bias), else None (the caller runs v3). The decision is
    printed once per shape where VMAMBA2D_DEBUG_PLAN is set."""
    design, why = backward_design(u, delta, A, B, C, D, delta_bias, height, width, dy)
    scan_plan.debug_note(("cuda single-route backward", u.dtype, (height, width), design),
                         f"cuda single-route backward {(height, width)} {u.dtype} -> {design} ({why})")
    if design != "rs":
        return None
    plan = rbl.backward_plan(u.element_size(), dy.element_size(), width, alignment(u, delta, B, C, dy))
    with torch.cuda.device(u.device):
        _, carries = rbl.launch_forward_save(launcher, u, delta, A, B, C, D, delta_bias, softplus, height, width,
                                             False, plan, OP_ROUTE, store_y=False)
        return rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, delta_bias, softplus, height, width, dy,
                                        carries, plan, OP_ROUTE)
