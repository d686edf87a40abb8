#!/usr/bin/env python
"""Static figures of the v4 one-plane-per-lane forward (PL, csrc/cuda/entries/scan2d_planes_entry.cu), no GPU.

For plane shapes (the model's 7 x 7 first) x input type x arch, the entry the launcher would compile
(route 0, 16-byte copies, y in the input type, the chunk vmamba2d/ops/compiled/planes_launch.py's
planes_plan picks on the arch's shared memory, batch 128 x 3072 maps in one group as the model's 7 x 7
stage) is compiled with ``nvcc -cubin -Xptxas -v`` and disassembled with ``nvdisasm -c``:

* registers, spills and stack (ptxas); block barriers (BAR) in the kernel: PL has 2 per chunk;
* SASS per cell·channel: one trip of the chunk loop (the natural loop holding BAR.SYNC; two of them,
  y in the input type and fp32 y: the input-type one), per thread = per warp / 32 lanes = per plane,
  over the plane's cells. The trip is dev/gpu/sass_report.py's longest path through the loop with
  every inner loop folded at its trips from the plan: the copy loops (the innermost loops holding
  LDGSTS, or on sm_75 a 16-byte shared store, in address order u, delta, B, C) at the pieces a
  thread issues (ceil(pieces / chunk)), the per-batch-entry run loops around them at 1 (contiguous
  single-route tensors), the y store loop at a thread's pieces along its wide-store path (the blocks
  with narrower stores and the ragged-end element loops inside it left out: two pieces of a chunk run
  them). The scan itself is straight-line code. On sm_75
  ptxas versions the plain-load copy loops (7 copies of 4 loops), so the copy loops cannot be told
  apart by address order and the figure is left out ("-");
* resident warps per SM (CTAs per SM from shared memory and 64 registers, x chunk / 32), shared memory
  per CTA, and bytes in flight per SM (an estimate from the plan, not a measurement): resident CTAs
  x one buffer (a chunk's copies are in flight while the other buffer is scanned);
* shared-memory bank conflicts of the scan's loads (from the layout, not SASS): the most distinct
  4-byte words of one bank the lanes of a warp load for the same cell (1: conflict-free).

    python dev/gpu/v4_static_planes.py                 # print the table
    python dev/gpu/v4_static_planes.py --write benchmarks/scan_cuda_v4_static_planes.md
    python dev/gpu/v4_static_planes.py --check         # exit 1 when a budget below is broken

Budgets (--check, tests/ops/compiled/test_cuda_v4_static_planes.py): registers <= 64, no spills / stack, 2 BAR per
chunk loop, SASS per cell·channel on sm_90 <= LOOP_BUDGET[(dtype, shape)] (the committed kernel's
figure plus ~3%: a ratchet, not the issue's target of 22).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
CUDA_SOURCES = REPO / "csrc" / "cuda"
ENTRY = CUDA_SOURCES / "entries" / "scan2d_planes_entry.cu"
SYMBOL = "vmamba2d_planes_forward"
ARCHS = ("sm_90", "sm_80", "sm_75")
DTYPES = ("fp32", "bf16", "fp16")
SHAPES = ((7, 7), (8, 8), (3, 5))
MAX_REGISTERS = 64
DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}
# (shared memory per CTA opt-in, per SM, reserved per CTA) of the archs' flagship GPUs (H100 / A100 / T4).
SMEM = {"sm_90": (232448, 233472, 1024), "sm_80": (166912, 167936, 1024), "sm_75": (65536, 65536, 0)}
MODEL_MAPS = (128, 3072)  # batch x channels of vmamba2d_tiny's 7 x 7 stage at batch 128
# SASS per cell·channel of the chunk loop on sm_90 that CI holds, per (dtype, (H, W)).
# Committed kernel (nvcc 13.0): 59.2 / 54.9 / 54.6.
LOOP_BUDGET = {("fp32", (7, 7)): 61.0, ("bf16", (7, 7)): 56.5, ("fp16", (7, 7)): 56.5}


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sass_report = _load("vmamba2d_sass_report", REPO / "dev" / "gpu" / "sass_report.py")
ptxas_report = sass_report.ptxas_report
planes_launch = _load("vmamba2d_planes_launch_for_report", REPO / "vmamba2d" / "ops" / "compiled" / "planes_launch.py")


@dataclass
class Row:
    arch: str
    dtype: str
    height: int
    width: int
    chunk: int
    registers: int
    spill_bytes: int
    stack_bytes: int
    barriers: int
    per_cell_channel: Optional[float]
    smem_kib: float
    resident_warps: int
    in_flight_kib: float
    bank_ways: int

    @property
    def label(self) -> str:
        return f"PL {self.arch} {self.dtype} {self.height}x{self.width}"


def _elem_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def plan_for(arch: str, dtype: str, height: int, width: int):
    """The launcher's plan on the arch's flagship GPU for the model's maps (route 0, aligned tensors)."""
    per_block, per_sm, reserved = SMEM[arch]
    return planes_launch.planes_plan(_elem_bytes(dtype), False, *MODEL_MAPS, 1, height, width, 0, 16, per_block,
                                     per_sm, reserved)


def bank_conflict_ways(length: int, elem: int, copy: int = 16) -> int:
    """Most distinct 4-byte words one bank serves when the 32 lanes of a warp load the same cell of
    consecutive planes of ``length`` cells of ``elem`` bytes, staged ``plane_pitch`` bytes apart,
    over every cell and every start of the chunk within a copy piece."""
    pitch = planes_launch.plane_pitch(length, elem, copy)
    worst = 1
    for lead in range(0, copy if pitch == length * elem else 1, elem):
        for cell in range(length):
            banks: dict[int, set[int]] = {}
            for lane in range(32):
                word = (lead + lane * pitch + cell * elem) // 4
                banks.setdefault(word % 32, set()).add(word)
            worst = max(worst, max(len(words) for words in banks.values()))
    return worst


def compile_cubin(nvcc: str, arch: str, defines: dict[str, int], workdir: Path) -> tuple[Path, str]:
    cubin = workdir / f"pl_{arch}_{'_'.join(str(v) for v in defines.values())}.cubin"
    cmd = [nvcc, "-cubin", f"-arch={arch}", "-O3", "-std=c++17", "-Xptxas", "-v", f"-I{CUDA_SOURCES}",
           *[f"-D{k}={v}" for k, v in defines.items()], str(ENTRY), "-o", str(cubin)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed for {arch} {defines}:\n{done.stderr}")
    return cubin, done.stderr + done.stdout


def _own_ops(instructions, blocks, body: set[int], children: list[set[int]]) -> set[str]:
    inside = set().union(*children) if children else set()
    return {i.opcode for n in body - inside for i in instructions[blocks[n].start:blocks[n].end]}


def chunk_trip(instructions, labels, trips_in: list[int], trips_out: int, copy_bytes: int = 16) -> Optional[float]:
    """Instructions of one chunk-loop trip along its longest path (the input-type y variant: the first
    loop holding BAR.SYNC), copy loops folded at ``trips_in`` (u, delta, B, C), the store loop at
    ``trips_out``; None when the loop structure is not the expected one."""
    blocks = sass_report.basic_blocks(instructions, labels)
    loops = sass_report.natural_loops(blocks)
    with_bar = [body for body in loops
                if any(i.base == "BAR" for n in body for i in instructions[blocks[n].start:blocks[n].end])]
    if not with_bar:
        return None
    chunk = min(with_bar, key=min)
    inner = [body for body in loops if body < chunk]
    folded: list[tuple[set[int], float]] = []
    copies = []
    for body in sorted(inner, key=min):
        children = [o for o in inner if o < body]
        ops = _own_ops(instructions, blocks, body, children)
        parents = [o for o in inner if body < o]
        if any(op.startswith("STG") for op in ops) and children:
            folded.append((body, trips_out))  # the y store loop
        elif parents and any(op.startswith("STG") for p in parents
                             for op in _own_ops(instructions, blocks, p, [c for c in inner if c < p])):
            folded.append((body, 0))  # ragged ends of y, inside the store loop
        elif any(op.startswith("LDGSTS") or op.startswith("STS.128") for op in ops):
            copies.append(body)
        elif children:
            folded.append((body, 1))  # a tensor's runs (one per batch entry; one for contiguous tensors)
        else:
            folded.append((body, 0))  # ragged copy ends (sm_75's element copies)
    if len(copies) != len(trips_in):
        return None
    folded += list(zip(copies, trips_in))
    # The store loop's element stores at the ragged ends (two pieces a chunk) are off the path: a piece
    # takes the wide store.
    wide = f".{8 * copy_bytes}"
    ragged = {n for n in chunk if copy_bytes > 4 and any(i.base == "STG" and wide not in i.opcode
                                                          for i in instructions[blocks[n].start:blocks[n].end])}
    return sass_report.iteration_instructions(instructions, blocks, chunk, folded, ragged)


def analyse(nvcc: str, disassembler: str, arch: str, dtype: str, height: int, width: int, workdir: Path) -> Row:
    plan = plan_for(arch, dtype, height, width)
    defines = {"VMAMBA2D_PL_DTYPE": DTYPE_CODES[dtype], "VMAMBA2D_PL_HEIGHT": height, "VMAMBA2D_PL_WIDTH": width,
               "VMAMBA2D_PL_ROUTE": 0, "VMAMBA2D_PL_COPY": plan.copy_bytes}
    cubin, log = compile_cubin(nvcc, arch, defines, workdir)
    kernels = [k for k in ptxas_report.parse_ptxas(log, ENTRY.name, arch) if k.entry]
    if len(kernels) != 1:
        raise RuntimeError(f"expected one entry in the ptxas report, got {len(kernels)}")
    res = kernels[0]
    sass = subprocess.run([disassembler, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    instructions, labels = sass_report.parse_sass(sass)[SYMBOL]
    barriers = sum(1 for i in instructions if i.base in ("BAR", "BARRIER"))
    elem, length, copy = _elem_bytes(dtype), height * width, plan.copy_bytes
    plane = length * elem

    def pieces_per_thread(first: int, count: int) -> int:
        begin, end = first * plane, (first + count) * plane
        pieces = -(-(end - begin // copy * copy) // copy)
        return -(-pieces // plan.chunk)

    # A chunk inside one batch entry (the common case): u and delta chunk-long runs, B and C one plane.
    first = plan.chunk * 3
    per_in = [pieces_per_thread(first, plan.chunk)] * 2 + [pieces_per_thread(first // MODEL_MAPS[1], 1)] * 2
    trip = chunk_trip(instructions, labels, per_in, pieces_per_thread(first, plan.chunk), copy)
    # y in the input type is staged over u: the two buffers are all the shared memory, one in flight.
    return Row(arch, dtype, height, width, plan.chunk, res.registers, res.spill_stores + res.spill_loads,
               res.stack_bytes, barriers, None if trip is None else trip / length, plan.smem / 1024,
               plan.ctas_per_sm * plan.chunk // 32, plan.ctas_per_sm * plan.smem / 2 / 1024,
               bank_conflict_ways(length, elem))


def run(nvcc: str, disassembler: str, archs, dtypes, shapes) -> list[Row]:
    """One Row per (arch, dtype, shape)."""
    with tempfile.TemporaryDirectory() as tmp:
        return [analyse(nvcc, disassembler, a, d, h, w, Path(tmp)) for a in archs for d in dtypes for h, w in shapes]


def budget_failures(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        if r.registers > MAX_REGISTERS:
            out.append(f"{r.label}: {r.registers} registers > {MAX_REGISTERS}")
        if r.spill_bytes or r.stack_bytes:
            out.append(f"{r.label}: {r.spill_bytes} bytes of spills, {r.stack_bytes} bytes of stack")
        if r.barriers != 4:
            out.append(f"{r.label}: {r.barriers} block barriers (2 per chunk loop, 2 loops expected)")
        if r.per_cell_channel is None and r.arch != "sm_75":
            out.append(f"{r.label}: no chunk loop of the expected structure found")
        elif r.arch == "sm_90" and (r.dtype, (r.height, r.width)) in LOOP_BUDGET \
                and r.per_cell_channel > LOOP_BUDGET[(r.dtype, (r.height, r.width))]:
            out.append(f"{r.label}: {r.per_cell_channel:.1f} SASS per cell·channel > "
                       f"{LOOP_BUDGET[(r.dtype, (r.height, r.width))]}")
    return out


def format_table(rows: list[Row]) -> str:
    head = ("| arch | dtype | H x W | chunk | registers | spills / stack (B) | BAR | SASS / cell·ch | smem / CTA (KiB) "
            "| warps / SM | in flight / SM (KiB, est.) | LDS bank ways |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        cell = f"{r.per_cell_channel:.1f}" if r.per_cell_channel is not None else "-"
        lines.append(f"| {r.arch} | {r.dtype} | {r.height}x{r.width} | {r.chunk} | {r.registers} | "
                     f"{r.spill_bytes} / {r.stack_bytes} | {r.barriers} | {cell} | {r.smem_kib:.1f} | "
                     f"{r.resident_warps} | {r.in_flight_kib:.0f} | {r.bank_ways} |")
    return "\n".join(lines)


def find_tools(nvcc: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    report = _load("vmamba2d_v4_static_report_for_planes", REPO / "dev" / "gpu" / "v4_static_report.py")
    return report.find_tools(nvcc)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvcc", help="nvcc to use (default: PATH, /usr/local/cuda)")
    parser.add_argument("--archs", nargs="+", default=list(ARCHS))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--write", type=Path, help="also write the table with machine, date and commit")
    parser.add_argument("--check", action="store_true", help="exit 1 when a budget is broken")
    args = parser.parse_args(argv)
    nvcc, disassembler = find_tools(args.nvcc)
    if nvcc is None or disassembler is None:
        print("nvcc / nvdisasm not found", file=sys.stderr)
        return 2
    rows = run(nvcc, disassembler, args.archs, args.dtypes, SHAPES)
    table = format_table(rows)
    print(table)
    failures = budget_failures(rows)
    for f in failures:
        print("BUDGET:", f)
    if args.write:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
        args.write.write_text(
            "# v4 one-plane-per-lane forward (PL): static figures\n\n"
            f"Written by `dev/gpu/v4_static_planes.py --write` on {platform.node()} ({platform.machine()}, {version}), "
            f"{stamp}, commit {commit}. No GPU ran: these are compiler figures; bytes in flight are an estimate "
            "from the plan and bank conflicts come from the layout. Route 0, 16-byte copies, y in the input type, "
            "N = 1, 128 x 3072 maps in one group (the model's 7 x 7 stage at batch 128). sm_75: no SASS figure "
            "(ptxas versions its copy loops; see the tool's docstring) and its copies are synchronous, so its "
            "in-flight column is only the buffer size.\n\n"
            + table + "\n" + "".join(f"\nBudget broken: {f}" for f in failures) + "\n")
    return 1 if args.check and failures else 0


if __name__ == "__main__":
    sys.exit(main())
