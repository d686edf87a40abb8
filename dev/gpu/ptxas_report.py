#!/usr/bin/env python
"""ptxas resource report of every CUDA kernel instantiation, checked against budgets.

Compiles each ``csrc/cuda/*.cu`` device-only (``nvcc -cubin -arch=sm_XX -Xptxas -v``) for every
default build arch that the installed nvcc supports (vmamba2d/_cuda_archs.py), with the flags the
extension build uses. Kernels are discovered from ptxas's output (no names are hard-coded); each
(kernel instantiation, arch) gets a row: registers, spill stores / loads, stack frame, static
shared memory, barriers. Needs nvcc, no GPU.

Budgets (a kernel's role is read off its demangled name: "forward"/"fwd", "backward"/"bwd"):

    role           registers  static smem  stack frame  spills
    forward        <= 80      <= 32 KiB    0 bytes      0 bytes
    backward       <= 255     <= 32 KiB    0 bytes      0 bytes
    other          <= 64      <= 32 KiB    0 bytes      0 bytes
    route forward  <= 102     <= 32 KiB    0 bytes      0 bytes   (the four-route op's route variants)
    forward on sm_70 / sm_72 / sm_86 .. sm_89
                   <= 168     <= 32 KiB    0 bytes      0 bytes   (every forward variant there)
    forward on sm_75
                   <= 255     <= 32 KiB    0 bytes      0 bytes

Why: the scan is memory-bound, so occupancy (registers per thread) matters for the forward (80
registers let six 128-thread blocks, 24 warps, share an SM: __launch_bounds__(128, 6)); the
backward carries more live state per cell and may use the whole 255-register file; on the archs
whose shared memory holds fewer 4-channel forward blocks (32 KiB each: three on sm_70 / sm_72 /
sm_86 .. sm_89, two on sm_75) the forward is compiled for those blocks
(__launch_bounds__(128, 3) or (128, 2), forward_min_blocks_per_sm in csrc/cuda/scan2d_common.h); any stack
frame or spill means local-memory traffic (an array indexed at run time, or register pressure).
Dynamic shared memory is sized at launch and is not in ptxas's report.

    python dev/gpu/ptxas_report.py                     # all archs, prints the table, exit 1 on a breach
    python dev/gpu/ptxas_report.py --archs 9.0 --out out/ptxas.md
    python dev/gpu/ptxas_report.py --binary vmamba2d/_C_cuda*.so   # the kernels as built, no compile

``--binary`` reads the same figures off a built library (``cuobjdump -res-usage``, well under a
second, against minutes of compiling) for the archs of its machine code. cuobjdump gives no spill
counts: a spill goes to the kernel's stack frame, so the zero-stack budget covers spills there.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
CUDA_SOURCES = REPO / "csrc" / "cuda"


@dataclass(frozen=True)
class Budget:
    registers: int
    static_smem_bytes: int
    stack_bytes: int = 0
    spill_bytes: int = 0


BUDGETS = {
    "forward": Budget(registers=80, static_smem_bytes=32 * 1024),
    "backward": Budget(registers=255, static_smem_bytes=32 * 1024),
    "other": Budget(registers=64, static_smem_bytes=32 * 1024),
    # __launch_bounds__(128, 5): its per-cell route addressing keeps a few more registers live.
    "route forward": Budget(registers=102, static_smem_bytes=32 * 1024),
    "forward on sm_70 / sm_72 / sm_86 .. sm_89": Budget(registers=168, static_smem_bytes=32 * 1024),
    "forward on sm_75": Budget(registers=255, static_smem_bytes=32 * 1024),
}
# The archs of the last two rows (forward_min_blocks_per_sm: three blocks per SM, or two on sm_75).
REGISTER_CARRY_ARCHS = {"7.0": "forward on sm_70 / sm_72 / sm_86 .. sm_89",
                        "7.2": "forward on sm_70 / sm_72 / sm_86 .. sm_89",
                        "7.5": "forward on sm_75",
                        **{f"8.{minor}": "forward on sm_70 / sm_72 / sm_86 .. sm_89" for minor in (6, 7, 8, 9)}}


def _load_cuda_archs():
    spec = importlib.util.spec_from_file_location("vmamba2d_cuda_archs", REPO / "vmamba2d" / "_cuda_archs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


cuda_archs = _load_cuda_archs()


@dataclass
class KernelResources:
    """ptxas's figures for one kernel (or non-inlined device function) on one arch."""

    source: str
    arch: str
    mangled: str
    entry: bool = False
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    static_smem: int = 0
    barriers: int = 0
    name: str = ""
    problems: list[str] = field(default_factory=list)
    spills_known: bool = True  # False where read off a built library (no spill counts there)

    @property
    def role(self) -> str:
        lowered = self.name.lower()
        if "backward" in lowered or "bwd" in lowered:
            return "backward"
        if "forward" in lowered or "fwd" in lowered:
            return "forward"
        return "other"

    @property
    def budget_role(self) -> str:
        """The BUDGETS row of the kernel: its role, "route forward" for the route variants' forward,
        or the row of its arch for every forward compiled for a register-carry arch."""
        if self.role == "forward" and self.arch in REGISTER_CARRY_ARCHS:
            return REGISTER_CARRY_ARCHS[self.arch]
        route = any(tag in self.name or tag in self.mangled
                    for tag in ("kRoute", "kOneStateRoute", "VariantE2E", "VariantE3E"))
        return "route forward" if route and self.role == "forward" else self.role


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def parse_ptxas(text: str, source: str, arch: str) -> list[KernelResources]:
    """The kernels and functions of one ``nvcc -Xptxas -v`` run's output, in order of appearance."""
    found: dict[str, KernelResources] = {}
    current: Optional[KernelResources] = None

    def get(name: str) -> KernelResources:
        if name not in found:
            found[name] = KernelResources(source=source, arch=arch, mangled=name)
        return found[name]

    for line in text.splitlines():
        if match := _ENTRY.search(line):
            current = get(match.group(1))
            current.entry = True
        elif match := _PROPERTIES.search(line):
            current = get(match.group(1))
        elif (match := _FRAME.search(line)) and current is not None:
            current.stack_bytes, current.spill_stores, current.spill_loads = map(int, match.groups())
        elif (match := _USED.search(line)) and current is not None:
            current.registers = int(match.group(1))
            if smem := _SMEM.search(line):
                current.static_smem = int(smem.group(1))
            if barriers := _BARRIERS.search(line):
                current.barriers = int(barriers.group(1))
    return list(found.values())


_RES_ARCH = re.compile(r"^arch = (sm_\w+)")
_RES_FUNCTION = re.compile(r"^\s*Function (\S+?):?\s*$")
_RES_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def parse_res_usage(text: str, source: str) -> list[KernelResources]:
    """The kernels of ``cuobjdump -res-usage LIBRARY``, one per (kernel, arch) of its machine code
    (its PTX carries no resources); a kernel's stack frame is the larger of STACK and LOCAL."""
    kernels: list[KernelResources] = []
    arch: Optional[str] = None
    machine_code = False
    current: Optional[KernelResources] = None
    for line in text.splitlines():
        if line.startswith("Fatbin "):
            machine_code, arch, current = line.startswith("Fatbin elf code"), None, None
        elif match := _RES_ARCH.match(line):
            arch = cuda_archs.arch_from_compute_name(match.group(1))
        elif (match := _RES_FUNCTION.match(line)) and machine_code and arch is not None:
            current = KernelResources(source=source, arch=arch, mangled=match.group(1), entry=True,
                                      spills_known=False)
            kernels.append(current)
        elif (match := _RES_USAGE.search(line)) and current is not None:
            registers, stack, shared, local = map(int, match.groups())
            current.registers, current.stack_bytes, current.static_smem = registers, max(stack, local), shared
            current = None
    return kernels


# Names of csrc/cuda's `enum class Variant` values, in their order (demangled as "(Variant)<n>").
KERNEL_VARIANTS = ("kGeneral", "kOneStateSequential", "kRoute", "kOneStateRoute")


def readable_names(mangled: list[str]) -> dict[str, str]:
    """Demangled names without the argument list and the project's namespaces (c++filt)."""
    demangler = shutil.which("cu++filt") or shutil.which("c++filt")
    plain = mangled
    if demangler and mangled:
        result = subprocess.run([demangler], input="\n".join(mangled), capture_output=True, text=True)
        if result.returncode == 0 and len(result.stdout.splitlines()) == len(mangled):
            plain = result.stdout.splitlines()
    names = {}
    for raw, name in zip(mangled, plain):
        for prefix in ("vmamba2d::scan2d::", "vmamba2d::", "(anonymous namespace)::"):
            name = name.replace(prefix, "")
        for number, variant in enumerate(KERNEL_VARIANTS):  # the kernels' Variant template argument
            name = name.replace(f"(Variant){number}", variant)
        if name.endswith(")"):  # drop the parameter list: the last balanced (...) group
            depth = 0
            for index in range(len(name) - 1, -1, -1):
                depth += {")": 1, "(": -1}.get(name[index], 0)
                if depth == 0:
                    name = name[:index]
                    break
        names[raw] = name
    return names


# What the nvcc build (opt-in, for the GPU comparison with the NVRTC path) may spill where the NVRTC
# images, compiled one instantiation per program, do not: (kernel, arch) -> (spill bytes, stack
# bytes). nvcc compiles every instantiation of a .cu file in one program, and there ptxas spills in
# this kernel since the shared views became 32-bit offsets (benchmarks/nvrtc_shared_addressing.md).
KNOWN_NVCC_SPILLS = {
    ("void scan2d_forward_kernel<float, kOneStateSequential>", "8.6"): (64, 40),
}


def check_budgets(kernel: KernelResources) -> list[str]:
    """Budget breaches of one kernel (empty when it is within all of them)."""
    budget = BUDGETS[kernel.budget_role]
    spill_bytes, stack_bytes = budget.spill_bytes, budget.stack_bytes
    if kernel.source != "nvrtc":
        spill_bytes, stack_bytes = KNOWN_NVCC_SPILLS.get((kernel.name, kernel.arch), (spill_bytes, stack_bytes))
    problems = []
    if kernel.spill_stores + kernel.spill_loads > spill_bytes:
        problems.append(f"spills {kernel.spill_stores}+{kernel.spill_loads} B")
    if kernel.stack_bytes > stack_bytes:
        problems.append(f"stack frame {kernel.stack_bytes} B > {stack_bytes}")
    if kernel.entry and kernel.registers > budget.registers:
        problems.append(f"{kernel.registers} registers > {budget.registers}")
    if kernel.static_smem > budget.static_smem_bytes:
        problems.append(f"static smem {kernel.static_smem} B > {budget.static_smem_bytes}")
    return problems


def _torch_compile_flags() -> list[str]:
    """torch's include dirs and common nvcc defines, as the extension build uses (none without torch)."""
    try:
        from torch.utils.cpp_extension import COMMON_NVCC_FLAGS, include_paths
    except ImportError:
        return []
    return [f"-I{path}" for path in include_paths()] + list(COMMON_NVCC_FLAGS)


def compile_command(nvcc: str, source: Path, arch: str, output: Path, extra: list[str]) -> list[str]:
    return [nvcc, "-cubin", f"-arch={cuda_archs.sm_name(arch)}", *cuda_archs.NVCC_FLAGS, *extra,
            "-Xptxas", "-v", f"-I{source.parent}", "-o", str(output), str(source)]


@dataclass
class CompileResult:
    source: str
    arch: str
    ok: bool
    log: str
    kernels: list[KernelResources]


def compile_one(nvcc: str, source: Path, arch: str, extra: list[str], workdir: Path) -> CompileResult:
    output = workdir / f"{source.stem}.{cuda_archs.sm_name(arch)}.cubin"
    run = subprocess.run(compile_command(nvcc, source, arch, output, extra), capture_output=True, text=True)
    log = run.stdout + run.stderr
    kernels = parse_ptxas(log, source.name, arch) if run.returncode == 0 else []
    return CompileResult(source.name, arch, run.returncode == 0, log, kernels)


def compile_all(nvcc: str, sources: list[Path], archs: list[str], jobs: int) -> list[CompileResult]:
    """Every (source, arch) compiled, ``jobs`` nvcc processes at a time; results in input order."""
    extra = _torch_compile_flags()
    with tempfile.TemporaryDirectory(prefix="ptxas-report-") as tmp:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(compile_one, nvcc, source, arch, extra, Path(tmp))
                       for source in sources for arch in archs]
            results = [future.result() for future in futures]
    kernels = [k for r in results for k in r.kernels]
    names = readable_names(sorted({k.mangled for k in kernels}))
    for kernel in kernels:
        kernel.name = names.get(kernel.mangled, kernel.mangled)
        kernel.problems = check_budgets(kernel)
    return results


def find_cuda_tool(name: str, nvcc: Optional[str]) -> Optional[str]:
    """A CUDA binutil (``cuobjdump``, ``nvdisasm``) from PATH, the toolkit of CUDA_HOME / CUDA_PATH,
    /usr/local/cuda or nvcc's folder, or the copy Triton ships."""
    candidates = [shutil.which(name)]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / name))
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent / name))
    triton = importlib.util.find_spec("triton")
    if triton is not None and triton.submodule_search_locations:
        for location in triton.submodule_search_locations:
            candidates.append(str(Path(location) / "backends" / "nvidia" / "bin" / name))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def read_binary(cuobjdump: str, library: Path, archs: Optional[list[str]]) -> list[CompileResult]:
    """The kernels of a built library per arch of its machine code (``archs``: those that must be
    there; a missing one is a failed result), with names and budget checks as compile_all's."""
    run = subprocess.run([cuobjdump, "-res-usage", str(library)], capture_output=True, text=True)
    if run.returncode != 0:
        return [CompileResult(library.name, archs[0] if archs else "0.0", False, run.stdout + run.stderr, [])]
    kernels = parse_res_usage(run.stdout, library.name)
    names = readable_names(sorted({k.mangled for k in kernels}))
    for kernel in kernels:
        kernel.name = names.get(kernel.mangled, kernel.mangled)
        kernel.problems = check_budgets(kernel)
    built = sorted({k.arch for k in kernels}, key=lambda a: tuple(map(int, a.split("."))))
    results = [CompileResult(library.name, arch, True, "", [k for k in kernels if k.arch == arch]) for arch in built]
    for arch in archs or []:
        if arch not in built:
            results.append(CompileResult(library.name, arch, False,
                                         f"no {cuda_archs.sm_name(arch)} machine code in {library}", []))
    return results


def default_archs(nvcc: str) -> tuple[list[str], str]:
    """The default build archs nvcc supports, and a note on those it dropped."""
    choice = cuda_archs.default_arch_choice(cuda_archs.nvcc_supported_archs(nvcc), f"nvcc {cuda_archs.nvcc_release(nvcc)}")
    note = f"dropped {', '.join(choice.dropped)}: {choice.reason}" if choice.dropped else ""
    return list(choice.archs), note


def format_table(results: list[CompileResult]) -> str:
    """Markdown table, one row per (kernel instantiation, arch), sorted by file, kernel, arch."""
    lines = [
        "| source | kernel | arch | regs | spill st/ld B | stack B | static smem B | barriers | budget (regs) | status |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        if not result.ok:
            error = "COMPILE ERROR" if result.source.endswith(".cu") else "NOT READABLE / NOT BUILT"
            lines.append(f"| {result.source} | — | {cuda_archs.sm_name(result.arch)} | | | | | | | {error} |")
    shown = [k for r in results for k in r.kernels if k.entry or k.problems]  # helpers only when they fail
    arch_order = lambda k: tuple(int(x) for x in re.findall(r"\d+", k.arch))  # noqa: E731
    for k in sorted(shown, key=lambda k: (k.source, k.name, arch_order(k))):
        status = "ok" if not k.problems else "FAIL: " + "; ".join(k.problems)
        budget = BUDGETS[k.budget_role].registers if k.entry else "—"
        lines.append(
            f"| {k.source} | `{k.name}` | {cuda_archs.sm_name(k.arch)} | {k.registers} | "
            f"{f'{k.spill_stores}/{k.spill_loads}' if k.spills_known else 'n/a'} | {k.stack_bytes} | "
            f"{k.static_smem} | {k.barriers if k.spills_known else 'n/a'} | "
            f"{budget} ({k.budget_role}) | {status} |"
        )
    return "\n".join(lines)


def format_budgets() -> str:
    rows = ["| role | registers | static smem | stack frame | spills |", "|---|---:|---:|---:|---:|"]
    for role, b in BUDGETS.items():
        rows.append(f"| {role} | <= {b.registers} | <= {b.static_smem_bytes // 1024} KiB | "
                    f"<= {b.stack_bytes} B | <= {b.spill_bytes} B |")
    return "\n".join(rows)


def failures(results: list[CompileResult]) -> list[str]:
    """One line per compile error or budget breach."""
    lines = []
    for result in results:
        if not result.ok:
            tail = "\n    ".join(result.log.strip().splitlines()[-15:])
            what = "compile error" if result.source.endswith(".cu") else "no machine code read"
            lines.append(f"{result.source} ({cuda_archs.sm_name(result.arch)}): {what}\n    {tail}")
        elif not any(k.entry for k in result.kernels):
            continue  # a .cu with host code only
        lines += [f"{k.source} ({cuda_archs.sm_name(k.arch)}) {k.name}: {'; '.join(k.problems)}"
                  for k in result.kernels if k.problems]
    return lines


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", type=Path, default=CUDA_SOURCES, help="folder of .cu files")
    parser.add_argument("--archs", nargs="+", help="e.g. 8.0 9.0 (default: the default build archs nvcc supports)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel nvcc processes")
    parser.add_argument("--nvcc", default=shutil.which("nvcc"), help="nvcc to use (default: the one on PATH)")
    parser.add_argument("--binary", type=Path,
                        help="read a built library's kernels (cuobjdump -res-usage) instead of compiling")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    return parser.parse_args(argv)


def _run(args: argparse.Namespace) -> Optional[tuple[list[CompileResult], str, str]]:
    """The results, the summary's opening and the report's "how" line; None (after an error message)
    when a tool or input is missing."""
    start = time.perf_counter()
    if args.binary:
        cuobjdump = find_cuda_tool("cuobjdump", args.nvcc)
        if cuobjdump is None:
            print("ptxas_report: no cuobjdump (CUDA toolkit binutils or Triton's copy) found", file=sys.stderr)
            return None
        if not args.binary.is_file():
            print(f"ptxas_report: --binary {args.binary}: no such file", file=sys.stderr)
            return None
        results = read_binary(cuobjdump, args.binary, args.archs)
        archs = sorted({r.arch for r in results}, key=lambda a: tuple(map(int, a.split("."))))
        opening = (f"{sum(k.entry for r in results for k in r.kernels)} kernels x arch in {args.binary.name}, "
                   f"archs {', '.join(cuda_archs.sm_name(a) for a in archs)}; "
                   f"{time.perf_counter() - start:.1f} s")
        return results, opening, f"read off `{args.binary.name}` by `cuobjdump -res-usage` (no spill counts: stack 0 means none)"
    if not args.nvcc:
        print("ptxas_report: no nvcc on PATH (pass --nvcc)", file=sys.stderr)
        return None
    sources = sorted(args.sources.glob("*.cu"))
    if not sources:
        print(f"ptxas_report: no .cu files under {args.sources}", file=sys.stderr)
        return None
    archs, dropped_note = (args.archs, "") if args.archs else default_archs(args.nvcc)
    results = compile_all(args.nvcc, sources, archs, args.jobs)
    opening = (f"{sum(k.entry for r in results for k in r.kernels)} kernel instantiations x arch from "
               f"{len(sources)} files, archs {', '.join(cuda_archs.sm_name(a) for a in archs)}"
               + (f" ({dropped_note})" if dropped_note else "")
               + f"; {time.perf_counter() - start:.1f} s with {args.jobs} parallel nvcc")
    how = (f"nvcc {cuda_archs.nvcc_release(args.nvcc)}; flags: `{' '.join(cuda_archs.NVCC_FLAGS)}` + torch's "
           "include dirs and defines; `-cubin -arch=sm_XX -Xptxas -v`")
    return results, opening, how


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    run = _run(args)
    if run is None:
        return 2
    results, opening, how = run
    problems = failures(results)
    summary = opening + "; " + ("all within budget" if not problems else f"{len(problems)} problem(s)")
    table = format_table(results)
    print(table)
    print()
    print(summary)
    for line in problems:
        print("FAIL", line)
    if args.out:
        header = [
            "# ptxas resource report (CUDA scan kernels)", "",
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            f"- {how}",
            f"- {summary}", "", "Budgets:", "", format_budgets(), "", table, "",
        ]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(header + [f"- FAIL {line}" for line in problems]) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
