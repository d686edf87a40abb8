#!/usr/bin/env python3
"""Nsight Compute profile of the kernels the model runs on the NVRTC path: where their time goes.

The H200 run measured the four-route forward (one launch of ``vmamba2d_rows_cross_forward``) at 21%
(fp32) / 11% (bf16) of the copy bandwidth at 56 x 56 where the static estimate said ~85%, and the
training step at 8.6-8.9 ms, most of it v3's backward kernels. Only hardware counters say why.

One command on a fresh GPU machine (no nvcc build needed), within ``--budget-s``:

1. prepare: ``python -m vmamba2d.ops.precompile`` compiles the NVRTC kernels of the cases' dtypes
   (v3 forward / backward / carry scan, the four-route entries of the model widths) in parallel
   while this process builds the NVRTC host driver (about a minute the first time on a machine);
2. per case (SIDE:DTYPE, a vmamba2d_tiny stage at 224): a child runs under ``ncu`` with
   ``VMAMBA2D_CUDA_KERNELS=nvrtc``. It calls ``cross_selective_scan_2d`` (four cross routes,
   ``backend="cuda"``) on ``benchmarks/bench_cross_scan.py``'s ``make_inputs`` once without and
   once with autograd (warm-up: compiles, tuning), then, between ``cudaProfilerStart`` / ``Stop``
   (``--profile-from-start off``), one forward under ``no_grad`` (phase ``fwd``) and one training
   step: its forward (phase ``fwd (autograd)``) and its backward (phase ``bwd``, v3's kernels).
   Every NVRTC launch goes through the kernel launcher, which the child wraps to log each launch's
   table entry and phase; the log labels ncu's rows (same order, same function names). ncu collects the sections SpeedOfLight, Occupancy, LaunchStats, WarpStateStats,
   SchedulerStats and MemoryWorkloadAnalysis plus L1 / L2 sector counts, DRAM bytes and the
   warp-stall ratios for every launch of a kernel matching :data:`KERNEL_FILTER`;
3. source: one more child profiles the four-route kernel of ``--source-case`` (forward only) with
   SourceCounters into a report, read back with ``--page source``: the top SASS instructions by
   warp-stall samples.

The report (``--out``) is rewritten after each step, so a run cut off keeps what it measured: one
row per launch (duration, throughput, occupancy, bytes and sectors per map cell, instructions per
cell, the largest stall reasons), totals per case and phase beside the bytes the forward must move,
and the SASS table. ``--csv-dir`` keeps ncu's raw csv, one file per case plus the source page.

    python3 dev/gpu/gpu_profile.py --out $OUT/gpu-profile.md --csv-dir $OUT/ncu
    python3 dev/gpu/gpu_profile.py --cases 56:bf16 --batch 64 --source-case none

Exit status: 0 profiled, 1 a step failed (the report says which), 2 nothing could be profiled (no
ncu, no GPU, no NVRTC path).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parents[1]
KERNELS_ENV = "VMAMBA2D_CUDA_KERNELS"
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats", "MemoryWorkloadAnalysis")
SOURCE_SECTIONS = ("SourceCounters", "WarpStateStats")
# The kernels of the NVRTC path (vmamba2d/ops/compiled/cuda_kernels.py, rows_backward_launch.py): the
# extern "C" v4 entries vmamba2d_rows_cross_forward, vmamba2d_rows_forward(_save), vmamba2d_rows_backward,
# vmamba2d_planes_forward and v3's templates vmamba2d::scan2d::scan2d_{forward,backward,carry_scan}_kernel
# (mangled _ZN8vmamba2d6scan2d21scan2d_forward_kernel...). Unanchored, so it matches the function
# name, the demangled and the mangled name alike; torch's own kernels never match.
KERNEL_FILTER = "regex:vmamba2d_(rows|planes)_|scan2d_(forward|backward|carry_scan)_kernel"
CROSS_KERNEL_FILTER = "regex:vmamba2d_rows_cross_forward"
DEFAULT_CASES = ("56:bf16", "56:fp32", "14:bf16")
DEFAULT_SOURCE_CASE = "56:bf16"
DTYPE_NAMES = ("fp32", "bf16", "fp16")
PHASES = ("fwd", "bwd")
DEFAULT_BATCH = 128
DEFAULT_BUDGET_S = 420.0
PREPARE_CAP_S = 150.0
CASE_CAP_S = 100.0
SOURCE_CAP_S = 75.0
MIN_STEP_S = 30.0  # a step with less time left than this is skipped, not started
TOP_STALLS = 4
TOP_SASS = 10
SECTOR_BYTES = 32
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "barrier", "wait", "mio_throttle", "math_pipe_throttle",
                 "lg_throttle", "not_selected", "no_instruction", "dispatch_stall", "branch_resolving", "membar",
                 "drain", "tex_throttle", "imc_miss", "sleeping", "misc")
STALL_METRICS = tuple(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS)
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(?P<reason>[a-z_]+)_per_issue_active\.ratio$")
# Requested by name: the sections do not all report them.
EXTRA_METRICS = (
    "gpu__time_duration.sum", "launch__registers_per_thread", "launch__waves_per_multiprocessor",
    "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct", "l1tex__t_sector_hit_rate.pct",
    "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "smsp__inst_executed.sum", "smsp__average_warp_latency_per_inst_issued.ratio",
)
# ncu's messages when the counters cannot be read at all (then no later case can be profiled either).
_PROFILER_UNUSABLE = re.compile(r"ERR_NVGPUCTRPERM|LibraryNotLoaded|Failed to initialize the profiler|"
                                r"[Pp]rofiling is not supported")
_METRIC_REJECTED = re.compile(r"==ERROR==.*metric", re.IGNORECASE)
# Scale of ncu's units to bytes / seconds (``--print-units base`` gives byte and nsecond; others in case).
_UNIT_SCALE = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
               "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
               "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class Case:
    """One profiled call: a vmamba2d_tiny stage (map side; channels from bench_cross_scan) in a dtype."""

    side: int
    dtype: str

    @property
    def label(self) -> str:
        return f"{self.side}x{self.side} {self.dtype}"

    @property
    def slug(self) -> str:
        return f"{self.side}-{self.dtype}"


def _cross_bench():
    """benchmarks/bench_cross_scan.py as a module (its stages and make_inputs)."""
    folder = str(REPO / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import bench_cross_scan

    return bench_cross_scan


def stage_channels() -> dict[int, int]:
    """Map side -> channels of vmamba2d_tiny's stages at 224 (bench_cross_scan.TINY_STAGES)."""
    return dict(_cross_bench().TINY_STAGES)


def parse_case(text: str) -> Case:
    """"56:bf16" -> Case(56, "bf16"); the side picks the stage (benchmarks/bench_cross_scan.py)."""
    side, _, dtype = text.partition(":")
    sides = stage_channels()
    if not side.isdigit() or int(side) not in sides or dtype not in DTYPE_NAMES:
        raise argparse.ArgumentTypeError(
            f"--cases: expected SIDE:DTYPE with SIDE in {sorted(sides)} and DTYPE in {list(DTYPE_NAMES)}, got {text!r}")
    return Case(int(side), dtype)


def parse_phases(text: str) -> tuple[str, ...]:
    """"fwd,bwd" -> ("fwd", "bwd"): the profiled ranges of a worker."""
    phases = tuple(p for p in text.split(",") if p)
    if not phases or any(p not in PHASES for p in phases):
        raise argparse.ArgumentTypeError(f"--phases: expected a comma-separated subset of {PHASES}, got {text!r}")
    return phases


# ------------------------------------------------------------------------------------------------
# the profiled process
# ------------------------------------------------------------------------------------------------
class LaunchLog:
    """JSON lines of the launches made while a phase is set (one line each, flushed as written)."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("w")
        self.phase: Optional[str] = None
        self.profiled = False  # inside cudaProfilerStart / Stop

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def launch(self, spec, grid: Sequence[int], threads: int, smem: int) -> None:
        if self.phase is not None:
            self.write({"kind": "launch", "phase": self.phase, "profiled": self.profiled, "kernel": spec.name,
                        "symbol": spec.symbol, "grid": list(grid), "threads": threads, "smem": smem})

    @contextlib.contextmanager
    def profiling(self) -> Iterator[None]:
        """The range ncu profiles (--profile-from-start off): cudaProfilerStart ... Stop."""
        import torch

        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        self.profiled = True
        try:
            yield
            torch.cuda.synchronize()
        finally:
            torch.cuda.profiler.stop()
            self.profiled = False

    @contextlib.contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """Log the launches made inside as ``phase``."""
        self.phase = phase
        try:
            yield
        finally:
            self.phase = None


def _record_launches(launcher, log: LaunchLog) -> None:
    """Wrap the NVRTC kernel launcher (cuda_launch.KernelLauncher) of this process so every launch --
    the v4 entries' and the host driver's v3 ones, which call it back -- is logged."""
    launch = launcher.launch

    def recording(spec, grid, threads, smem, args):
        log.launch(spec, grid, threads, smem)
        return launch(spec, grid, threads, smem, args)

    launcher.launch = recording


def run_worker(case: Case, batch: int, phases: tuple[str, ...], log_path: Path) -> None:
    """The launches ncu profiles; see the module docstring."""
    import torch

    from vmamba2d.ops import cross_selective_scan_2d, route_set
    from vmamba2d.ops.compiled import extensions

    bench = _cross_bench()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[case.dtype]
    dim = stage_channels()[case.side]
    inputs = bench.make_inputs(batch, dim, case.side, "cuda", dtype)
    routes = route_set("cross", "2d")
    module = extensions.cuda_extension()
    if extensions.extension_source("cuda") != "nvrtc":
        raise SystemExit(f"gpu_profile worker: not on the NVRTC path ({KERNELS_ENV}="
                         f"{os.environ.get(KERNELS_ENV)!r}, source {extensions.extension_source('cuda')!r}, "
                         f"{extensions.failure_reason('cuda')})")
    log = LaunchLog(log_path)
    y_bytes = inputs["u"].numel() * inputs["u"].element_size()
    log.write({"kind": "info", "batch": batch, "dim": dim, "side": case.side, "dtype": case.dtype,
               "cells": inputs["u"].numel(), "torch": torch.__version__,
               "fwd_bytes": sum(t.numel() * t.element_size() for t in inputs.values()) + y_bytes})
    _record_launches(module.launcher, log)

    def forward(x: dict) -> torch.Tensor:
        return cross_selective_scan_2d(**x, routes=routes, backend="cuda")

    leaves = {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    grad = torch.randn(inputs["u"].shape, device="cuda", dtype=dtype)
    start = time.perf_counter()
    with torch.no_grad():  # warm-up: first-use compiles, module loads, the tuner's choice
        forward(inputs)
    if "bwd" in phases:
        forward(leaves).backward(grad)
    torch.cuda.synchronize()
    log.write({"kind": "warmup", "warmup_s": time.perf_counter() - start})
    for leaf in leaves.values():
        leaf.grad = None
    with log.profiling():
        if "fwd" in phases:
            with log.during("fwd"), torch.no_grad():
                forward(inputs)
        if "bwd" in phases:  # one training step: its forward, then the backward
            with log.during("fwd (autograd)"):
                y = forward(leaves)
            with log.during("bwd"):
                y.backward(grad)


# ------------------------------------------------------------------------------------------------
# reading what the worker and ncu wrote
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Logged:
    """One launch of the worker's log."""

    phase: str
    profiled: bool
    kernel: str  # the kernel table entry (cuda_kernels.KernelSpec.name)
    symbol: str


def read_launch_log(text: str) -> tuple[dict, list[Logged]]:
    """(info, launches) of a worker's log; a torn last line (a killed worker) is skipped."""
    info: dict = {}
    launches = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("kind") in ("info", "warmup"):
            info.update({k: v for k, v in record.items() if k != "kind"})
        elif record.get("kind") == "launch":
            launches.append(Logged(record["phase"], bool(record["profiled"]), record["kernel"], record["symbol"]))
    return info, launches


def _raw_csv_table(text: str) -> tuple[list[str], dict[str, str], list[list[str]]]:
    """(header, units by column, launch rows) of ``ncu --csv --page raw``; lines before the header
    (ncu's own messages, the program's output) are skipped, the units row (first cell empty) after
    it is read apart."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return [], {}, []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    units = {}
    if body and body[0] and not body[0][0].strip():
        units = dict(zip(header, body[0]))
        body = body[1:]
    return header, units, [row for row in body if len(row) == len(header)]


def parse_raw_csv(text: str) -> list[dict[str, str]]:
    """Rows of ``ncu --csv --page raw`` (one per profiled launch), keyed by column name."""
    header, _, body = _raw_csv_table(text)
    return [dict(zip(header, row)) for row in body]


def raw_csv_units(text: str) -> dict[str, str]:
    """The unit of each column of ``ncu --csv --page raw`` ("byte", "nsecond", "%", ...)."""
    return _raw_csv_table(text)[1]


def _number(text: Optional[str]) -> Optional[float]:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def metric_value(row: dict[str, str], units: dict[str, str], metric: str) -> Optional[float]:
    """A launch's metric as a number, byte and time units scaled to bytes and seconds; None when
    absent or not a number."""
    value = _number(row.get(metric))
    if value is None:
        return None
    return value * _UNIT_SCALE.get(units.get(metric, "").strip().lower(), 1.0)


def top_stalls(row: dict[str, str], count: int = TOP_STALLS) -> list[tuple[str, float]]:
    """The ``count`` largest stall reasons of a launch: (reason, warps per issue-active cycle)."""
    stalls = []
    for name, value in row.items():
        match = _STALL.match(name)
        number = _number(value)
        if match and number is not None and number > 0:
            stalls.append((match.group("reason"), number))
    return sorted(stalls, key=lambda s: -s[1])[:count]


def _strip_bracketed(text: str, opening: str, closing: str) -> str:
    """``text`` without its bracketed parts (nesting counted)."""
    out, depth = [], 0
    for char in text:
        if char == opening:
            depth += 1
        elif char == closing and depth:
            depth -= 1
        elif not depth:
            out.append(char)
    return "".join(out)


def function_name(name: str) -> str:
    """The bare function of a kernel name: "void ns::f<T, (ns::V)1>(ns::P)" -> "f", a C++ name
    expression "ns::f<T, ns::V::k>" -> "f", an extern "C" name -> itself."""
    text = _strip_bracketed(_strip_bracketed(name.strip(), "(", ")"), "<", ">").strip()
    return text.split()[-1].split("::")[-1] if text else ""


def attribute(rows: Sequence[dict[str, str]], logged: Sequence[Logged]) -> tuple[list[Optional[Logged]], str]:
    """The logged launch of each profiled ncu row, in order, and a note where they disagree.

    ncu profiles the launches between cudaProfilerStart / Stop that match the filter, in launch
    order; the log holds every launch of those ranges. Rows are paired in order while the function
    names agree; from the first disagreement on (a launch the filter missed, a cut-off run) rows
    stay unattributed."""
    profiled = [launch for launch in logged if launch.profiled]
    labels: list[Optional[Logged]] = [None] * len(rows)
    agree = 0
    for i, (row, launch) in enumerate(zip(rows, profiled)):
        if function_name(row.get("Kernel Name", "")) != function_name(launch.symbol):
            break
        labels[i] = launch
        agree += 1
    note = ""
    if agree != len(rows) or len(rows) != len(profiled):
        note = (f"{len(rows)} launches profiled, {len(profiled)} logged in the profiled ranges, the first {agree} "
                "paired by function name; the rest are not attributed to a phase")
    return labels, note


# ------------------------------------------------------------------------------------------------
# the source page: SASS instructions by warp-stall samples
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SassLine:
    """One SASS instruction of ncu's source page."""

    address: str
    instruction: str
    samples: float  # warp-stall samples (all samples)
    share: float  # of the kernel's samples, in %
    executed: Optional[float]  # warp-level instructions executed
    reason: str  # the largest per-reason stall column, where the page has them


@dataclass
class SourceGroup:
    """One kernel of ``ncu --page source --csv``: its name, the column header and the SASS rows."""

    kernel: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


def parse_source_csv(text: str) -> list[SourceGroup]:
    """The kernels of ``ncu --import R --page source --csv --print-source sass``: a "Kernel Name"
    row, an "Address" header row, then one row per instruction (address "0x...")."""
    groups: list[SourceGroup] = []
    header: list[str] = []
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            groups.append(SourceGroup(row[1] if len(row) > 1 else ""))
        elif row[0] == "Address":
            header = row
            if groups:
                groups[-1].header = row
        elif row[0].startswith("0x") and groups and len(row) == len(header):
            groups[-1].header = groups[-1].header or header
            groups[-1].rows.append(row)
    return groups


_ALL_SAMPLES = "Warp Stall Sampling (All Samples)"


def top_sass(group: SourceGroup, count: int = TOP_SASS) -> list[SassLine]:
    """The ``count`` SASS instructions of a kernel with the most warp-stall samples (all samples)."""
    header = group.header
    sampled = next((i for i, h in enumerate(header) if h == _ALL_SAMPLES), None)
    if sampled is None:
        sampled = next((i for i, h in enumerate(header) if h.startswith("Warp Stall Sampling")), None)
    if sampled is None or "Source" not in header:
        return []
    text = header.index("Source")
    executed = header.index("Instructions Executed") if "Instructions Executed" in header else None
    reasons = [i for i, h in enumerate(header)
               if "stall" in h.lower() and not h.startswith("Warp Stall Sampling") and i != text]
    total = sum(_number(row[sampled]) or 0.0 for row in group.rows)
    lines = []
    for row in group.rows:
        samples = _number(row[sampled]) or 0.0
        by_reason = sorted(((_number(row[i]) or 0.0, header[i]) for i in reasons), reverse=True)
        reason = f"{by_reason[0][1]} {by_reason[0][0]:.0f}" if by_reason and by_reason[0][0] > 0 else ""
        lines.append(SassLine(row[0], row[text].strip(), samples, 100.0 * samples / total if total else 0.0,
                              _number(row[executed]) if executed is not None else None, reason))
    return sorted(lines, key=lambda line: -line.samples)[:count]


# ------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """One profiled launch: ncu's row with its units, the case, phase and table entry, the map cells."""

    case: str
    phase: str
    kernel: str
    row: dict[str, str]
    units: dict[str, str]
    cells: int

    def value(self, metric: str) -> Optional[float]:
        return metric_value(self.row, self.units, metric)

    def total(self, *metrics: str) -> Optional[float]:
        """The sum of the metrics, None when any is missing."""
        values = [self.value(m) for m in metrics]
        return None if any(v is None for v in values) else sum(values)

    def per_cell(self, amount: Optional[float]) -> Optional[float]:
        return None if amount is None or not self.cells else amount / self.cells


def _ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return None if numerator is None or not denominator else numerator / denominator


def _fmt(value: Optional[float], digits: int = 1, scale: float = 1.0) -> str:
    return "—" if value is None else f"{value * scale:,.{digits}f}"


def short_kernel(name: str) -> str:
    """A ncu kernel name for a table cell: no return type, parameters or namespace; <> escaped."""
    base = re.sub(r"\([^()]*\)$", "", name).replace("void ", "").replace("vmamba2d::scan2d::", "")
    return base.replace("<", "&lt;").replace(">", "&gt;")


def _dram_bytes(launch: Launch) -> Optional[float]:
    return launch.total("dram__bytes_read.sum", "dram__bytes_write.sum")


def _l2_bytes(launch: Launch) -> Optional[float]:
    sectors = launch.total("lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum")
    return None if sectors is None else sectors * SECTOR_BYTES


def _sectors_per_request(launch: Launch, op: str) -> Optional[float]:
    return _ratio(launch.value(f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum"),
                  launch.value(f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum"))


def _instructions_per_cell(launch: Launch) -> Optional[float]:
    warp_instructions = launch.value("smsp__inst_executed.sum")
    return launch.per_cell(None if warp_instructions is None else warp_instructions * 32)


def _occupancy(launch: Launch) -> str:
    return (f"{_fmt(launch.value('sm__warps_active.avg.pct_of_peak_sustained_active'))} / "
            f"{_fmt(launch.value('sm__maximum_warps_per_active_cycle_pct'))}")


def _stalls(launch: Launch) -> str:
    return ", ".join(f"{reason} {value:.1f}" for reason, value in top_stalls(launch.row)) or "—"


# (column title, cell of a launch); the legend under the table says what each means.
LAUNCH_COLUMNS: tuple[tuple[str, Callable[[Launch], str]], ...] = (
    ("case", lambda l: l.case),
    ("phase", lambda l: l.phase),
    ("kernel", lambda l: l.kernel),
    ("grid", lambda l: l.row.get("Grid Size", "?")),
    ("block", lambda l: l.row.get("Block Size", "?")),
    ("regs", lambda l: _fmt(l.value("launch__registers_per_thread"), 0)),
    ("ms", lambda l: _fmt(l.value("gpu__time_duration.sum"), 3, 1e3)),
    ("DRAM % peak", lambda l: _fmt(l.value("dram__throughput.avg.pct_of_peak_sustained_elapsed"))),
    ("SM % peak", lambda l: _fmt(l.value("sm__throughput.avg.pct_of_peak_sustained_elapsed"))),
    ("issue % active", lambda l: _fmt(l.value("smsp__issue_active.avg.pct_of_peak_sustained_active"))),
    ("occupancy % achieved / theoretical", _occupancy),
    ("waves", lambda l: _fmt(l.value("launch__waves_per_multiprocessor"), 2)),
    ("DRAM MB read / written", lambda l: f"{_fmt(l.value('dram__bytes_read.sum'), 1, 1e-6)} / "
                                         f"{_fmt(l.value('dram__bytes_write.sum'), 1, 1e-6)}"),
    ("DRAM B/cell", lambda l: _fmt(l.per_cell(_dram_bytes(l)), 2)),
    ("L2 B/cell", lambda l: _fmt(l.per_cell(_l2_bytes(l)), 2)),
    ("L2 hit %", lambda l: _fmt(l.value("lts__t_sector_hit_rate.pct"))),
    ("L1 hit %", lambda l: _fmt(l.value("l1tex__t_sector_hit_rate.pct"))),
    ("sectors/req ld / st", lambda l: f"{_fmt(_sectors_per_request(l, 'ld'), 2)} / "
                                      f"{_fmt(_sectors_per_request(l, 'st'), 2)}"),
    ("smem bank conflicts", lambda l: _fmt(l.total("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                                                   "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"), 0)),
    ("inst/cell", lambda l: _fmt(_instructions_per_cell(l), 1)),
    ("cycles/inst", lambda l: _fmt(l.value("smsp__average_warp_latency_per_inst_issued.ratio"), 1)),
    (f"top {TOP_STALLS} stalls (warps per issue-active cycle)", _stalls),
)
LEGEND = (
    "- cells: batch x channels x H x W of the map (u's elements); each cell is scanned along 4 routes. "
    "B/cell: bytes per cell; DRAM: dram__bytes_read + write; L2: sectors the L1 read from and wrote "
    "to L2 (lts__t_sectors_srcunit_tex_op_read + write) x 32 B",
    "- sectors/req: global load / store sectors per request in L1 (a warp reading 4 consecutive bytes a "
    "lane: 4, 16 bytes a lane: 16; more means scattered lanes); smem bank conflicts: "
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld + st",
    "- inst/cell: smsp__inst_executed (warp instructions) x 32 / cells, the thread-instruction count of "
    "the static estimates where warps are full; cycles/inst: smsp__average_warp_latency_per_inst_issued",
    "- stalls: smsp__average_warps_issue_stalled_*_per_issue_active.ratio, warps in that state per "
    "issue-active cycle (summed over the reasons: cycles between a warp's instructions)",
)


def launch_row(launch: Launch) -> str:
    return "| " + " | ".join(cell(launch) for _, cell in LAUNCH_COLUMNS) + " |"


def launch_table(launches: Sequence[Launch]) -> str:
    titles = [title for title, _ in LAUNCH_COLUMNS]
    lines = ["| " + " | ".join(titles) + " |", "|" + "|".join("---" for _ in titles) + "|"]
    return "\n".join(lines + [launch_row(launch) for launch in launches])


@dataclass
class CaseResult:
    """What one case's profile gave: its launches, the worker's info and what went wrong."""

    case: Case
    launches: list[Launch] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


def phase_rows(result: CaseResult) -> list[str]:
    """Rows of the per-phase totals of one case: launches, time, DRAM bytes and per cell, and the
    bytes the forward must move (inputs read once, y written once) beside them."""
    rows = []
    for phase in dict.fromkeys(launch.phase for launch in result.launches):
        launches = [launch for launch in result.launches if launch.phase == phase]
        times = [launch.value("gpu__time_duration.sum") for launch in launches]
        dram = [_dram_bytes(launch) for launch in launches]
        seconds = None if None in times else sum(times)
        moved = None if None in dram else sum(dram)
        cells = launches[0].cells
        ideal = result.info.get("fwd_bytes") if phase.startswith("fwd") else None
        rows.append("| " + " | ".join([
            result.case.label, phase, str(len(launches)), _fmt(seconds, 3, 1e3), _fmt(moved, 1, 1e-6),
            _fmt(_ratio(moved, cells), 2), _fmt(_ratio(ideal, cells), 2), _fmt(_ratio(moved, seconds), 0, 1e-9),
            _fmt(_ratio(ideal, seconds), 0, 1e-9)]) + " |")
    return rows


PHASE_TITLES = ("case", "phase", "launches", "ms", "DRAM MB", "DRAM B/cell", "must-move B/cell", "DRAM GB/s",
                "must-move GB/s")


def sass_table(lines: Sequence[SassLine]) -> str:
    head = ["| # | address | instruction | stall samples | % of samples | executed (warps) | largest reason |",
            "|---|---|---|---|---|---|---|"]
    rows = [f"| {i} | {line.address} | `{line.instruction}` | {line.samples:,.0f} | {line.share:.1f} | "
            f"{_fmt(line.executed, 0)} | {line.reason or '—'} |" for i, line in enumerate(lines, 1)]
    return "\n".join(head + rows)


@dataclass
class Report:
    """The markdown report, rewritten whole after each step."""

    header: list[str]
    results: list[CaseResult] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        launches = [launch for result in self.results for launch in result.launches]
        lines = list(self.header) + ["", "## Launches", "", launch_table(launches), "", *LEGEND, "",
                                     "## Per case and phase", "",
                                     "| " + " | ".join(PHASE_TITLES) + " |",
                                     "|" + "|".join("---" for _ in PHASE_TITLES) + "|"]
        lines += [row for result in self.results for row in phase_rows(result)]
        lines += ["", "must-move: the bytes of the forward's inputs (u, delta of 4 routes, B, C, A, D, "
                      "delta_bias) read once and y written once (benchmarks' byte count); GB/s: bytes / summed "
                      "kernel time"]
        if self.source:
            lines += [""] + self.source
        notes = [f"- {result.case.label}: {note}" for result in self.results for note in result.notes]
        notes += [f"- {result.case.label}: ERROR {result.error}" for result in self.results if result.error]
        notes += [f"- {note}" for note in self.notes]
        if notes:
            lines += ["", "## Notes", ""] + notes
        return "\n".join(lines) + "\n"


def write_report(path: Optional[Path], text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a killed run leaves the last whole report)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


# ------------------------------------------------------------------------------------------------
# the plan: budget, commands, kernels to precompile
# ------------------------------------------------------------------------------------------------
class Budget:
    """The seconds a run may take, counted from its creation on ``clock``."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_s = total_s
        self._clock = clock
        self._start = clock()

    def spent(self) -> float:
        return self._clock() - self._start

    def remaining(self) -> float:
        return max(0.0, self.total_s - self.spent())

    def allot(self, cap_s: float, floor_s: float = MIN_STEP_S) -> Optional[float]:
        """The time limit of the next step: its cap, or what is left when less; None when less
        than ``floor_s`` is left (the step is skipped)."""
        left = self.remaining()
        return None if left < floor_s else min(cap_s, left)


def precompile_kernels(dtypes: Sequence[str]) -> list[str]:
    """The NVRTC table entries the four-route op's forward and backward may launch in ``dtypes``:
    the four-route entries of the model widths, v3's forward / backward of every variant, the carry scan."""
    from vmamba2d.ops.compiled.cuda_kernels import KERNELS

    roles = ("rows_cross_forward", "forward", "backward")
    return [name for name in KERNELS
            if name == "carry_scan" or (name.split(".")[0] in roles and name.split(".")[1] in dtypes)]


def child_env(base: Optional[dict] = None) -> dict[str, str]:
    """The children's environment: this checkout importable, the NVRTC kernels, output unbuffered."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[KERNELS_ENV] = "nvrtc"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def worker_command(case: Case, batch: int, phases: Sequence[str], log_path: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", f"{case.side}:{case.dtype}",
            "--batch", str(batch), "--phases", ",".join(phases), "--launch-log", str(log_path)]


def ncu_command(ncu: str, case: Case, batch: int, log_path: Path,
                metrics: Sequence[str] = STALL_METRICS + EXTRA_METRICS, phases: Sequence[str] = PHASES) -> list[str]:
    """ncu over one case's worker: the launches between cudaProfilerStart / Stop matching KERNEL_FILTER,
    the card's clocks as they are, raw csv in base units on stdout."""
    sections = [arg for name in SECTIONS for arg in ("--section", name)]
    return [ncu, "--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off",
            "--kernel-name-base", "function", "--kernel-name", KERNEL_FILTER, *sections,
            *(["--metrics", ",".join(metrics)] if metrics else []), "--csv", "--page", "raw", "--print-units", "base",
            *worker_command(case, batch, phases, log_path)]


def source_commands(ncu: str, case: Case, batch: int, log_path: Path, report: Path) -> tuple[list[str], list[str]]:
    """(collect, read): SourceCounters of the four-route kernel in one forward into ``report``
    (.ncu-rep), then its SASS source page as csv."""
    sections = [arg for name in SOURCE_SECTIONS for arg in ("--section", name)]
    collect = [ncu, "--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off",
               "--kernel-name-base", "function", "--kernel-name", CROSS_KERNEL_FILTER, *sections,
               "--export", str(report.with_suffix("")), "--force-overwrite",
               *worker_command(case, batch, ("fwd",), log_path)]
    read = [ncu, "--import", str(report), "--csv", "--page", "source", "--print-source", "sass"]
    return collect, read


@dataclass(frozen=True)
class Run:
    """A finished child: exit status (None: cut off at its limit), output, seconds."""

    returncode: Optional[int]
    stdout: str
    stderr: str
    seconds: float

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.text.strip().splitlines()[-lines:])


def run_bounded(command: Sequence[str], timeout: float, env: dict[str, str]) -> Run:
    """Run ``command`` in its own process group; at ``timeout`` the whole group (ncu and the
    profiled child) is killed and what it printed is kept."""
    start = time.monotonic()
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               cwd=REPO, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
        return Run(process.returncode, out, err, time.monotonic() - start)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        return Run(None, out, err, time.monotonic() - start)


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------
def case_result(case: Case, run: Run, log_text: str) -> CaseResult:
    """The launches of a case's ncu run, attributed to phases through the worker's log."""
    info, logged = read_launch_log(log_text)
    rows, units = parse_raw_csv(run.stdout), raw_csv_units(run.stdout)
    labels, note = attribute(rows, logged)
    cells = int(info.get("cells", 0))
    result = CaseResult(case, info=info, seconds=run.seconds)
    for row, label in zip(rows, labels):
        kernel = label.kernel if label else short_kernel(row.get("Kernel Name", "?"))
        result.launches.append(Launch(case.label, label.phase if label else "?", kernel, row, units, cells))
    if note:
        result.notes.append(note)
    profiled = [launch.kernel for launch in logged if launch.phase == "fwd"]
    autograd = [launch.kernel for launch in logged if launch.phase == "fwd (autograd)"]
    if autograd:
        same = "the same kernels as" if autograd == profiled else "other kernels than"
        result.notes.append(f"the training step's forward launched {', '.join(autograd)}: {same} the no_grad fwd")
    if run.returncode is None:
        result.error = f"cut off at its limit after {run.seconds:.0f} s (ncu prints its csv at the end)"
    elif run.returncode != 0 or not rows:
        result.error = f"ncu exit {run.returncode}, {len(rows)} launches profiled:\n\n```\n{run.tail()}\n```"
    return result


def profile_case(ncu: str, case: Case, batch: int, timeout: float, work: Path, csv_dir: Optional[Path],
                 metrics: Sequence[str]) -> CaseResult:
    """Run one case under ncu and read what it gave."""
    log_path = work / f"launches-{case.slug}.jsonl"
    run = run_bounded(ncu_command(ncu, case, batch, log_path, metrics), timeout, child_env())
    if csv_dir is not None:
        csv_dir.mkdir(parents=True, exist_ok=True)
        (csv_dir / f"ncu-{case.slug}.csv").write_text(run.stdout)
    log_text = log_path.read_text() if log_path.exists() else ""
    result = case_result(case, run, log_text)
    result.notes.append(f"{len(result.launches)} launches profiled in {run.seconds:.0f} s"
                        + (f" (warm-up {result.info['warmup_s']:.1f} s)" if "warmup_s" in result.info else ""))
    return result


def profile_source(ncu: str, case: Case, batch: int, timeout: float, work: Path,
                   csv_dir: Optional[Path]) -> tuple[list[str], str]:
    """(report lines, error): the top SASS instructions of the four-route kernel by stall samples."""
    report = work / f"source-{case.slug}.ncu-rep"
    collect, read = source_commands(ncu, case, batch, work / f"source-{case.slug}.jsonl", report)
    run = run_bounded(collect, timeout, child_env())
    if run.returncode != 0 or not report.exists():
        return [], f"source counters of {case.label}: ncu exit {run.returncode}:\n\n```\n{run.tail()}\n```"
    page = run_bounded(read, min(60.0, max(15.0, timeout - run.seconds)), child_env())
    if csv_dir is not None:
        csv_dir.mkdir(parents=True, exist_ok=True)
        (csv_dir / f"ncu-source-{case.slug}.csv").write_text(page.stdout)
    groups = [g for g in parse_source_csv(page.stdout) if g.rows]
    if page.returncode != 0 or not groups:
        return [], f"source page of {case.label}: ncu exit {page.returncode}:\n\n```\n{page.tail()}\n```"
    group = groups[0]
    lines = top_sass(group)
    if not lines:
        return [], f"source page of {case.label}: no warp-stall sampling column in {group.header}"
    return [f"## Top {TOP_SASS} SASS instructions by warp-stall samples: {short_kernel(group.kernel)}, "
            f"{case.label}, one forward (SourceCounters, {run.seconds:.0f} s)", "",
            sass_table(lines), "",
            f"{len(group.rows)} SASS instructions; these {len(lines)} hold "
            f"{sum(line.share for line in lines):.1f}% of the kernel's warp-stall samples"], ""


def _git_commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO,
                              timeout=10)
        return done.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _ncu_version(ncu: str) -> str:
    try:
        done = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return next((line.strip() for line in done.stdout.splitlines() if "Version" in line), "unknown")


def _cuda_path_ready() -> str:
    """Why the NVRTC path cannot run here, or "" (builds the NVRTC host driver on first use)."""
    import torch

    from vmamba2d.ops import resolve_backend

    try:
        resolve_backend("cuda", torch.device("cuda"), torch.float32)
    except (RuntimeError, ValueError) as err:
        return f"the cuda backend cannot run on the NVRTC path: {err}"
    return ""


def _start_precompile(names: Sequence[str], arch: int, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "vmamba2d.ops.precompile", "--arch", str(arch), "--jobs",
               str(os.cpu_count() or 1), "--kernels", *names]
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=child_env(), cwd=REPO,
                                start_new_session=True)


def _finish_precompile(process: subprocess.Popen, timeout: float, log: Path) -> str:
    """"" when the precompile ended well, else why (it is killed at ``timeout``)."""
    try:
        code = process.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return f"precompile cut off after {timeout:.0f} s (the cases compile the rest at first use)"
    if code == 0:
        return ""
    tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-8:])
    return f"precompile exit {code} (the cases compile at first use):\n\n```\n{tail}\n```"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", type=parse_case, default=None,
                        help=f"SIDE:DTYPE vmamba2d_tiny stages (default: {' '.join(DEFAULT_CASES)})")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    parser.add_argument("--source-case", default=DEFAULT_SOURCE_CASE,
                        help="SIDE:DTYPE whose four-route kernel gets SourceCounters, or 'none'")
    parser.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="whole run, preparation included; steps that would not fit are skipped")
    parser.add_argument("--case-timeout-s", type=float, default=CASE_CAP_S, help="most one case's ncu run may take")
    parser.add_argument("--source-timeout-s", type=float, default=SOURCE_CAP_S)
    parser.add_argument("--no-precompile", action="store_true", help="compile the kernels at first use instead")
    parser.add_argument("--csv-dir", type=Path, help="also keep ncu's raw csv (one file per case) and the source page")
    parser.add_argument("--out", type=Path, help="also write the markdown report here (rewritten after each step)")
    parser.add_argument("--worker", type=parse_case, help=argparse.SUPPRESS)
    parser.add_argument("--phases", type=parse_phases, default=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--launch-log", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be >= 1")
    args.source_case = None if args.source_case == "none" else parse_case(args.source_case)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    sys.path.insert(0, str(TOOLS))
    sys.path.insert(0, str(REPO))
    args = parse_args(argv)
    if args.worker is not None:
        run_worker(args.worker, args.batch, args.phases, args.launch_log)
        return 0
    budget = Budget(args.budget_s)
    cases = args.cases or [parse_case(c) for c in DEFAULT_CASES]
    if not Path(args.ncu).exists():
        print(f"gpu_profile: ncu not found ({args.ncu}); nothing profiled")
        return 2
    import torch

    if not torch.cuda.is_available():
        print("gpu_profile: no GPU visible to torch; nothing profiled")
        return 2
    os.environ[KERNELS_ENV] = "nvrtc"
    work = Path(tempfile.mkdtemp(prefix="gpu-profile-"))
    major, minor = torch.cuda.get_device_capability()
    names = precompile_kernels(sorted({c.dtype for c in cases}))
    precompile = None if args.no_precompile else _start_precompile(names, major * 10 + minor, work / "precompile.log")
    why = _cuda_path_ready()  # the host driver builds here while the kernels compile beside it
    if why:
        if precompile is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(precompile.pid, signal.SIGKILL)
        print(f"gpu_profile: {why}; nothing profiled")
        return 2
    host_s = budget.spent()
    notes = []
    if precompile is not None:
        problem = _finish_precompile(precompile, min(PREPARE_CAP_S - budget.spent(), budget.remaining()),
                                     work / "precompile.log")
        if problem:
            notes.append(problem)
    report = Report([
        "# Nsight Compute profile of the NVRTC scan kernels (dev/gpu/gpu_profile.py)",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; commit {_git_commit()}",
        f"- device: {torch.cuda.get_device_name()}; torch {torch.__version__}; ncu {_ncu_version(args.ncu)}",
        f"- op: cross_selective_scan_2d (the four cross routes, backend cuda, {KERNELS_ENV}=nvrtc) on "
        f"benchmarks/bench_cross_scan.py's make_inputs: vmamba2d_tiny stages at 224, batch {args.batch}, N = 1, "
        "full-rank delta per route",
        "- per case: a warm-up forward and training step, then profiled between cudaProfilerStart / Stop: one "
        "forward under no_grad (fwd) and one training step, its forward (fwd (autograd)) and backward (bwd)",
        f"- ncu --clock-control none --profile-from-start off, sections {', '.join(SECTIONS)}, launches of "
        f"kernels matching {KERNEL_FILTER}; the table entry of each launch from the NVRTC launcher's log",
        f"- prepare: host driver ready after {host_s:.0f} s, "
        + ("no precompile" if precompile is None else f"{len(names)} kernels precompiled by {budget.spent():.0f} s"),
    ], notes=notes)
    write_report(args.out, report.render())
    metrics = STALL_METRICS + EXTRA_METRICS
    failed = False
    for case in cases:
        timeout = budget.allot(args.case_timeout_s)
        if timeout is None:
            report.notes.append(f"{case.label}: skipped, {budget.remaining():.0f} s of the budget left")
            continue
        print(f"gpu_profile: {case.label} (limit {timeout:.0f} s)", flush=True)
        result = profile_case(args.ncu, case, args.batch, timeout, work, args.csv_dir, metrics)
        retry = budget.allot(args.case_timeout_s)
        if result.error and _METRIC_REJECTED.search(result.error) and metrics and retry:
            metrics = ()  # ncu refused a metric asked for by name: the sections' own metrics from here on
            report.notes.append(f"{case.label}: ncu refused a requested metric; profiled again with the sections' "
                                "metrics alone (columns they lack show —)")
            result = profile_case(args.ncu, case, args.batch, retry, work, args.csv_dir, metrics)
        report.results.append(result)
        failed |= bool(result.error)
        write_report(args.out, report.render())
        print(f"gpu_profile: {case.label}: {len(result.launches)} launches" + (" (error)" if result.error else ""),
              flush=True)
        if result.error and _PROFILER_UNUSABLE.search(result.error):
            report.notes.append("ncu cannot read the counters on this machine; the remaining steps are skipped")
            write_report(args.out, report.render())
            print(report.render())
            return 1
    if args.source_case is not None:
        timeout = budget.allot(args.source_timeout_s)
        if timeout is None:
            report.notes.append(f"source counters skipped, {budget.remaining():.0f} s of the budget left")
        else:
            print(f"gpu_profile: source counters of {args.source_case.label} (limit {timeout:.0f} s)", flush=True)
            lines, error = profile_source(args.ncu, args.source_case, args.batch, timeout, work, args.csv_dir)
            report.source = lines
            if error:
                report.notes.append(f"ERROR {error}")
                failed = True
    report.notes.append(f"run took {budget.spent():.0f} s of a {args.budget_s:.0f} s budget")
    text = report.render()
    write_report(args.out, text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
