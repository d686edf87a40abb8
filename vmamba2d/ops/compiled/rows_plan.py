"""Plan of the v4 row-streaming forward (RS, csrc/cuda/scan2d_rows.cuh) and its tuning candidates
(the rule that picks RS for a call: vmamba2d/ops/plan.py).

RS runs the N = 1 scan with one warp per M maps, each map a segment of S lanes, each lane owning V
consecutive columns of every row (docs/kernels.md, "v4"). The plan fixes what the kernel compiles in
(the entry file's macros, :meth:`RowsPlan.defines`) and the lane layout the launch passes
(``seg_lanes``, ``maps_per_warp`` of RowsParams in csrc/cuda/scan2d_rows_common.h).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

WARP_LANES = 32
ROWS_THREADS = 128  # threads per block of the RS entry (kRowsThreads)
_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_FROM_BOTTOM, _COLUMNS_FIRST, _FLAT = 2, 4, 8


@dataclass(frozen=True)
class RowsPlan:
    """One RS launch's compiled configuration and lane layout.

    vec: columns per lane (V); load: elements per global access (V: one vector, or 1: scalars);
    prefetch: rows of u, delta, B, C loaded ahead (P, prefetch_rows); seg_lanes: lanes per map (S = ceil(W / V));
    maps_per_warp: M = 32 // S; scan_steps: ceil(log2 S), the segmented warp scan's steps.
    """

    vec: int
    load: int
    prefetch: int
    seg_lanes: int
    maps_per_warp: int
    scan_steps: int

    def defines(self, dtype: torch.dtype, route: int) -> dict[str, int]:
        """The macros of csrc/cuda/entries/scan2d_rows_entry.cu for this plan, input type and route code
        (its from_bottom bit is a run-time parameter and is dropped)."""
        return {
            "VMAMBA2D_RS_DTYPE": _DTYPE_CODES[dtype],
            "VMAMBA2D_RS_VEC": self.vec,
            "VMAMBA2D_RS_LOAD": self.load,
            "VMAMBA2D_RS_ROUTE": route & ~_FROM_BOTTOM,
            "VMAMBA2D_RS_PREFETCH": self.prefetch,
            "VMAMBA2D_RS_STEPS": self.scan_steps,
        }

    def blocks(self, batch: int, dim: int, warps: int = ROWS_THREADS // WARP_LANES) -> int:
        """Grid size of a launch over batch x dim maps (one warp per maps_per_warp maps) with
        ``warps`` warps per block."""
        items = -(-batch * dim // self.maps_per_warp)
        return -(-items // warps)


def route_streams_rows(route: int) -> bool:
    """Whether a route code (vmamba2d.ops.Route.code) is a row stream: every 2D route and the flat
    row-major ones; flat column-major routes (codes 12-15) are not."""
    return 0 <= route < 16 and not (route & _FLAT and route & _COLUMNS_FIRST)


def prefetch_rows(vec: int) -> int:
    """P, the rows loaded ahead, for V columns per lane: 1 (see rows_plan). The kernel takes any P
    >= 1 with the same arithmetic (only where loads are issued moves): a tuning knob."""
    return 1


def tuning_candidates(plan: RowsPlan) -> list[dict[str, int]]:
    """The launch settings a tuner may pick for a plan, the plan's own (P, 4 warps per block) first.

    Both knobs leave every output bit unchanged: ``prefetch`` (P) only moves the loads of a row
    earlier, the arithmetic and its order per cell are the same (the host emulation runs P = 1 and
    P = 2 and the tests hold them bit-equal); ``warps`` per block (4, 2, 1; the entry is compiled for
    at most ROWS_THREADS threads) only groups warps into blocks: warp k of the grid runs item k
    whatever the block size. P = 2 is offered for V <= 2 only: at 4 columns it spills on sm_90
    (rows_plan below). V, the load width and the scan steps are not tuned: V
    changes the order of the row scan's products, and the rule fixes the load width and steps.
    """
    prefetch = (plan.prefetch, 2) if plan.vec <= 2 and plan.prefetch != 2 else (plan.prefetch,)
    return [{"prefetch": p, "warps": w} for p in prefetch for w in (ROWS_THREADS // WARP_LANES, 2, 1)]


def scan_steps(seg_lanes: int) -> int:
    """ceil(log2(seg_lanes)): the segmented warp scan's shuffle steps."""
    return max(seg_lanes - 1, 0).bit_length()


def layout(width: int, vec: int, load: int) -> RowsPlan:
    """The plan with ``vec`` columns per lane and ``load`` elements per access (prefetch by V)."""
    if vec not in (1, 2, 4, 8) or -(-width // vec) > WARP_LANES:
        raise ValueError(f"vec: expected 1, 2, 4 or 8 with ceil(width / vec) <= 32, got {vec} for width {width}")
    if load not in (1, vec) or (load > 1 and width % vec):
        raise ValueError(f"load: expected 1, or vec where vec divides the width {width}, got {load}")
    seg = -(-width // vec)
    return RowsPlan(vec, load, prefetch_rows(vec), seg, WARP_LANES // seg, scan_steps(seg))


def alignment(*tensors: torch.Tensor) -> int:
    """The largest power of two up to 16 dividing every tensor's data address."""
    bits = 16
    for t in tensors:
        bits |= t.data_ptr()
    return bits & -bits


def rows_plan(elem_bytes: int, y_bytes: int, width: int, route: int, aligned_bytes: int = 16) -> Optional[RowsPlan]:
    """The RS plan of a map width, or None where RS does not apply (route not a row stream, or W
    wider than 32 lanes of 16 bytes).

    V: the widest power of two up to a 16-byte vector (4 fp32, 8 fp16 / bf16 columns) that divides W
    with ceil(W / V) <= 32 lanes (fewer, wider lanes amortise the per-lane scan steps; at 8 columns
    2-byte types fit 64 registers without spills on sm_90 / sm_80 / sm_75 and take ~11% fewer SASS per
    cell·channel than at 4 -- 34.7 against 39.1 bf16 at W = 56 on sm_90, compiler figures in
    benchmarks/scan_cuda_v4_static.md -- with 63-64 registers, 32 warps per SM instead of 40); where
    none divides, the narrowest that fits W into 32 lanes (the last lane of a segment is then ragged).
    Vector accesses when V > 1 divides W and ``aligned_bytes`` (alignment of u, delta, B, C and y)
    holds a vector of the inputs and of y, else scalar ones. 8 columns spill ~1 KiB on sm_90 with
    scalar accesses or a ragged lane, so a width they divide takes them only as vectors (else 4); a
    2-byte width over 128 that 8 does not divide has no other plan (ragged, spilling). P = 1 row ahead: delta, B and u of the next row are loaded
    right after their last use, C after the row's y, so a whole row of work hides them; 2 rows cost
    registers and 10-25% more instructions per cell (sm_90; at 4 columns they spill).
    """
    if elem_bytes not in (2, 4) or y_bytes not in (2, 4):
        raise ValueError(f"elem_bytes, y_bytes: expected 2 or 4, got {elem_bytes}, {y_bytes}")
    max_vec = 16 // elem_bytes
    if not route_streams_rows(route) or not 1 <= width <= WARP_LANES * max_vec:
        return None
    fits = [v for v in (8, 4, 2, 1) if v <= max_vec and -(-width // v) <= WARP_LANES]

    def vector(v: int) -> bool:
        return v > 1 and width % v == 0 and aligned_bytes % (v * elem_bytes) == 0 \
            and aligned_bytes % min(16, v * y_bytes) == 0

    vec = next((v for v in fits if width % v == 0 and (v < 8 or vector(v))), fits[-1])
    return layout(width, vec, vec if vector(vec) else 1)


@dataclass(frozen=True)
class CrossPlan(RowsPlan):
    """A plan of the four-route kernel: a RowsPlan and ``fold``, whether the instance projects the
    low-rank step sizes itself (CrossRowsForward's kFold; fold_rule)."""

    fold: bool = False


CROSS_ROUTE_CODES = (0, 4, 3, 7)  # vmamba2d.ops.CROSS_ROUTES' codes: the four-route kernel's routes, in order
CROSS_MAX_VEC = 2  # two routes' state per column: 4 columns a lane spill at 64 registers


def cross_plan(elem_bytes: int, y_bytes: int, width: int, aligned_bytes: int = 16) -> Optional[CrossPlan]:
    """The plan of the four-route RS kernel (CrossRowsForward, VMamba's cross routes in one launch),
    or None where it does not apply.

    V: the widest of 2, 1 that divides W with W / V <= 32 lanes (the kernel needs V | W: no ragged
    lane; it holds two routes' state per column, and 4 columns spill in 64 registers:
    benchmarks/scan_cuda_v4_static.md); None for odd W > 32 and W > 64. Vector accesses where
    ``aligned_bytes`` (alignment of u, delta, B, C and y) holds a vector of the inputs and of y (y is
    read back by the second sweep), else scalar ones. ``prefetch`` is not read by this kernel (1);
    ``fold`` is False (the design sets it: cross_rows_launch.cross_forward_design).
    """
    if elem_bytes not in (2, 4) or y_bytes not in (2, 4):
        raise ValueError(f"elem_bytes, y_bytes: expected 2 or 4, got {elem_bytes}, {y_bytes}")
    vec = next((v for v in range(CROSS_MAX_VEC, 0, -1) if width % v == 0 and width // v <= WARP_LANES), None)
    if vec is None or width < 1:
        return None
    vector = vec > 1 and aligned_bytes % (vec * elem_bytes) == 0 and aligned_bytes % (vec * y_bytes) == 0
    return CrossPlan(**layout(width, vec, vec if vector else 1).__dict__)


# The rule that decides whether the four-route kernel folds the step-size projection (CrossRowsForward's
# kFold) or the projection runs first as a batched matmul (vmamba2d.ops.delta_proj.project_delta)
# whose full-rank output the unfolded kernel reads; docs/kernels.md, "Folded step sizes".
#
# Static SASS per cell·channel of the four-route op on sm_90 (nvcc 13.0, dev/gpu/v4_static_report.py,
# benchmarks/scan_cuda_v4_static.md; compiler figures, no GPU ran) per (input type, W):
# (unfolded, folded at R = 1, folded per two more ranks). The folded kernel at rank R takes
# at_one + per_two * (R // 2): its longest path counts the odd plane's block at every R (an upper
# bound by about half of per_two for even R).
CROSS_FOLD_SASS = {
    ("fp32", 56): (193.7, 235.4, 42.3), ("fp32", 28): (175.4, 226.3, 42.3), ("fp32", 14): (166.3, 217.1, 42.3),
    ("fp32", 7): (243.4, 326.9, 70.8),
    ("bf16", 56): (221.4, 263.4, 55.5), ("bf16", 28): (204.3, 255.1, 55.5), ("bf16", 14): (195.1, 245.4, 55.5),
    ("bf16", 7): (269.1, 338.9, 77.7),
    ("fp16", 56): (214.3, 259.4, 50.6), ("fp16", 28): (198.3, 250.0, 50.6), ("fp16", 14): (189.4, 241.1, 50.3),
    ("fp16", 7): (269.1, 353.1, 77.8),
}
# The step-size ranks of the models' SS2D layers per map side: R = ceil(C / 16) of the stage width C
# (vmamba2d/models/ss2d.py, dt_rank "auto"): tiny / small 96 .. 768 -> 6 .. 48, base 128 .. 1024 -> 8 .. 64.
MODEL_FOLD_RANKS = {56: (6, 8), 28: (12, 16), 14: (24, 32), 7: (48, 64)}
# The machine the estimate is for (docs/kernels.md, "Folded step sizes"; an H200): 132 SMs x 4
# schedulers x 32 lanes x 1.98 GHz lane instructions per second, 4.2 TB/s measured copy bandwidth.
FOLD_ISSUE_RATE = 132 * 4 * WARP_LANES * 1.98e9
FOLD_BANDWIDTH = 4.2e12
FOLD_ROUTES = 4


def fold_extra_sass(dtype: str, width: int, rank: int) -> float:
    """Estimated SASS per cell·channel the folding four-route kernel adds to the unfolded one at rank
    ``rank`` (CROSS_FOLD_SASS; a width without figures takes the largest of its type's)."""
    rows = {w: v for (d, w), v in CROSS_FOLD_SASS.items() if d == dtype}
    if not rows:
        raise ValueError(f"dtype: expected one of fp32 / fp16 / bf16, got {dtype!r}")

    def extra(v: tuple[float, float, float]) -> float:
        plain, at_one, per_two = v
        return at_one - plain + per_two * (rank // 2)

    return extra(rows[width]) if width in rows else max(extra(v) for v in rows.values())


def fold_budget(elem_bytes: int) -> float:
    """The SASS per cell·channel folding may add and still pay, by the estimate: the instructions the
    machine issues in the time the projection pass writes its full-rank delta (4 routes x elem_bytes
    per cell·channel at FOLD_BANDWIDTH); the unfolded kernel is instruction-bound, so the delta it
    reads costs it no time and is not counted."""
    return FOLD_ISSUE_RATE / FOLD_BANDWIDTH * FOLD_ROUTES * elem_bytes


def fold_rule(dtype: str, width: int, rank: int, cells_per_sample: int) -> tuple[bool, str]:
    """Whether the four-route kernel folds the step sizes of rank ``rank`` at map width ``width`` in
    ``dtype`` ("fp32" / "fp16" / "bf16"), and why: when fold_extra_sass <= fold_budget (an estimate
    from compiler figures and the H200's balance until a GPU measures it), and the low-rank delta
    of a sample (4 * rank * H * W elements, ``cells_per_sample`` = H * W) within the kernel's 32-bit
    element offsets."""
    if rank < 1:
        raise ValueError(f"rank: expected >= 1, got {rank}")
    if FOLD_ROUTES * rank * cells_per_sample >= 2**31:
        return False, f"step sizes projected first (4 * R * H * W >= 2^31: the folding kernel's offsets are 32-bit)"
    extra = fold_extra_sass(dtype, width, rank)
    budget = fold_budget(2 if dtype in ("fp16", "bf16") else 4)
    verdict = "folded" if extra <= budget else "projected first"
    sign = "<=" if extra <= budget else ">"
    return extra <= budget, (f"step sizes {verdict} (R = {rank}: +{extra:.0f} SASS / cell·ch {sign} {budget:.0f}, "
                             f"the issue time of the projection's {FOLD_ROUTES * (2 if dtype != 'fp32' else 4)} B; "
                             "estimate, no GPU measured it)")
