#!/usr/bin/env python
"""Static figures of the RS backward (csrc/cuda/entries/scan2d_rows_backward_entry.cu) and its carry-saving
forward, no GPU: compiler figures only.

For the model's map widths (56, 28, 14, 7) x input type (fp32, bf16, fp16) x arch (sm_90, sm_80,
sm_75) at route 0, and on sm_90 at the other routes of VMamba's cross scan (codes 4, 3, 7: columns
first, from the bottom-right corner), the instance the backward plan picks
(vmamba2d/ops/compiled/rows_backward_launch.py: backward_plan; dy in the input type):

* registers, spills, stack, static shared memory, block barriers of the NVRTC build (what a user's GPU
  runs: vmamba2d.ops.compiled.nvrtc.compile_kernel) of the backward and of the saving forward, and
  for 2-byte inputs the registers and spills of the backward's fp32-du form (a multi-route op's
  routes before the last: VMAMBA2D_RSB_DU_F32);
* resident warps per SM of the backward's 128-thread blocks from those registers and the band
  buffers' shared memory (65536 registers allocated 256 a warp; 228 / 164 / 64 KiB of shared
  memory per SM on sm_90 / sm_80 / sm_75 with 1 KiB reserved per block on sm_80+);
* the same for the four cross routes' carries in one launch (vmamba2d_rows_cross_save: the saving
  forward of the four-route backward) at route 0's widths and types on the first arch: registers,
  spills, and the SASS of its top-down and bottom-up sweeps' row loops per cell, channel and route;
* SASS of its two row loops from ``nvcc -cubin`` + ``nvdisasm -c`` (dev/gpu/sass_report.py's natural
  loops): the recompute loop (the innermost loop with shuffles up and none down: one forward row)
  and the adjoint loop (the innermost loop with loads and shuffles down and none up: one row
  bottom-up, the dB / dC sums over the warp's maps unrolled in it). "static / cell·ch" = the loop
  body's static instructions (every path once) x 32 lanes / (M maps x W cells·channels a row); a
  static code measure, not an executed count.

    python dev/gpu/v4_static_backward.py                 # print the table
    python dev/gpu/v4_static_backward.py --write benchmarks/scan_cuda_v4_backward_static.md
"""
from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import v4_static_report as static_report  # noqa: E402

from vmamba2d.ops.compiled import nvrtc  # noqa: E402
from vmamba2d.ops.compiled import rows_backward_launch as rbl  # noqa: E402

sass_report = static_report.sass_report
ENTRY = static_report.CUDA_SOURCES / "entries" / "scan2d_rows_backward_entry.cu"
SYMBOL = "vmamba2d_rows_backward"
ARCHS = (90, 80, 75)
# The cross scan's other routes, reported on the first arch of --archs.
OTHER_ROUTES = (4, 3, 7)
WIDTHS = (56, 28, 14, 7)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SMEM_PER_SM = {90: 228 * 1024, 80: 164 * 1024, 75: 64 * 1024}


@dataclass
class Row:
    route: int
    arch: int
    dtype: str
    width: int
    vec: int
    maps: int
    registers: int
    spill_bytes: int
    stack_bytes: int
    smem: int
    barriers: int
    warps: int
    save_registers: int
    save_spill_bytes: int
    sum_form: str  # "regs / spill B" of the fp32-du form, "-" for fp32 inputs
    recompute: int
    adjoint: int

    @property
    def per_cell(self) -> tuple[float, float]:
        cells = self.maps * self.width
        return self.recompute * 32 / cells, self.adjoint * 32 / cells


def resident_warps(registers: int, smem: int, arch: int) -> int:
    """Warps per SM of 128-thread blocks at ``registers`` per thread and ``smem`` static shared memory."""
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_registers = 65536 // (per_warp * 4)
    reserved = 1024 if arch >= 80 else 0
    by_smem = SMEM_PER_SM[arch] // (smem + reserved) if smem else by_registers
    max_warps = 32 if arch == 75 else 64
    return min(by_registers, by_smem, max_warps // 4) * 4


def nvcc_loops(nvcc: str, disassembler: str, arch: int, defines: dict[str, str], workdir: Path,
               symbol: str = SYMBOL, prefix: str = "rsb") -> tuple[int, int]:
    """Static instructions of the entry's two row loops in the nvcc build: the innermost loop with
    shuffles up and none down (the backward's recompute loop, the cross carries' top-down sweep) and
    the one with loads and shuffles down and none up (the adjoint loop, the bottom-up sweep)."""
    compiled = static_report.compile_entry(nvcc, disassembler, f"sm_{arch}", defines, workdir, symbol, ENTRY, prefix)
    instructions = compiled.instructions
    blocks = sass_report.basic_blocks(instructions, compiled.labels)
    loops = sass_report.natural_loops(blocks)

    def count(body, opcode=None):
        return sum(1 for b in body for i in instructions[blocks[b].start:blocks[b].end]
                   if opcode is None or i.opcode.startswith(opcode))

    up = min((body for body in loops if count(body, "SHFL.UP") and not count(body, "SHFL.DOWN")), key=len)
    down = min((body for body in loops if count(body, "SHFL.DOWN") and count(body, "LDG")
                and not count(body, "SHFL.UP")), key=len)
    return count(up), count(down)


def analyse(nvcc: str, disassembler: str, toolchain, arch: int, dtype: str, width: int, workdir: Path,
            route: int = 0) -> Row:
    torch_dtype = DTYPES[dtype]
    plan = rbl.backward_plan(torch_dtype.itemsize, torch_dtype.itemsize, width)
    spec = rbl.backward_spec(plan, torch_dtype, route)
    r = nvrtc.compile_kernel(spec, arch, toolchain).resources
    s = nvrtc.compile_kernel(rbl.save_spec(plan, torch_dtype, route), arch, toolchain).resources
    sum_form = "-"
    if torch_dtype != torch.float32:
        f = nvrtc.compile_kernel(rbl.backward_spec(plan, torch_dtype, route, du_fp32=True), arch, toolchain).resources
        sum_form = f"{f.registers} / {f.spill_stores + f.spill_loads}"
    recompute, adjoint = nvcc_loops(nvcc, disassembler, arch, dict(spec.defines), workdir)
    return Row(route, arch, dtype, width, plan.vec, plan.maps_per_warp, r.registers, r.spill_stores + r.spill_loads,
               r.stack_bytes, r.static_smem, r.barriers, resident_warps(r.registers, r.static_smem, arch),
               s.registers, s.spill_stores + s.spill_loads, sum_form, recompute, adjoint)


@dataclass
class CrossSaveRow:
    arch: int
    dtype: str
    width: int
    vec: int
    maps: int
    registers: int
    spill_bytes: int
    top_down: int
    bottom_up: int

    @property
    def per_cell_route(self) -> float:
        # Each sweep's loop body scans one row of its two routes for the warp's M maps.
        return (self.top_down + self.bottom_up) * 32 / (self.maps * self.width) / 4


def analyse_cross_save(nvcc: str, disassembler: str, toolchain, arch: int, dtype: str, width: int,
                       workdir: Path) -> CrossSaveRow:
    torch_dtype = DTYPES[dtype]
    plan = rbl.backward_plan(torch_dtype.itemsize, torch_dtype.itemsize, width)
    spec = rbl.cross_save_spec(plan, torch_dtype)
    r = nvrtc.compile_kernel(spec, arch, toolchain).resources
    top_down, bottom_up = nvcc_loops(nvcc, disassembler, arch, dict(spec.defines), workdir, rbl.CROSS_SAVE_SYMBOL,
                                     "rsc")
    return CrossSaveRow(arch, dtype, width, plan.vec, plan.maps_per_warp, r.registers,
                        r.spill_stores + r.spill_loads, top_down, bottom_up)


def format_cross_save_table(rows: list[CrossSaveRow]) -> str:
    lines = ["| arch | dtype | W | V | M | regs | spill B (st+ld) | top-down loop | bottom-up loop | "
             "static / cell·ch·route |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| sm_{r.arch} | {r.dtype} | {r.width} | {r.vec} | {r.maps} | {r.registers} | {r.spill_bytes} | "
                     f"{r.top_down} | {r.bottom_up} | {r.per_cell_route:.1f} |")
    return "\n".join(lines)


def format_table(rows: list[Row]) -> str:
    lines = ["| route | arch | dtype | W | V | M | regs | spill B (st+ld) | stack B | smem B | BAR | warps / SM | "
             "recompute loop: static / cell·ch | adjoint loop: static / cell·ch | sum | saving fwd regs / spill B | "
             "fp32-du form regs / spill B |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rec, adj = r.per_cell
        lines.append(f"| {r.route} | sm_{r.arch} | {r.dtype} | {r.width} | {r.vec} | {r.maps} | {r.registers} | {r.spill_bytes} | "
                     f"{r.stack_bytes} | {r.smem} | {r.barriers} | {r.warps} | {r.recompute} -> {rec:.1f} | "
                     f"{r.adjoint} -> {adj:.1f} | {rec + adj:.1f} | {r.save_registers} / {r.save_spill_bytes} | "
                     f"{r.sum_form} |")
    return "\n".join(lines)


def report(rows: list[Row], toolchain, cross_rows: list[CrossSaveRow]) -> str:
    head = [
        "# RS backward (N = 1): static figures",
        "",
        "Compiler figures, no GPU ran. Written by `python dev/gpu/v4_static_backward.py --write "
        "benchmarks/scan_cuda_v4_backward_static.md` on " + datetime.date.today().isoformat()
        + f" ({platform.machine()}, NVRTC {toolchain.version_text}).",
        "",
        "Registers, spills, stack, shared memory and barriers: the NVRTC build (what runs); loop "
        "instructions: the nvcc build of the same instance (`nvcc -O3`, `nvdisasm -c`). \"static / cell·ch\" "
        "counts a row loop's body once (every path, inner loops once) x 32 / (M x W): a code-size measure, "
        "not an executed count; both softplus paths and the dB / dC sums over the warp's M maps (unrolled: M "
        "is compiled in) are in it. The RS forward for comparison: 34.0 (fp32) / "
        "39.1 (bf16) SASS per cell·channel at W = 56 on sm_90 (benchmarks/scan_cuda_v4_static.md, a "
        "longest-path count of its loop). Route codes: 0 rows first from the top-left (every arch), 4 columns "
        "first, 3 / 7 their reverses from the bottom-right (the first arch only).",
        "",
        format_table(rows),
        "",
        "## The cross routes' carries in one launch (the four-route backward's saving forward)",
        "",
        "vmamba2d_rows_cross_save: VMamba's four cross routes in two sweeps (no C, no y, no row scan of the "
        "columns-first routes). \"static / cell·ch·route\": both sweeps' row-loop bodies x 32 / (M x W) / 4 "
        "routes, to set beside a route's saving pass (the recompute loop above is the RS backward's own "
        "forward row, a close stand-in for it).",
        "",
        format_cross_save_table(cross_rows),
        "",
    ]
    return "\n".join(head)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the markdown report here")
    parser.add_argument("--archs", type=int, nargs="*", default=list(ARCHS))
    args = parser.parse_args(argv)
    nvcc, disassembler = static_report.find_tools(None)
    if nvcc is None or disassembler is None:
        print("nvcc / nvdisasm not found", file=sys.stderr)
        return 2
    toolchain = nvrtc.find_toolchain()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [analyse(nvcc, disassembler, toolchain, arch, dtype, width, Path(tmp))
                for arch in args.archs for dtype in DTYPES for width in WIDTHS]
        rows += [analyse(nvcc, disassembler, toolchain, args.archs[0], dtype, width, Path(tmp), route)
                 for route in OTHER_ROUTES for dtype in DTYPES for width in WIDTHS]
        cross_rows = [analyse_cross_save(nvcc, disassembler, toolchain, args.archs[0], dtype, width, Path(tmp))
                      for dtype in DTYPES for width in WIDTHS]
    text = report(rows, toolchain, cross_rows)
    if args.write:
        args.write.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
