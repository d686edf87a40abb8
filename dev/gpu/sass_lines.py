#!/usr/bin/env python
"""Where the executed-instruction estimate of one CUDA scan kernel goes, by source line.

dev/gpu/sass_report.py estimates the instructions a lane issues per tile cell x channel in one trip of
a kernel's tile loop (its docstring, 6.): the longest path through the loop, block phases' quad
loops and rolled channel loops weighted by their trips, scalar fallbacks left out. This tool takes
the same path and weights (sass_report.executed_estimate with ``weights``) and charges every
instruction on it to the source line ``nvdisasm -c -gi`` gives it (the kernels compile with
-lineinfo), in the phase of the tile loop it sits in: the instructions before the loop's first
block barrier (BAR.SYNC, in address order) are the load phase, then the scan phase, then the store
phase. Inlined code is charged to its innermost line, or with ``--frame FILE`` to the first frame
of the inline chain in a file whose name ends with FILE (e.g. scan2d_forward.cuh: the lines of
the kernel body that called the helpers). The rows sum to the estimate. Nothing runs on a GPU.

    python dev/gpu/sass_lines.py --extension /tmp/build/_C_cuda_emu*.so               # fwd fp32 sm_90
    python dev/gpu/sass_lines.py --role backward --dtype bf16 --frame scan2d_backward.cuh --top 40
    python dev/gpu/sass_lines.py --threads 128 --channels 4                           # no extension
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]


def _load_tool(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


sass_report = _load_tool("vmamba2d_sass_report", REPO / "dev" / "gpu" / "sass_report.py")

PHASES = ("load", "scan", "store")


def place(chain: tuple, frame: str = "") -> str:
    """"file:line" of an inline chain (sass_report.inline_chains): its innermost frame, or the first
    whose file ends with ``frame``; "?" for no chain."""
    chosen = next((f for f in chain if frame and f[0].endswith(frame)), chain[0] if chain else None)
    return f"{chosen[0]}:{chosen[1]}" if chosen else "?"


@dataclass
class LineCost:
    where: str  # "file:line"
    phase: str  # load / scan / store (or "phase k" past the second barrier)
    per_cell_channel: float  # executed instructions per tile cell x channel charged to it
    static: int  # distinct instructions of the line on the path


def attribute(instructions: list, labels: dict[str, int], chains: dict[int, tuple], threads: int,
              channels: int, frame: str = "", marked: frozenset = frozenset()
              ) -> tuple[list[LineCost], "sass_report.ExecutedEstimate"]:
    """The estimate of sass_report.executed_estimate for a block of ``threads`` threads owning
    ``channels`` channels (``chains``: the function's inline chains, ``marked``: the scalar
    fallback lines), split by (place(chain, frame), phase), costliest first; and the estimate."""
    weights: dict[int, float] = {}
    estimate = sass_report.executed_estimate(instructions, labels, threads, channels, chains, marked, weights)
    lines = {address: place(chain, frame) for address, chain in chains.items()}
    blocks = sass_report.basic_blocks(instructions, labels)
    barriers = sorted(ins.address for n in weights for ins in instructions[blocks[n].start:blocks[n].end]
                      if ins.base == "BAR")
    cost: dict[tuple[str, str], float] = defaultdict(float)
    static: dict[tuple[str, str], int] = defaultdict(int)
    scale = 32 / (sass_report.TILE_CELLS * channels)
    for n, weight in weights.items():
        for ins in instructions[blocks[n].start:blocks[n].end]:
            k = sum(ins.address > b for b in barriers)
            key = (lines.get(ins.address, "?"), PHASES[k] if k < len(PHASES) else f"phase {k}")
            cost[key] += weight * scale
            static[key] += 1
    rows = [LineCost(where, phase, value, static[(where, phase)]) for (where, phase), value in cost.items()]
    return sorted(rows, key=lambda r: -r.per_cell_channel), estimate


def format_table(rows: list[LineCost], top: int) -> str:
    total = sum(r.per_cell_channel for r in rows)
    by_phase: dict[str, float] = defaultdict(float)
    for r in rows:
        by_phase[r.phase] += r.per_cell_channel
    out = ["| source line | phase | executed / cell·channel | share | instructions |", "|---|---|---:|---:|---:|"]
    for r in rows[:top]:
        out.append(f"| {r.where} | {r.phase} | {r.per_cell_channel:.2f} | {r.per_cell_channel / total:.1%} | {r.static} |")
    if len(rows) > top:
        rest = sum(r.per_cell_channel for r in rows[top:])
        out.append(f"| ({len(rows) - top} more lines) | | {rest:.2f} | {rest / total:.1%} | |")
    phases = ", ".join(f"{p} {v:.1f}" for p, v in by_phase.items())
    out.append(f"\ntotal {total:.1f} per cell·channel ({phases})")
    return "\n".join(out)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("forward", "backward"), default="forward")
    parser.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32")
    parser.add_argument("--variant", default="kOneStateSequential")
    parser.add_argument("--arch", default="9.0", choices=sorted(sass_report.ARCH_PROFILES))
    parser.add_argument("--frame", default="", help="charge inlined code to its first frame in this file")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--extension", type=Path, help="a built _C_cuda library (its launch planner)")
    parser.add_argument("--threads", type=int, help="block threads (default: the planner's, model shape)")
    parser.add_argument("--channels", type=int, help="channels per block (default: the planner's)")
    parser.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    disassembler = sass_report.find_disassembler(args.nvcc)
    if disassembler is None or shutil.which(args.nvcc) is None:
        print("needs nvcc and nvdisasm", file=sys.stderr)
        return 2
    pass_ = {"forward": "fwd", "backward": "bwd"}[args.role]
    threads, channels = args.threads, args.channels
    if threads is None or channels is None:
        module = sass_report.load_extension(args.extension) if args.extension else sass_report.cuda_module()
        if module is None:
            print("no launch planner: pass --extension, or --threads and --channels", file=sys.stderr)
            return 2
        plan = sass_report.plan_for(module, sass_report.PLAN_SHAPE, sass_report.ARCH_PROFILES[args.arch])
        threads = threads or plan[f"{pass_}_threads"]
        channels = channels or plan[f"{pass_}_channels"]
    source = sass_report.CUDA_SOURCES / sass_report.KERNEL_SOURCES[0 if pass_ == "fwd" else 1]
    ptxas = sass_report.ptxas_report
    with tempfile.TemporaryDirectory(prefix="sass-lines-") as tmp:
        result = ptxas.compile_one(args.nvcc, source, args.arch, ptxas._torch_compile_flags(), Path(tmp))
        if not result.ok:
            print(result.log[-3000:], file=sys.stderr)
            return 1
        cubin = Path(tmp) / f"{source.stem}.{ptxas.cuda_archs.sm_name(args.arch)}.cubin"
        text = subprocess.run([disassembler, "-c", "-gi", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    names = ptxas.readable_names([k.mangled for k in result.kernels])
    for k in result.kernels:
        k.name = names.get(k.mangled, k.mangled)  # the role follows from the readable name
    chosen = [k for k in result.kernels if k.entry and k.role == args.role
              and sass_report._dtype_of(k.name) == args.dtype and sass_report._variant_of(k.name) == args.variant]
    if len(chosen) != 1:
        print(f"{len(chosen)} kernels match {args.role} {args.dtype} {args.variant}", file=sys.stderr)
        return 1
    kernel = chosen[0]
    instructions, labels = sass_report.parse_sass(text)[kernel.mangled]
    rows, estimate = attribute(instructions, labels, sass_report.inline_chains(text)[kernel.mangled], threads,
                               channels, args.frame, sass_report.fallback_lines())
    print(f"{kernel.name} sm_{args.arch.replace('.', '')}: {kernel.registers} registers, "
          f"{threads} threads, {channels} channels; estimate {estimate.per_cell_channel} ({estimate.note})\n")
    print(format_table(rows, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
