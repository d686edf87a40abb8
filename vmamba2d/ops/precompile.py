"""Compile the CUDA kernels with NVRTC ahead of time, into the kernel cache; no GPU needed.

    python -m vmamba2d.ops.precompile --arch 75 80 86 89 90
    python -m vmamba2d.ops.precompile --arch 90 --kernels forward.bf16.kOneStateSequential carry_scan

For air-gapped clusters and container images: run it where the image is built (with the same
vmamba2d, NVRTC and CUDA headers as at run time, since they are part of the cache key) and ship
the cache folder (``$VMAMBA2D_CACHE_DIR``, default ``~/.cache/vmamba2d``). Prints one row per
kernel and arch: the image's bytes and ptxas's registers, spills, stack frame and static shared
memory; exits 1 when a kernel does not compile (NVRTC's log is printed).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from vmamba2d.ops.compiled import kernel_cache, nvrtc
from vmamba2d.ops.compiled.cuda_kernels import KERNELS, KernelSpec, kernel_spec

# The GPU generations the CI compiles for: T4, A100, RTX 3090 / A10, RTX 4090 / L4 / L40, H100 / H200.
DEFAULT_ARCHS = (75, 80, 86, 89, 90)


@dataclass(frozen=True)
class Row:
    """One kernel for one arch: what the cache holds, or why it could not be compiled."""

    kernel: str
    arch: int
    compiled: Optional[nvrtc.CompiledKernel]
    was_cached: bool = False
    error: str = ""


def precompile(specs: Sequence[KernelSpec], archs: Sequence[int], jobs: int = 1,
               folder: Optional[Path] = None) -> list[Row]:
    """Fill the cache with every (spec, arch); one Row each, in (arch, table) order.

    A kernel NVRTC rejects gives a Row with its error (the log); the others still compile.
    Raises NvrtcUnavailable when there is no toolchain.
    """
    toolchain = nvrtc.find_toolchain()
    for arch in archs:
        nvrtc.target_for(arch, toolchain.archs)  # ValueError for an arch this NVRTC cannot serve

    def one(spec: KernelSpec, arch: int) -> Row:
        try:
            compiled, cached = kernel_cache.get_kernel(spec, arch, folder, toolchain, announce=False)
            return Row(spec.name, arch, compiled, cached)
        except nvrtc.NvrtcCompileError as err:
            return Row(spec.name, arch, None, error=str(err))

    work = [(spec, arch) for arch in archs for spec in specs]
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(lambda item: one(*item), work))


def format_table(rows: Sequence[Row]) -> str:
    """Markdown table of precompile's rows."""
    lines = ["| kernel | arch | image | bytes | registers | spill st / ld B | stack B | static smem B | NVRTC s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row.compiled is None:
            lines.append(f"| {row.kernel} | sm_{row.arch} | FAILED | | | | | | |")
            continue
        c, r = row.compiled, row.compiled.resources
        image = f"{c.target.kind} {c.target.option.split('=')[1]}"
        seconds = f"{c.seconds:.1f}" + (" (cached)" if row.was_cached else "")  # cached: its first compile's
        if c.target.kind == "cubin":
            figures = f"{r.registers} | {r.spill_stores} / {r.spill_loads} | {r.stack_bytes} | {r.static_smem}"
        else:
            figures = "— | — | — | —"  # PTX: the driver's JIT allocates registers on the device
        lines.append(f"| {row.kernel} | sm_{row.arch} | {image} | {len(c.image)} | {figures} | {seconds} |")
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m vmamba2d.ops.precompile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=list(DEFAULT_ARCHS),
                        help="GPU archs as compute capability x 10 (default: %(default)s)")
    parser.add_argument("--kernels", nargs="+", default=None, metavar="NAME",
                        help="kernel table entries (default: all %(const)s)".replace("%(const)s", str(len(KERNELS))))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles (default: CPUs)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help=f"cache folder (default: ${kernel_cache.CACHE_ENV} or ~/.cache/vmamba2d)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        specs = [kernel_spec(name) for name in args.kernels] if args.kernels else list(KERNELS.values())
        toolchain = nvrtc.find_toolchain()
        start = time.perf_counter()
        rows = precompile(specs, args.arch, args.jobs, args.cache_dir)
    except (KeyError, ValueError, nvrtc.NvrtcUnavailable) as err:
        print(f"vmamba2d.ops.precompile: {err.args[0] if err.args else err}", file=sys.stderr)
        return 2
    folder = kernel_cache.cache_dir(args.cache_dir)
    print(f"NVRTC {toolchain.version_text}, CUDA headers {toolchain.cuda_include}, cache {folder}; "
          f"{len(rows)} kernels in {time.perf_counter() - start:.1f} s with {args.jobs} jobs\n")
    print(format_table(rows))
    failed = [row for row in rows if row.compiled is None]
    for row in failed:
        print(f"\n{row.kernel} for sm_{row.arch}: {row.error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
