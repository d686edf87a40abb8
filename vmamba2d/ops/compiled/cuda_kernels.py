"""The table of CUDA kernels that NVRTC compiles: one :class:`KernelSpec` per kernel instantiation.

Adding a kernel is one entry in :data:`KERNELS`: the ``csrc/cuda`` file to compile, the symbol to
load (a name expression for a template, resolved by NVRTC to its mangled name, or an
``extern "C"`` name) and the macros the file wants. The precompile command, the cache and the
launcher all read this table.
"""
from __future__ import annotations

from dataclasses import dataclass

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


KERNELS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in [
        *(_scan_kernel(role, dtype, variant)
          for role in ("forward", "backward") for dtype in ELEMENT_TYPES for variant in VARIANTS),
        KernelSpec(name="carry_scan", source="scan2d_kernels.cuh", symbol=f"{NAMESPACE}scan2d_carry_scan_kernel",
                   defines=(("SS2D_DEFINE_CARRY_SCAN_KERNEL", ""),)),
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
