"""The table of CUDA kernels that NVRTC compiles: one :class:`KernelSpec` per kernel instantiation.

Adding a kernel is one entry in :data:`KERNELS`: the ``csrc/cuda`` file to compile, the symbol to
load (a name expression for a template, resolved by NVRTC to its mangled name, or an
``extern "C"`` name) and the macros the file wants. The precompile command, the cache and the
launcher all read this table.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vmamba2d.ops import plan as scan_plan
from vmamba2d.ops.compiled.rows_plan import (CROSS_ROUTE_CODES, MODEL_FOLD_RANKS, ROWS_MIN_BLOCKS, cross_plan,
                                             fold_rule, rows_plan, tuning_candidates)

ELEMENT_TYPES = {"fp32": "float", "fp16": "__half", "bf16": "__nv_bfloat16"}
# csrc/cuda/scan2d_common.h `enum class Variant`, in its order.
VARIANTS = ("kGeneral", "kOneStateSequential", "kRoute", "kOneStateRoute")
NAMESPACE = "vmamba2d::scan2d::"


@dataclass(frozen=True)
class KernelSpec:
    """One kernel instantiation: what NVRTC compiles and which symbol the launcher loads.

    name: unique key, "<kernel>.<dtype>.<variant>" for the v3 scan.
    source: the file under csrc/cuda that the NVRTC program includes.
    symbol: a C++ name expression (``name_expression``) or the ``extern "C"`` name of the entry.
    defines: (macro, value) pairs put before the include.
    """

    name: str
    source: str
    symbol: str
    name_expression: bool = True
    defines: tuple[tuple[str, str], ...] = ()

    @property
    def file_stem(self) -> str:
        return self.name.replace(".", "_")


def _scan_kernel(role: str, dtype: str, variant: str) -> KernelSpec:
    element = ELEMENT_TYPES[dtype]
    return KernelSpec(
        name=f"{role}.{dtype}.{variant}",
        source="scan2d_kernels.cuh",
        symbol=f"{NAMESPACE}scan2d_{role}_kernel<{element}, {NAMESPACE}Variant::{variant}>",
    )


ROWS_SOURCE = "entries/scan2d_rows_entry.cu"
ROWS_SYMBOL = "vmamba2d_rows_forward"
# csrc/cuda/entries/scan2d_rows_entry.cu's VMAMBA2D_RS_DTYPE codes.
ROWS_DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}
# The (vec, load, prefetch, scan steps) plans of the model's map widths 56 / 28 / 14 / 7 with aligned
# tensors (vmamba2d/ops/compiled/rows_plan.py: rows_plan) per input type: the instances precompiled
# (2-byte types take 8 columns a lane at 56), and all of them.
_HALF_ROWS_PLANS = ((8, 8, 1, 3), (4, 4, 1, 3), (2, 2, 1, 3), (1, 1, 1, 3))
MODEL_ROWS_PLANS_BY_DTYPE = {"fp32": ((4, 4, 1, 4), (4, 4, 1, 3), (2, 2, 1, 3), (1, 1, 1, 3)),
                             "fp16": _HALF_ROWS_PLANS, "bf16": _HALF_ROWS_PLANS}
MODEL_ROWS_PLANS = tuple(dict.fromkeys(p for plans in MODEL_ROWS_PLANS_BY_DTYPE.values() for p in plans))


def rows_kernel(dtype: str, vec: int, load: int, prefetch: int, steps: int, route: int = 0) -> KernelSpec:
    """The v4 row-streaming forward (RS) entry compiled for one plan: dtype "fp32" / "fp16" / "bf16",
    the RowsPlan's vec / load / prefetch / scan_steps and the route code without its from_bottom bit."""
    defines = (("VMAMBA2D_RS_DTYPE", ROWS_DTYPE_CODES[dtype]), ("VMAMBA2D_RS_VEC", vec), ("VMAMBA2D_RS_LOAD", load),
               ("VMAMBA2D_RS_ROUTE", route), ("VMAMBA2D_RS_PREFETCH", prefetch), ("VMAMBA2D_RS_STEPS", steps))
    return KernelSpec(name=f"rows_forward.{dtype}.r{route}v{vec}l{load}p{prefetch}s{steps}", source=ROWS_SOURCE,
                      symbol=ROWS_SYMBOL, name_expression=False,
                      defines=tuple((name, str(value)) for name, value in defines))


ROWS_CROSS_SYMBOL = "vmamba2d_rows_cross_forward"


def rows_cross_kernel(dtype: str, vec: int, load: int, steps: int, fold: bool = False,
                      min_blocks: int = ROWS_MIN_BLOCKS, prefetch: int = 1) -> KernelSpec:
    """The v4 four-route forward (CrossRowsForward: VMamba's cross routes in one launch) compiled for
    one plan: dtype "fp32" / "fp16" / "bf16", the CrossPlan's vec / load / scan_steps / min_blocks (the
    RS entry file with VMAMBA2D_RS_CROSS=1; its route macro is not read); ``fold``: the
    instance that projects the low-rank step sizes itself (VMAMBA2D_RS_FOLD=1, name suffix "f");
    ``min_blocks``: the blocks per SM its launch bounds are compiled for (VMAMBA2D_RS_MIN_BLOCKS and
    name suffix "b<n>" where it is not the entry's default ROWS_MIN_BLOCKS); ``prefetch``: the rows of u
    and delta held ahead (VMAMBA2D_RS_PREFETCH and "p<P>" after the load in the name where it is not 1)."""
    defines = (("VMAMBA2D_RS_CROSS", 1), ("VMAMBA2D_RS_DTYPE", ROWS_DTYPE_CODES[dtype]), ("VMAMBA2D_RS_VEC", vec),
               ("VMAMBA2D_RS_LOAD", load), ("VMAMBA2D_RS_STEPS", steps)) + ((("VMAMBA2D_RS_FOLD", 1),) if fold else ())
    depth = ""
    if prefetch != 1:
        defines += (("VMAMBA2D_RS_PREFETCH", prefetch),)
        depth = f"p{prefetch}"
    blocks = ""
    if min_blocks != ROWS_MIN_BLOCKS:
        defines += (("VMAMBA2D_RS_MIN_BLOCKS", min_blocks),)
        blocks = f"b{min_blocks}"
    return KernelSpec(name=f"rows_cross_forward.{dtype}.v{vec}l{load}{depth}s{steps}{blocks}{'f' if fold else ''}",
                      source=ROWS_SOURCE, symbol=ROWS_CROSS_SYMBOL, name_expression=False,
                      defines=tuple((name, str(value)) for name, value in defines))


PLANES_SOURCE = "entries/scan2d_planes_entry.cu"
PLANES_SYMBOL = "vmamba2d_planes_forward"


def planes_kernel(dtype: str, height: int, width: int, route: int = 0, copy_bytes: int = 16) -> KernelSpec:
    """The v4 one-plane-per-lane forward (PL) entry compiled for one plane shape (H * W <= 64), route code
    (0-15) and copy width (16, 8 or 4 bytes) in dtype "fp32" / "fp16" / "bf16"."""
    defines = (("VMAMBA2D_PL_DTYPE", ROWS_DTYPE_CODES[dtype]), ("VMAMBA2D_PL_HEIGHT", height),
               ("VMAMBA2D_PL_WIDTH", width), ("VMAMBA2D_PL_ROUTE", route), ("VMAMBA2D_PL_COPY", copy_bytes))
    return KernelSpec(name=f"planes_forward.{dtype}.h{height}w{width}r{route}c{copy_bytes}", source=PLANES_SOURCE,
                      symbol=PLANES_SYMBOL, name_expression=False,
                      defines=tuple((name, str(value)) for name, value in defines))


# The model's square maps (vmamba2d_tiny's four stages at 224 x 224: 56, 28, 14, 7 cells a side).
MODEL_MAP_SIDES = (56, 28, 14, 7)
_ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# The alignment of the model's contiguous tensors (fresh allocations: at least 16 bytes).
_MODEL_ALIGNMENT = 16
OP_ROUTE = 0  # the single-route op's route code (rows_launch.OP_ROUTE)


def _model_designs(dtype: str, routes: tuple[int, ...]) -> list[tuple[int, str]]:
    """(side, design) of each model map for the CUDA path's rule (vmamba2d.ops.plan) in dtype."""
    path = "cuda single-route" if len(routes) == 1 else "cuda four-route"
    element = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    designs = []
    for side in MODEL_MAP_SIDES:
        call = scan_plan.ScanCall(1, side, side, element, routes)
        built = scan_plan.BUILT[path]
        designs.append((side, next(name for name, _ in scan_plan.preferred(call, "cuda") if name in built)))
    return designs


def model_rows_kernels() -> list[KernelSpec]:
    """The RS instances the single-route op launches for the model's map widths (rows_plan.rows_plan,
    aligned tensors) at every prefetch depth the tuner may pick for them (rows_plan.tuning_candidates:
    P = 2 where V <= 2), in fp32 / fp16 / bf16."""
    specs = []
    for dtype in ELEMENT_TYPES:
        for side in MODEL_MAP_SIDES:
            plan = rows_plan(_ELEMENT_BYTES[dtype], _ELEMENT_BYTES[dtype], side, OP_ROUTE, _MODEL_ALIGNMENT)
            for prefetch in dict.fromkeys(knobs["prefetch"] for knobs in tuning_candidates(plan)):
                specs.append(rows_kernel(dtype, plan.vec, plan.load, prefetch, plan.scan_steps))
    return list({spec.name: spec for spec in specs}.values())


def model_planes_kernels() -> list[KernelSpec]:
    """The PL instances the single-route op launches for the model's maps (route 0, contiguous tensors:
    16-byte copies), in fp32 / fp16 / bf16."""
    return [planes_kernel(dtype, side, side, OP_ROUTE, _MODEL_ALIGNMENT)
            for dtype in ELEMENT_TYPES for side, design in _model_designs(dtype, (OP_ROUTE,)) if design == "pl"]


def model_cross_kernels() -> list[KernelSpec]:
    """The four-route RS instances the four-route op launches for the model's maps (rows_plan.cross_plan
    of each side the rule gives RS, aligned tensors), in fp32 / fp16 / bf16, and the folding instances
    where rows_plan.fold_rule folds the step sizes of a model rank at that side (MODEL_FOLD_RANKS; by
    today's compiler figures none does: docs/kernels.md, "Folded step sizes")."""
    specs = []
    for dtype in ELEMENT_TYPES:
        for side, design in _model_designs(dtype, CROSS_ROUTE_CODES):
            plan = cross_plan(_ELEMENT_BYTES[dtype], _ELEMENT_BYTES[dtype], side, _MODEL_ALIGNMENT)
            if design == "rs" and plan is not None:
                specs.append(rows_cross_kernel(dtype, plan.vec, plan.load, plan.scan_steps, min_blocks=plan.min_blocks,
                                               prefetch=plan.prefetch))
                if any(fold_rule(dtype, side, rank, side * side)[0] for rank in MODEL_FOLD_RANKS[side]):
                    fold = plan.folding(_ELEMENT_BYTES[dtype])
                    specs.append(rows_cross_kernel(dtype, fold.vec, fold.load, fold.scan_steps, fold=True,
                                                   min_blocks=fold.min_blocks))
    return list({spec.name: spec for spec in specs}.values())


KERNELS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in [
        *(_scan_kernel(role, dtype, variant)
          for role in ("forward", "backward") for dtype in ELEMENT_TYPES for variant in VARIANTS),
        KernelSpec(name="carry_scan", source="scan2d_kernels.cuh", symbol=f"{NAMESPACE}scan2d_carry_scan_kernel",
                   defines=(("SS2D_DEFINE_CARRY_SCAN_KERNEL", ""),)),
        *model_rows_kernels(),
        *model_cross_kernels(),
        *model_planes_kernels(),
    ]
}


def kernel_spec(name: str) -> KernelSpec:
    """The table entry ``name``; raises KeyError naming the known kernels."""
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"kernel must be one of {sorted(KERNELS)}, got {name!r}") from None


def scan_kernel_name(role: str, dtype: str, variant: str) -> str:
    """The table key of a v3 scan kernel: role "forward" / "backward", dtype "fp32" / "fp16" / "bf16",
    variant one of VARIANTS."""
    return f"{role}.{dtype}.{variant}"
