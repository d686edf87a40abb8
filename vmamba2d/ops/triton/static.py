"""Static figures of the Triton scan kernels, compiled for an NVIDIA architecture without a GPU.

Triton's front end, LLVM and the ptxas bundled with triton compile a kernel for a target such as
``GPUTarget("cuda", 90, 32)`` with no device present. From the result this module reads:

* registers per thread and stack frame: ``cuobjdump --dump-resource-usage`` on the cubin (REG,
  STACK); spill stores: ptxas's own report (``-v``, which Triton runs; its log is captured);
  shared memory: Triton's metadata;
* resident warps per SM: the occupancy rule of the architecture (registers allocated per warp in
  units of 256, 64 K registers, 64 warps, 32 blocks and 164 KB (sm_80) / 228 KB (sm_90) of shared
  memory per SM, 1 KB reserved per block);
* exps per cell and state: ``math.exp`` operations in the kernel's TTIR whose operand has the
  shape of the kernel's (channel, state, cell) register block, divided by the number of routes;
  exps on (channel, cell) blocks (softplus / sigmoid: per cell and channel) are not counted.

The launch is mimicked as Triton's launcher specialises it: pointers 16-byte aligned, integer
arguments divisible by 16 marked so and integers equal to 1 compiled as constants. These are
static figures: no kernel is run and no time is measured.

``python -m vmamba2d.ops.triton.static`` prints the table of :data:`REPORT_SHAPES`.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch

from . import launch
from .ops import SINGLE_ROUTE

# Per-SM limits used by the occupancy rule.
ARCH_LIMITS = {
    80: dict(registers=65536, shared=164 * 1024, warps=64, blocks=32),
    90: dict(registers=65536, shared=228 * 1024, warps=64, blocks=32),
}
_TRITON_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
# Pointer arguments of the scan's data dtype (the rest are fp32 parameters, scratch and partials).
_DATA_POINTERS = {"u_ptr", "delta_ptr", "B_ptr", "C_ptr", "dy_ptr", "du_ptr", "ddelta_ptr"}


@dataclass(frozen=True)
class KernelFigures:
    """What a kernel compiles to on one architecture."""

    kernel: str
    arch: int
    num_warps: int
    registers: int
    spill_bytes: int
    stack_bytes: int
    shared_bytes: int
    warps_per_sm: int
    block_exps: int
    routes: int

    @property
    def exps_per_cell_state(self) -> float:
        return self.block_exps / self.routes


def resident_warps(registers: int, num_warps: int, shared_bytes: int, arch: int) -> int:
    """Warps of one kernel resident on an SM of ``arch`` (sm_80 / sm_90 occupancy rule)."""
    limits = ARCH_LIMITS[arch]
    regs_per_warp = -(-registers * 32 // 256) * 256
    by_registers = (limits["registers"] // regs_per_warp) // num_warps
    by_shared = limits["shared"] // (shared_bytes + 1024)
    blocks = min(by_registers, by_shared, limits["blocks"], limits["warps"] // num_warps)
    return blocks * num_warps


def _cuobjdump() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def _resource_usage(cubin: bytes) -> Dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.run([str(_cuobjdump()), "--dump-resource-usage", handle.name],
                              capture_output=True, text=True, check=True).stdout
    line = next(line for line in text.splitlines() if "REG:" in line)
    return {key: int(value) for key, value in re.findall(r"(\w+):(\d+)", line)}


def _block_exps(ttir: str, block_shapes: List[tuple]) -> int:
    """``math.exp`` ops on tensors of one of ``block_shapes`` in a TTIR listing."""
    types = {"tensor<" + "x".join(map(str, shape)) for shape in block_shapes}
    count = 0
    for match in re.finditer(r"math\.exp .*?: (tensor<[0-9x]+)x", ttir):
        count += match.group(1) in types
    return count


def compile_for(kernel, scalars: Dict[str, int], constexprs: Dict[str, object], dtype: torch.dtype,
                pointer_dtypes: Dict[str, torch.dtype], arch: int, num_warps: int,
                max_registers: Optional[int] = None):
    """Compile ``kernel`` for ``sm_<arch>`` as a launch with these arguments would (see module doc)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = dict(constexprs)
    signature, attrs = {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*" + _TRITON_DTYPE[pointer_dtypes.get(name, dtype if name in _DATA_POINTERS
                                                                     else torch.float32)]
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            value = scalars[name]
            if value == 1:
                constexprs[name] = 1
                signature[name] = "constexpr"
            else:
                signature[name] = "i32"
                if value % 16 == 0:
                    attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps} if max_registers is None else {"num_warps": num_warps, "maxnreg": max_registers}
    log = io.StringIO()
    knobs = triton.knobs
    previous = knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile
    knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = True, True  # ptxas runs and reports
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    finally:
        knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = previous
    spills = re.findall(r"(\d+) bytes spill stores", log.getvalue())
    if not spills:
        raise RuntimeError(f"ptxas printed no report for {kernel.__name__}")
    compiled.spill_store_bytes = int(spills[-1])
    return compiled


def _figures(name: str, compiled, arch: int, num_warps: int, block_shapes: List[tuple], routes: int) -> KernelFigures:
    usage = _resource_usage(compiled.asm["cubin"])
    shared = int(compiled.metadata.shared)
    return KernelFigures(
        kernel=name, arch=arch, num_warps=num_warps, registers=usage["REG"],
        spill_bytes=compiled.spill_store_bytes, stack_bytes=usage.get("STACK", 0), shared_bytes=shared,
        warps_per_sm=resident_warps(usage["REG"], num_warps, shared, arch),
        block_exps=_block_exps(compiled.asm["ttir"], block_shapes), routes=routes,
    )


def kernel_figures(direction: str, dtype: torch.dtype, maps: int, dim: int, nstate: int, height: int, width: int,
                   routes: List[int], arch: int, param_groups: int = 1, out_fp32: bool = False) -> KernelFigures:
    """Figures of the ``direction`` ("fwd" / "bwd") kernel as :mod:`~vmamba2d.ops.triton.launch` launches it on
    ``maps`` maps of ``dim`` channels with these routes and parameter groups."""
    kernels = launch.kernels()
    t = launch.cross_tiling(dim, nstate, height, width)
    acc = torch.float32
    grid = dict(zip(("dim", "nstate", "height", "width", "n_chan_blocks", "n_tile_rows", "n_tile_cols", "n_chunks"),
                    launch.grid_args(torch.empty(maps, dim, height, width, device="meta"),
                                     torch.empty(1, nstate, device="meta"), t)))
    constexprs = launch.constexprs(routes, torch.empty(0), torch.empty(0), True, t, acc, width)
    pointer_dtypes = {"y_ptr": torch.float32 if out_fp32 else dtype}
    grid["sets"] = launch.program_sets(t.n_chan_blocks, maps)
    grid["n_groups"] = t.n_chan_blocks // grid["sets"]
    grid["param_groups"] = param_groups
    warps, max_registers = launch.launch_config(t, direction, len(routes))
    if direction == "fwd":
        kernel = kernels.scan2d_fwd_kernel
        constexprs["SAVE_CARRIES"] = True
    else:
        kernel = kernels.scan2d_bwd_kernel
    compiled = compile_for(kernel, grid, constexprs, dtype, pointer_dtypes, arch, warps, max_registers)
    blocks = [(t.block_d, t.block_n, t.tile_h, t.tile_w), (t.block_d, t.block_n, 1, t.tile_h * t.tile_w)]
    return _figures(kernel.__name__, compiled, arch, warps, blocks, len(routes))


def cross_kernel_figures(direction: str, dtype: torch.dtype, batch: int, dim: int, nstate: int, height: int,
                         width: int, routes: List[int], arch: int) -> KernelFigures:
    """Figures of the kernel the four-route ``direction`` op launches (u (batch, dim, H, W))."""
    return kernel_figures(direction, dtype, batch, dim, nstate, height, width, routes, arch)


def single_route_kernel_figures(direction: str, dtype: torch.dtype, batch: int, dim: int, groups: int, nstate: int,
                                height: int, width: int, arch: int) -> KernelFigures:
    """Figures of the kernel the single-route ``direction`` op launches (u (batch, dim, L), ``groups``
    groups of B / C): its one route, each group of B / C a map with its own parameter rows."""
    return kernel_figures(direction, dtype, batch * groups, dim // groups, nstate, height, width,
                          SINGLE_ROUTE, arch, param_groups=groups)


# (label, dtype, batch, dim, N, H, W): the model's stage shapes (VMamba / 2DVMamba tiny, batch 128,
# inner dim 2 x 96 .. 2 x 768) and larger N (N = 64: programs of 16 warps).
REPORT_SHAPES = [
    ("stage 1", torch.float32, 128, 192, 1, 56, 56),
    ("stage 1 bf16", torch.bfloat16, 128, 192, 1, 56, 56),
    ("stage 3", torch.float32, 128, 768, 1, 14, 14),
    ("N = 16", torch.float32, 8, 64, 16, 28, 28),
    ("N = 64", torch.float32, 8, 64, 64, 14, 14),
]
CROSS_2D = [0, 4, 3, 7]
CROSS_FLAT = [8, 12, 11, 15]
# Groups of B / C of the single-route rows (the per-route model path scans with 1; 4 is a grouped
# configuration: G maps per batch element, parameter rows picked per map).
SINGLE_ROUTE_GROUPS = (1, 4)


def report_rows(archs=(80, 90)) -> List[Dict[str, object]]:
    """One row per (kernel, route set, shape, arch) of :data:`REPORT_SHAPES`."""
    rows = []
    for label, dtype, batch, dim, nstate, height, width in REPORT_SHAPES:
        for arch in archs:
            for direction in ("fwd", "bwd"):
                for routes_name, routes in (("cross 2D", CROSS_2D), ("cross flat", CROSS_FLAT)):
                    fig = cross_kernel_figures(direction, dtype, batch, dim, nstate, height, width, routes, arch)
                    rows.append(dict(shape=label, routes=routes_name, figures=fig))
                for groups in SINGLE_ROUTE_GROUPS:
                    fig = single_route_kernel_figures(direction, dtype, batch, dim, groups, nstate, height, width, arch)
                    rows.append(dict(shape=label, routes=f"single route, {groups} group{'s' * (groups > 1)}",
                                     figures=fig))
    return rows


def markdown_table(rows: List[Dict[str, object]]) -> str:
    lines = ["| shape | kernel | routes | arch | warps | registers | spill stores (B) | stack (B) | shared (B) "
             "| warps / SM | exps / cell·state |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        f: KernelFigures = row["figures"]  # type: ignore[assignment]
        lines.append(f"| {row['shape']} | {f.kernel} | {row['routes']} | sm_{f.arch} | {f.num_warps} | {f.registers} "
                     f"| {f.spill_bytes} | {f.stack_bytes} | {f.shared_bytes} | {f.warps_per_sm} | {f.exps_per_cell_state:g} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    argparse.ArgumentParser(prog="python -m vmamba2d.ops.triton.static",
                            description=__doc__.splitlines()[0]).parse_args(argv)  # no options; --help
    import triton

    print(f"triton {triton.__version__}, compiled without a GPU (static figures, nothing timed)\n")
    print(markdown_table(report_rows()))


if __name__ == "__main__":
    main()
