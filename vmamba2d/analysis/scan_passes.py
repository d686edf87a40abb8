"""What the CUDA path of the four-route scan op moves in memory inside one forward call, pass by pass.

The byte account (:mod:`vmamba2d.analysis.traffic`) counts a scan op by default as a fused kernel
must move it: every input read once, y written once. :func:`cuda_cross_forward_passes` counts
instead what the compiled CUDA path runs today for ``vmamba2d::cross_selective_scan_2d_fwd``
(``vmamba2d.ops.compiled.cross_ops`` -> ``nvrtc_backend.cross_forward``), so the passes a fused
design removes stay visible:

- ``u-copy``: a channels-last u is copied to a contiguous map before the kernel (read + write);
- ``delta-projection``: the low-rank step sizes projected to the full-rank (batch, K, dim, H, W)
  ones by a bmm (low-rank delta and weight read, the full-rank delta written); the kernel then
  reads the full-rank delta -- unless the four-route RS kernel folds the projection
  (:func:`vmamba2d.ops.compiled.rows_plan.fold_rule`), when it reads the low-rank delta and the
  weight and there is no such pass;
- ``kernel``: the four-route RS kernel (two sweeps: u read once per sweep, each route's delta, B,
  C once, y written by the top-down sweep and read and rewritten by the bottom-up one), or, where
  the design rule picks v3, one launch per route (u, delta, B, C of the route read, an fp32 y
  written by the first route and read and rewritten by each later one);
- ``y-cast``: v3's fp32 y cast to the type asked for (read fp32, write);
- ``y-copy``: y laid out channels-last again when u was (read + write).

Which kernel runs follows the design rule (:func:`vmamba2d.ops.plan.choose_design` for the
``cuda four-route`` path and :func:`vmamba2d.ops.compiled.rows_plan.cross_plan`), with the tensors
taken as 16-byte aligned and in the op's layout (what the model passes). A count of bytes, not a
measurement.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

import torch

Tensor = torch.Tensor

CROSS_FORWARD_OP = "cross_selective_scan_2d_fwd"


@dataclasses.dataclass(frozen=True)
class ScanPass:
    """One pass of a scan op's implementation: ``name`` and the bytes it reads and writes."""

    name: str
    read: int
    written: int


def _nbytes(t: Optional[Tensor]) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def cuda_cross_design(u: Tensor, B: Tensor, routes: Sequence[int], out_fp32: bool) -> str:
    """The kernel design the CUDA four-route forward runs for these shapes: ``"rs"`` (the
    four-route RS kernel) or ``"v3"`` (one launch per route). u (batch, dim, H, W); B (batch, K, N,
    H, W); routes: the K route codes."""
    from vmamba2d.ops import plan as scan_plan
    from vmamba2d.ops.compiled import rows_plan

    height, width = u.shape[2], u.shape[3]
    call = scan_plan.ScanCall(B.shape[2], height, width, u.dtype, tuple(int(r) for r in routes), "forward", False)
    if scan_plan.choose_design(call, "cuda", scan_plan.BUILT["cuda four-route"]).name != "rs":
        return "v3"
    y_bytes = 4 if out_fp32 else u.element_size()
    return "rs" if rows_plan.cross_plan(u.element_size(), y_bytes, width) is not None else "v3"


def _folds(u: Tensor, delta: Tensor, weight: Tensor) -> bool:
    """Whether the four-route RS kernel projects the low-rank delta (batch, K, R, H, W) itself: its
    rule for the call's type, width and rank, and an fp32 contiguous weight (K, dim, R)."""
    from vmamba2d.ops.compiled import rows_plan

    if weight.dtype != torch.float32 or not weight.is_contiguous():
        return False
    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    height, width = u.shape[2], u.shape[3]
    return rows_plan.fold_rule(names[u.dtype], width, delta.shape[2], height * width)[0]


def cuda_cross_forward_passes(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                              delta_bias: Optional[Tensor], routes: Sequence[int], out_fp32: bool,
                              delta_proj_weight: Optional[Tensor] = None, delta_softplus: bool = True) -> List[ScanPass]:
    """The passes of one CUDA four-route forward (module doc), in the order they run.

    Args:
        u: (batch, dim, H, W), contiguous or channels-last; delta: (batch, K, dim, H, W), or the
            low-rank (batch, K, R, H, W) with ``delta_proj_weight`` (K, dim, R); A: (K * dim, N);
            B, C: (batch, K, N, H, W); D, delta_bias: (K * dim,) or None; routes: K route codes;
            out_fp32: y in fp32 rather than u's type; delta_softplus: moves no bytes (the op's
            argument, accepted so that a call's arguments pass as they are).
    Returns:
        the passes with their read / written bytes.
    """
    passes: List[ScanPass] = []
    u_bytes = _nbytes(u)
    channels_last = not u.is_contiguous()
    if channels_last:
        passes.append(ScanPass("u-copy", u_bytes, u_bytes))
    design = cuda_cross_design(u, B, routes, out_fp32)
    delta_bytes = _nbytes(delta)
    if delta_proj_weight is not None:
        if design == "rs" and _folds(u, delta, delta_proj_weight):
            delta_bytes += _nbytes(delta_proj_weight)
        else:
            batch, routes_k, _, height, width = delta.shape
            full = batch * routes_k * delta_proj_weight.shape[1] * height * width * delta.element_size()
            passes.append(ScanPass("delta-projection", _nbytes(delta) + _nbytes(delta_proj_weight), full))
            delta_bytes = full
    small = _nbytes(A) + _nbytes(D) + _nbytes(delta_bias)
    cells = u.numel()
    y_bytes = cells * (4 if out_fp32 else u.element_size())
    routes_k = len(routes)
    if design == "rs":
        # two sweeps of two routes each: u read per sweep, y written twice and read back once
        passes.append(ScanPass("kernel", 2 * u_bytes + delta_bytes + _nbytes(B) + _nbytes(C) + small + y_bytes,
                               2 * y_bytes))
    else:
        fp32_y = cells * 4
        passes.append(ScanPass("kernel", routes_k * u_bytes + delta_bytes + _nbytes(B) + _nbytes(C) + small
                               + (routes_k - 1) * fp32_y, routes_k * fp32_y))
        if not out_fp32 and u.element_size() != 4:
            passes.append(ScanPass("y-cast", fp32_y, y_bytes))
    if channels_last:
        passes.append(ScanPass("y-copy", y_bytes, y_bytes))
    return passes
