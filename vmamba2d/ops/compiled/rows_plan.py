"""Plan of the v4 row-streaming forward (RS, csrc/cuda/scan2d_rows.cuh) and its tuning candidates
(the rule that picks RS for a call: vmamba2d/ops/plan.py).

RS runs the N = 1 scan with one warp per M maps, each map a segment of S lanes, each lane owning V
consecutive columns of every row (docs/kernels.md, "v4"). The plan fixes what the kernel compiles in
(the entry file's macros, :meth:`RowsPlan.defines`) and the lane layout the launch passes
(``seg_lanes``, ``maps_per_warp`` of RowsParams in csrc/cuda/scan2d_rows_common.h).
"""
from __future__ import annotations

import dataclasses
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
    """A plan of the four-route kernel: a RowsPlan, ``fold``, whether the instance projects the
    low-rank step sizes itself (CrossRowsForward's kFold; fold_rule), and ``min_blocks``, the blocks
    of ROWS_THREADS threads per SM the entry is compiled for (its launch bounds,
    VMAMBA2D_RS_MIN_BLOCKS): registers a thread at most :attr:`registers`. ``prefetch``: the rows of u
    and both routes' delta the kernel holds ahead (CrossRowsForward's kPrefetch, VMAMBA2D_RS_PREFETCH);
    a folding plan holds 1 (:meth:`folding`)."""

    fold: bool = False
    min_blocks: int = 8

    @property
    def registers(self) -> int:
        """The register cap the launch bounds give the entry (register_cap(min_blocks))."""
        return register_cap(self.min_blocks)

    @property
    def resident_warps(self) -> int:
        """Warps per SM at that cap (blocks of ROWS_THREADS threads, no shared memory; sm_80 / sm_90:
        64K registers, 64 warps): what the launch can keep resident, by the plan's register figure."""
        return resident_warps(self.registers)

    def folding(self, elem_bytes: int) -> "CrossPlan":
        """The plan of the folding instance at this plan's V for inputs of ``elem_bytes``: one row ahead
        (the kernel's kFold takes P = 1), compiled for cross_min_blocks at P = 1."""
        return dataclasses.replace(self, fold=True, prefetch=1, min_blocks=cross_min_blocks(elem_bytes, self.vec, 1))

    def min_blocks_define(self) -> dict[str, int]:
        """VMAMBA2D_RS_MIN_BLOCKS where it is not the entry's default (ROWS_MIN_BLOCKS, whose sm_75
        fp16 exception the entry keeps: scan2d_rows_entry.cu), else nothing."""
        return {} if self.min_blocks == ROWS_MIN_BLOCKS else {"VMAMBA2D_RS_MIN_BLOCKS": self.min_blocks}


CROSS_ROUTE_CODES = (0, 4, 3, 7)  # vmamba2d.ops.CROSS_ROUTES' codes: the four-route kernel's routes, in order
ROWS_MIN_BLOCKS = 8  # the RS entries' default blocks per SM (kRowsMinBlocks): 64 registers
SM_REGISTERS = 65536
SM_WARPS = 64
# Blocks per SM of the four-route entry at 4 columns a lane, by element size: two routes' state per
# column does not fit 64 registers (it spills 168 / 588 B bf16 / fp32 on sm_90), and fits these caps
# without spills on sm_90 / sm_80 / sm_75 (nvcc 13.0, dev/gpu/v4_static_report.py): 6 blocks -> 80
# registers for 2-byte types; fp32 needs 5 -> 96 (at 6 it spills 24 B at W = 56).
CROSS_WIDE_MIN_BLOCKS = {2: 6, 4: 5}
# Blocks per SM of the four-route entry holding u and delta P = 2 rows ahead, by (element size, V): the
# second row's 6 registers (bf16 V = 4: u 2, both routes' delta 4; fp32 V = 2 alike) spill at the P = 1
# caps on sm_90 (nvcc 13.0: bf16 V = 4 at 6 blocks / 80 registers 84 + 84 B with a 32 B stack; fp32 V = 2
# at 8 / 64 64 + 112 B) and fit these without spills: 5 -> 96 registers, 7 -> 72.
# At W = 14 (V = 2, seven lanes a map) the second row spills at 64 registers as well (bf16 16 B, fp16 16 B,
# fp32 176 B of spills on sm_90); 2-byte inputs fit 7 -> 72 on sm_90 / sm_80 / sm_75 but fp16 spills there on
# sm_86 / sm_89 (nvcc 24 B, NVRTC 12 + 12 B, 8 B stack), so they take 6 -> 80 (no spills on sm_90 / 86 / 80 /
# 75: bf16 78-80 registers, fp16 72-80). At one column a lane (W = 7) it fits 64 registers (8 blocks) in
# every input type on sm_90 / sm_80 / sm_75. Other widths at those V fit 7 blocks on sm_90 (spot checks:
# bf16 62 and fp16 10 at V = 2: 72 registers, 16 B of spills at 64; bf16 / fp32 31 at V = 1: 64 registers).
CROSS_DEEP_MIN_BLOCKS = {(2, 4): 5, (4, 2): 7, (2, 2): 6, (2, 1): 8, (4, 1): 8}
CROSS_DEEP_PREFETCH = 2  # the deeper ring the four-route rule weighs against one row ahead


def cross_min_blocks(elem_bytes: int, vec: int, prefetch: int = 1) -> int:
    """Blocks per SM the four-route entry is compiled for at ``vec`` columns a lane and ``prefetch`` rows
    ahead: CROSS_DEEP_MIN_BLOCKS at P = 2, CROSS_WIDE_MIN_BLOCKS at V = 4 and P = 1, else ROWS_MIN_BLOCKS
    (64 registers). Other deeper rings have no figures (ValueError)."""
    if prefetch == 1:
        return CROSS_WIDE_MIN_BLOCKS[elem_bytes] if vec == 4 else ROWS_MIN_BLOCKS
    if prefetch == CROSS_DEEP_PREFETCH and (elem_bytes, vec) in CROSS_DEEP_MIN_BLOCKS:
        return CROSS_DEEP_MIN_BLOCKS[(elem_bytes, vec)]
    raise ValueError(f"prefetch: no blocks per SM measured for P = {prefetch} at V = {vec}, {elem_bytes}-byte inputs")


def cross_instances(elem_bytes: int, width: int = 56) -> tuple[tuple[int, int], ...]:
    """The (V, P) instances of the four-route kernel whose sm_90 figures the rule weighs at ``width``
    (CROSS_VEC_FIGURES, the static report's comparison): where 4 divides W, V = 2 and 4 one row ahead and
    the deeper ring at the V the rule takes (4 for 2-byte inputs, 2 for fp32); elsewhere the V that
    divides W (cross_vec) one and two rows ahead."""
    if width % 4 == 0:
        return ((2, 1), (4, 1), (cross_max_vec(elem_bytes) if elem_bytes == 2 else 2, CROSS_DEEP_PREFETCH))
    vec = cross_vec(elem_bytes, width)
    return ((vec, 1), (vec, CROSS_DEEP_PREFETCH))


def register_cap(min_blocks: int) -> int:
    """Registers per thread ptxas allows under __launch_bounds__(ROWS_THREADS, min_blocks): the SM's
    register file over min_blocks blocks, in the allocation unit of 8 (64 for 8 blocks, 72 for 7,
    80 for 6, 96 for 5), at most 255."""
    return min(SM_REGISTERS // (ROWS_THREADS * min_blocks) // 8 * 8, 255)


def resident_warps(registers: int) -> int:
    """Warps per SM of ROWS_THREADS-thread blocks without shared memory at ``registers`` per thread
    (allocated 256 a warp; 64K registers, at most 64 warps: sm_80 / sm_90)."""
    per_warp = -(-max(registers, 1) * WARP_LANES // 256) * 256
    return min(SM_REGISTERS // per_warp // (ROWS_THREADS // WARP_LANES) * (ROWS_THREADS // WARP_LANES), SM_WARPS)


def cross_max_vec(elem_bytes: int) -> int:
    """The most columns a lane the four-route kernel takes for inputs of ``elem_bytes`` (cross_plan):
    4 for 2-byte types, 2 for fp32."""
    return 4 if elem_bytes == 2 else 2


def cross_max_width(elem_bytes: int) -> int:
    """The widest map the four-route kernel takes: 32 lanes of cross_max_vec columns (128 fp16 / bf16,
    64 fp32)."""
    return WARP_LANES * cross_max_vec(elem_bytes)


def cross_vec(elem_bytes: int, width: int) -> Optional[int]:
    """Columns a lane of the four-route kernel at ``width`` (cross_plan): the widest of
    cross_max_vec(elem_bytes), 2, 1 dividing W within 32 lanes, or None."""
    if width < 1:
        return None
    return next((v for v in (4, 2, 1) if v <= cross_max_vec(elem_bytes) and width % v == 0
                 and width // v <= WARP_LANES), None)


def cross_plan(elem_bytes: int, y_bytes: int, width: int, aligned_bytes: int = 16) -> Optional[CrossPlan]:
    """The plan of the four-route RS kernel (CrossRowsForward, VMamba's cross routes in one launch),
    or None where it does not apply.

    V: the widest of cross_max_vec(elem_bytes) (4 fp16 / bf16, 2 fp32), 2, 1 that divides W with
    W / V <= 32 lanes (the kernel needs V | W: no ragged lane); None where none does (odd W > 32, and
    W > 64 fp32 / 128 fp16, bf16). The entry is compiled for cross_min_blocks(elem_bytes, V, P): one row
    ahead ROWS_MIN_BLOCKS (64 registers) at V <= 2 and CROSS_WIDE_MIN_BLOCKS at V = 4 (80 registers 2-byte,
    96 fp32); two rows ahead CROSS_DEEP_MIN_BLOCKS (2-byte: 96 registers at V = 4, 80 at V = 2, 64 at
    V = 1; fp32 at V = 1: 64).

    Why 4 columns for 2-byte inputs and 2 for fp32 (an estimate from compiler figures, not a GPU
    measurement; cross_estimate, CROSS_VEC_FIGURES): the kernel reaches at most the smaller of

    * the issue ceiling ``issue / (bandwidth * SASS)`` x bytes, the share of copy bandwidth its
      instructions allow: per cell·channel of the op it moves u twice, four routes' delta and y
      written twice and read once (6 e + 3 e_y bytes: 18 B bf16, 36 B fp32) and issues SASS
      instructions, at FOLD_ISSUE_RATE = 33.4 T lane instructions/s against FOLD_BANDWIDTH = 4.2 TB/s
      (8.0 instructions a byte); and
    * the in-flight ceiling: the bytes the resident warps have outstanding -- P rows of u and both
      routes' delta a warp, warps x P x 3 x M x W x e -- over the ~23.9 KB Little's law asks of an SM
      (LITTLE_BYTES: 4.2 TB/s x 0.75 us / 132 SMs).

    The worked figures below are those of 0c5e707, before the bottom-up sweep's y read-back joined the
    ring (CROSS_VEC_FIGURES holds today's; every choice below is unchanged by them). The second H200
    run measured the kernel at 11% (bf16) / 21% (fp32) of copy bandwidth at 56 x 56 where this estimate
    says 83% / 90%: it ranks the choices, it does not predict the speed.

    sm_90 at W = 56 (28 similar): bf16 V = 2: 221.4 SASS -> 18 x 8.0 / 221.4 = 65% issue, 32 warps x
    3 x 56 x 2 B = 10.5 KiB -> 45% in flight: 45%; V = 4: 165.7 SASS -> 87%, 24 warps x 3 x 112 x 2 B
    = 15.8 KiB -> 68%: 68%. fp32 V = 2: 193.7 -> 148% issue (capped at 100), 32 x 3 x 56 x 4 B =
    21 KiB -> 90%; V = 4: 136.6 -> 100%, 20 warps x 3 x 112 x 4 B = 26 KiB -> 100%: an estimated gain
    of ~10% that rests on the in-flight figure alone (a row of loads a warp, the latency a guess),
    at 96 registers and 20 warps -- below the margin (CROSS_WIDE_MARGIN) this rule asks before it
    trades occupancy, so fp32 keeps 2 columns (bf16 / fp16 gain ~50%). A GPU run of both (dev/gpu/
    bench_v4.py times the bf16 pair) decides.

    P, the rows of u and both routes' delta held ahead (B stays one row ahead: one plane per route
    shared by every channel of the group, cache hits rather than DRAM bytes): CROSS_DEEP_PREFETCH = 2
    where the same estimate gains CROSS_WIDE_MARGIN over P = 1 at the rule's V, with the entry compiled
    for CROSS_DEEP_MIN_BLOCKS (the second row does not fit the P = 1 caps without spills), else 1.
    sm_90 at W = 56 (28 alike): bf16 V = 4, P = 1 (above): min(87%, 68%) = 68%; P = 2 at 5 blocks:
    169.0 SASS, 96 registers -> 20 warps: 18 x 8.0 / 169.0 = 85% issue, 20 x 2 x 3 x 112 x 2 B =
    26.2 KiB -> 100% (113%) in flight: 85%, x 1.25 -> P = 2 (fp16: 162.8 SASS, 96 registers: 88%, x 1.30;
    at 28 bf16 87%, fp16 91%). fp32 V = 2, P = 2 at 7 blocks: 209.4 SASS, 72 registers -> 28 warps:
    137% issue, 28 x 2 x 3 x 56 x 4 B = 36.8 KiB -> 100% in flight: 100% against 90%, x 1.11, under the
    margin -> P = 1 (the same verdict as V = 4 for fp32). The deeper ring costs instructions (the
    unrolled row pair, the refill offsets: +3.3 SASS bf16 / +5.8 fp16 / +15.7 fp32 per cell·channel at 56)
    and warps, and gains only where the bytes in flight, not issue, bound the estimate.

    The narrow maps (sm_90, the same estimate and margin; cross_deep_rule takes a (size, V) where every
    figure of it pays): W = 14, bf16 V = 2 (7 lanes a map, M = 4), P = 1 at 8 blocks: 195.1 SASS -> 73%
    issue, 32 warps x 3 x 4 x 14 x 2 B = 10.5 KiB -> 45% in flight: 45%; P = 2 spills at 64 registers
    (16 B) and is compiled for 6 blocks (CROSS_DEEP_MIN_BLOCKS): 213.7 SASS, 78 registers -> 24 warps: 67%
    issue, 24 x 2 x 3 x 4 x 14 x 2 B = 15.8 KiB -> 68%: 67%, x 1.49 -> P = 2 (fp16 189.4 -> 196.1 at 80
    registers: 45% -> 68%, x 1.50; at 7 blocks, where sm_86 / 89 spill fp16, bf16 211.4 / fp16 201.0 at 72
    registers, 28 warps: 68% / 71%). W = 7, bf16 V = 1
    (M = 4), P = 1: 264.6 SASS -> 54%, 5.2 KiB -> 23%: 23%; P = 2 fits 64 registers (8 blocks, 32 warps):
    298.3 SASS -> 48%, 10.5 KiB -> 45%: 45%, x 2.0 -> P = 2 (fp16 265.1 -> 292.0: 23% -> 45%). fp32 V = 2
    at 14: 166.3 / 191.1 SASS (64 / 72 registers): 100% issue both, 21.0 KiB -> 90% against 36.8 KiB ->
    100%: x 1.11 -> P = 1, as at 56 / 28; fp32 V = 1 at 7: 243.4 SASS, 61 registers -> 100% issue, 10.5 KiB
    -> 45%; P = 2 at 64 registers: 272.3 -> 100%, 21.0 KiB -> 90%: x 2.0 -> P = 2. Three rows ahead (no
    entry in CROSS_VEC_FIGURES: below the margin over two, so not taken): bf16 14 at 7 blocks 219.8 SASS,
    72 registers -> 65% issue (in flight 100%) against P = 2's 68%; bf16 7 at 8 blocks 301.0 -> 48% (68%
    in flight) against 45%, x 1.06; fp16 14 215.8 -> 66%, fp16 7 301.1 -> 48%; fp32 7 284.6 -> 100% / 100%
    against 90%, x 1.11.

    Vector accesses where ``aligned_bytes`` (alignment of u, delta, B, C and y) holds a vector of the
    inputs and of y (y is read back by the second sweep), else scalar ones. ``fold`` is False (the
    design sets it with CrossPlan.folding: cross_rows_launch.cross_forward_design).
    """
    if elem_bytes not in (2, 4) or y_bytes not in (2, 4):
        raise ValueError(f"elem_bytes, y_bytes: expected 2 or 4, got {elem_bytes}, {y_bytes}")
    vec = cross_vec(elem_bytes, width)
    if vec is None:
        return None
    vector = vec > 1 and aligned_bytes % (vec * elem_bytes) == 0 and aligned_bytes % (vec * y_bytes) == 0
    prefetch = CROSS_DEEP_PREFETCH if cross_deep_rule(elem_bytes, vec) else 1
    fields = {**layout(width, vec, vec if vector else 1).__dict__, "prefetch": prefetch}
    return CrossPlan(**fields, min_blocks=cross_min_blocks(elem_bytes, vec, prefetch))


# The estimate behind cross_plan's choice of V and P: sm_90 figures of the four-route kernel (nvcc 13.0,
# dev/gpu/v4_static_report.py's pinned (V, P) table in benchmarks/scan_cuda_v4_static.md, which CI holds
# them to; compiler figures, no GPU ran) per (input type, W, V, P) of cross_instances, each compiled for
# cross_min_blocks: (SASS per cell·channel of the op, registers).
CROSS_VEC_FIGURES = {
    ("fp32", 56, 2, 1): (187.4, 64), ("fp32", 56, 4, 1): (136.9, 96), ("fp32", 56, 2, 2): (213.3, 72),
    ("fp32", 28, 2, 1): (192.0, 64), ("fp32", 28, 4, 1): (132.3, 96), ("fp32", 28, 2, 2): (204.3, 72),
    ("bf16", 56, 2, 1): (215.7, 64), ("bf16", 56, 4, 1): (164.4, 80), ("bf16", 56, 4, 2): (172.0, 96),
    ("bf16", 28, 2, 1): (206.6, 64), ("bf16", 28, 4, 1): (159.9, 80), ("bf16", 28, 4, 2): (167.4, 96),
    ("fp16", 56, 2, 1): (209.1, 64), ("fp16", 56, 4, 1): (156.9, 80), ("fp16", 56, 4, 2): (165.7, 96),
    ("fp16", 28, 2, 1): (200.0, 64), ("fp16", 28, 4, 1): (152.3, 80), ("fp16", 28, 4, 2): (161.2, 96),
    ("fp32", 14, 2, 1): (182.9, 64), ("fp32", 14, 2, 2): (195.7, 72),
    ("fp32", 7, 1, 1): (248.0, 63), ("fp32", 7, 1, 2): (283.4, 64),
    ("bf16", 14, 2, 1): (197.4, 64), ("bf16", 14, 2, 2): (213.3, 79),
    ("bf16", 7, 1, 1): (266.3, 64), ("bf16", 7, 1, 2): (312.9, 64),
    ("fp16", 14, 2, 1): (191.1, 64), ("fp16", 14, 2, 2): (198.3, 80),
    ("fp16", 7, 1, 1): (264.0, 64), ("fp16", 7, 1, 2): (312.9, 64),
}
LITTLE_BYTES = 4.2e12 * 0.75e-6 / 132  # bytes in flight an H200 SM needs at the copy bandwidth (issue 39)
CROSS_WIDE_MARGIN = 1.2  # the estimated gain 4 columns must show to take them (fewer warps, an estimate)


def cross_estimate(dtype: str, width: int, vec: int, prefetch: int = 1) -> tuple[float, float]:
    """(issue ceiling, in-flight ceiling) of the four-route kernel at ``vec`` columns a lane and
    ``prefetch`` rows ahead, as shares of copy bandwidth (each at most 1; cross_plan's docstring): from
    CROSS_VEC_FIGURES' SASS and registers for (dtype "fp32" / "fp16" / "bf16", width, vec, prefetch)."""
    key = (dtype, width, vec, prefetch)
    if key not in CROSS_VEC_FIGURES:
        raise ValueError(f"dtype, width, vec, prefetch: no figures for {key}; have {sorted(CROSS_VEC_FIGURES)}")
    sass, registers = CROSS_VEC_FIGURES[key]
    e = 4 if dtype == "fp32" else 2
    issue = FOLD_ISSUE_RATE / FOLD_BANDWIDTH * (6 * e + 3 * e) / sass
    seg = width // vec
    in_flight = resident_warps(registers) * prefetch * 3 * (WARP_LANES // seg) * width * e / LITTLE_BYTES
    return min(issue, 1.0), min(in_flight, 1.0)


def cross_wide_pays(dtype: str, width: int) -> bool:
    """Whether the estimate (cross_estimate) takes 4 columns a lane over 2 at ``width``: the smaller
    ceiling at V = 4 beats V = 2's by CROSS_WIDE_MARGIN."""
    return min(cross_estimate(dtype, width, 4)) >= CROSS_WIDE_MARGIN * min(cross_estimate(dtype, width, 2))


def cross_deep_pays(dtype: str, width: int, vec: int) -> bool:
    """Whether the estimate takes CROSS_DEEP_PREFETCH rows ahead over one at ``vec`` columns a lane: the
    smaller ceiling at P = 2 (fewer warps: the entry compiled for CROSS_DEEP_MIN_BLOCKS) beats P = 1's
    by CROSS_WIDE_MARGIN (the same margin as V's: the gain rests on the in-flight figure, a guessed
    latency, while warps are given up)."""
    deep = cross_estimate(dtype, width, vec, CROSS_DEEP_PREFETCH)
    return min(deep) >= CROSS_WIDE_MARGIN * min(cross_estimate(dtype, width, vec, 1))


def cross_deep_rule(elem_bytes: int, vec: int) -> bool:
    """Whether the four-route plan holds CROSS_DEEP_PREFETCH rows ahead at ``vec`` columns a lane for inputs
    of ``elem_bytes``: CROSS_VEC_FIGURES has that ring for some (input type of that size, W) and
    cross_deep_pays at every one of them (the verdict then holds at every W taking that V, as V's does)."""
    dtypes = ("fp16", "bf16") if elem_bytes == 2 else ("fp32",)
    widths = [(d, w) for d, w, v, p in CROSS_VEC_FIGURES if d in dtypes and v == vec and p == CROSS_DEEP_PREFETCH]
    return bool(widths) and all(cross_deep_pays(d, w, vec) for d, w in widths)


def describe_cross() -> str:
    """The four-route kernel's lane rule, for backend_info()["scan_plan"]."""
    def plans(elem_bytes: int, vecs: tuple[int, ...]) -> str:
        out = []
        for vec in vecs:
            prefetch = CROSS_DEEP_PREFETCH if cross_deep_rule(elem_bytes, vec) else 1
            blocks = cross_min_blocks(elem_bytes, vec, prefetch)
            out.append(f"{vec}: P = {prefetch} ({blocks} blocks / SM, {register_cap(blocks)} registers)")
        return ", ".join(out)

    return ("columns a lane V: fp16 / bf16 4 where 4 divides W (W <= 128), else 2, 1; fp32 2, else 1 (W <= 64): "
            "the widest V dividing W within 32 lanes; rows of u and delta held ahead P by the in-flight "
            f"estimate -- fp16 / bf16 V = {plans(2, (4, 2, 1))}; fp32 V = {plans(4, (2, 1))} "
            "(rows_plan.cross_plan; an estimate from compiler figures, no GPU measured it)")


# The rule that decides whether the four-route kernel folds the step-size projection (CrossRowsForward's
# kFold) or the projection runs first as a batched matmul (vmamba2d.ops.delta_proj.project_delta)
# whose full-rank output the unfolded kernel reads; docs/kernels.md, "Folded step sizes".
#
# Static SASS per cell·channel of the four-route op on sm_90 (nvcc 13.0, dev/gpu/v4_static_report.py,
# benchmarks/scan_cuda_v4_static.md; compiler figures, no GPU ran) per (input type, W), at the V of
# cross_plan (4 for fp16 / bf16 at 56 and 28): (unfolded one row ahead -- the folding instance's depth;
# the unfolded kernel also holds the bottom-up sweep's y read-back in its ring, the folding one reads it in
# the row, so the difference is the projection's cost less that ring's --, folded at R = 1, folded per two
# more ranks). The folded kernel at rank R takes
# at_one + per_two * (R // 2): its longest path counts the odd plane's block at every R (an upper
# bound by about half of per_two for even R).
CROSS_FOLD_SASS = {
    ("fp32", 56): (187.4, 235.4, 42.3), ("fp32", 28): (192.0, 226.3, 42.3), ("fp32", 14): (182.9, 217.1, 42.3),
    ("fp32", 7): (248.0, 326.9, 70.8),
    ("bf16", 56): (165.7, 199.1, 36.5), ("bf16", 28): (161.1, 194.6, 36.4), ("bf16", 14): (195.1, 245.4, 55.5),
    ("bf16", 7): (269.1, 338.9, 77.7),
    ("fp16", 56): (157.0, 193.9, 35.4), ("fp16", 28): (152.4, 189.3, 35.4), ("fp16", 14): (189.4, 241.1, 50.3),
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
    reads costs it no time and is not counted (by issue; cross_estimate puts the 4-column fp16 / bf16
    kernel at its in-flight ceiling first, where the delta read would count too: this is the
    conservative budget until a GPU measures)."""
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
        return False, "step sizes projected first (4 * R * H * W >= 2^31: the folding kernel's offsets are 32-bit)"
    extra = fold_extra_sass(dtype, width, rank)
    budget = fold_budget(2 if dtype in ("fp16", "bf16") else 4)
    verdict = "folded" if extra <= budget else "projected first"
    sign = "<=" if extra <= budget else ">"
    return extra <= budget, (f"step sizes {verdict} (R = {rank}: +{extra:.0f} SASS / cell·ch {sign} {budget:.0f}, "
                             f"the issue time of the projection's {FOLD_ROUTES * (2 if dtype != 'fp32' else 4)} B; "
                             "estimate, no GPU measured it)")
