#!/usr/bin/env python3
"""Nsight Compute profile of the CUDA scan kernels on the model's shapes: where their time goes.

The first GPU run measured the forward at 37% of the copy bandwidth with an instruction count
that accounts for a fifth of its time (benchmarks/scan_cuda.md): the kernels are latency-bound,
and only hardware counters say on what. For each profiled case this runs a child process under
``ncu`` (``--clock-control none``: the card's clocks stay as they are) that calls the public op
with the ``cuda`` backend once without and once with autograd, and collects, for every launch of
a kernel whose name matches ``scan2d``, the sections SpeedOfLight, Occupancy, LaunchStats,
WarpStateStats and SchedulerStats. The report has one row per launch: duration, DRAM and SM
throughput as a share of peak, achieved and theoretical occupancy, issue-slot use, registers,
the bytes read from and written to DRAM with the L2 hit rate, and the largest warp-stall reasons
(warps stalled on each per issue-active cycle).

Needs a GPU, ncu and the built extension (``make gpu-check`` builds it)::

    python3 dev/gpu/gpu_profile.py --out benchmarks/gpu-profile.md --csv-dir /tmp/ncu
    python3 dev/gpu/gpu_profile.py --cases 56:fp32 14:bf16    # map side : dtype (model shapes)

Exit status: 0 profiled, 1 ncu failed on a case, 2 nothing could be profiled (no GPU, no ncu,
no CUDA kernel).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parents[1]
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats")
KERNEL_FILTER = "regex:scan2d"
DEFAULT_CASES = ("56:fp32", "56:bf16", "14:bf16")
TOP_STALLS = 4
# (column title, ncu metric, whether the cell shows the unit of ncu's units row: ncu scales
# times and byte counts per column); a metric the installed ncu does not report shows as "—".
SUMMARY_METRICS = (
    ("time", "gpu__time_duration.sum", True),
    ("DRAM % peak", "dram__throughput.avg.pct_of_peak_sustained_elapsed", False),
    ("SM % peak", "sm__throughput.avg.pct_of_peak_sustained_elapsed", False),
    ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active", False),
    ("theoretical occupancy %", "sm__maximum_warps_per_active_cycle_pct", False),
    ("issue slots busy %", "smsp__issue_active.avg.pct_of_peak_sustained_active", False),
    ("registers", "launch__registers_per_thread", False),
    # What the launch moved to and from DRAM, against the bytes it must move (u re-read in the
    # forward's store phase, carries): a low L2 hit rate with reads well above the inputs' size
    # means re-reads miss L2.
    ("DRAM read", "dram__bytes_read.sum", True),
    ("DRAM written", "dram__bytes_write.sum", True),
    ("L2 hit %", "lts__t_sector_hit_rate.pct", False),
)
# Requested by name: the sections above do not all report them.
EXTRA_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct")
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "barrier", "wait", "mio_throttle", "math_pipe_throttle",
                 "lg_throttle", "not_selected", "no_instruction", "dispatch_stall", "branch_resolving", "membar")
STALL_METRICS = tuple(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS)
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(?P<reason>[a-z_]+)_per_issue_active\.ratio$")


@dataclass(frozen=True)
class Case:
    side: int
    dtype: str

    @property
    def label(self) -> str:
        return f"{self.side}x{self.side} {self.dtype}"


def parse_case(text: str) -> Case:
    """"56:fp32" -> Case(56, "fp32"); the side picks the model shape (dev/gpu/bench_scan_cuda.py)."""
    import bench_scan_cuda as scan_bench

    side, _, dtype = text.partition(":")
    sides = dict(scan_bench.MODEL_SHAPES)
    if not side.isdigit() or int(side) not in sides or dtype not in scan_bench.DTYPES:
        raise argparse.ArgumentTypeError(
            f"--cases: expected SIDE:DTYPE with SIDE in {sorted(sides)} and DTYPE in {sorted(scan_bench.DTYPES)}, "
            f"got {text!r}")
    return Case(int(side), dtype)


# ------------------------------------------------------------------------------------------------
# the profiled process
# ------------------------------------------------------------------------------------------------
def run_worker(case: Case) -> None:
    """The launches ncu profiles: one forward without autograd, one forward + backward with it."""
    import torch

    import bench_scan_cuda as scan_bench
    from vmamba2d.ops import selective_scan_2d

    dim = dict(scan_bench.MODEL_SHAPES)[case.side]
    shape = scan_bench.Shape("model", scan_bench.MODEL_BATCH, dim, scan_bench.MODEL_GROUPS, 1, case.side, case.side)
    inputs = scan_bench.make_inputs(shape, scan_bench.DTYPES[case.dtype], torch.device("cuda"))
    kwargs = dict(delta_softplus=True, height=case.side, width=case.side, backend="cuda")
    with torch.no_grad():
        selective_scan_2d(**inputs, **kwargs)
    leaves = {name: t.detach().requires_grad_() for name, t in inputs.items()}
    y = selective_scan_2d(**leaves, **kwargs)
    y.backward(torch.randn_like(y))
    torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------
# reading ncu's output
# ------------------------------------------------------------------------------------------------
def _raw_csv_table(text: str) -> tuple[list[str], dict[str, str], list[list[str]]]:
    """(header, units by column, launch rows) of ``ncu --csv --page raw``; lines before the header
    (ncu's own messages) are skipped, the units row (first cell empty) after it is read apart."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return [], {}, []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    units = {}
    if body and not body[0][0].strip():
        units = dict(zip(header, body[0]))
        body = body[1:]
    return header, units, [row for row in body if len(row) == len(header)]


def parse_raw_csv(text: str) -> list[dict[str, str]]:
    """Rows of ``ncu --csv --page raw`` (one per profiled launch), keyed by column name."""
    header, _, body = _raw_csv_table(text)
    return [dict(zip(header, row)) for row in body]


def raw_csv_units(text: str) -> dict[str, str]:
    """The unit of each column of ``ncu --csv --page raw`` ("usecond", "Mbyte", "%", ...)."""
    return _raw_csv_table(text)[1]


def _number(text: str) -> Optional[float]:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def top_stalls(row: dict[str, str], count: int = TOP_STALLS) -> list[tuple[str, float]]:
    """The ``count`` largest stall reasons of a launch: (reason, warps per issue-active cycle)."""
    stalls = []
    for name, value in row.items():
        match = _STALL.match(name)
        number = _number(value)
        if match and number is not None and number > 0:
            stalls.append((match.group("reason"), number))
    return sorted(stalls, key=lambda s: -s[1])[:count]


def _short_kernel(name: str) -> str:
    base = re.sub(r"\([^()]*\)$", "", name).replace("void ", "").replace("vmamba2d::scan2d::", "")
    return base.replace("<", "&lt;").replace(">", "&gt;")


def summary_rows(case: Case, rows: list[dict[str, str]], units: Optional[dict[str, str]] = None) -> list[str]:
    """Markdown rows of one case's launches; units: raw_csv_units of their csv."""
    units = units or {}
    out = []
    for row in rows:
        cells = [case.label, _short_kernel(row.get("Kernel Name", "?")), row.get("Grid Size", "?"),
                 row.get("Block Size", "?")]
        for _, metric, with_unit in SUMMARY_METRICS:
            value = row.get(metric)
            unit = units.get(metric, "").strip() if with_unit else ""
            cells.append("—" if value in (None, "") else f"{value} {unit}" if unit else value)
        stalls = top_stalls(row)
        cells.append(", ".join(f"{reason} {value:.1f}" for reason, value in stalls) or "—")
        out.append("| " + " | ".join(cells) + " |")
    return out


def table(lines: list[str]) -> str:
    titles = ["case", "kernel", "grid", "block"] + [title for title, _, _ in SUMMARY_METRICS] + [
        f"top {TOP_STALLS} stalls (warps per issue-active cycle)"]
    head = ["| " + " | ".join(titles) + " |", "|" + "|".join("---" for _ in titles) + "|"]
    return "\n".join(head + lines)


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------
def ncu_command(ncu: str, case: Case) -> list[str]:
    sections = [arg for name in SECTIONS for arg in ("--section", name)]
    return [ncu, "--clock-control", "none", "--target-processes", "all", "--kernel-name", KERNEL_FILTER,
            *sections, "--metrics", ",".join(STALL_METRICS + EXTRA_METRICS), "--csv", "--page", "raw", sys.executable, str(Path(__file__).resolve()), "--worker",
            f"{case.side}:{case.dtype}"]


def profile(ncu: str, case: Case, csv_dir: Optional[Path],
            timeout: float) -> tuple[list[dict[str, str]], dict[str, str], str]:
    """(rows, units, error text or ""): runs the worker for ``case`` under ncu."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = subprocess.run(ncu_command(ncu, case), capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return [], {}, f"ncu did not finish within {timeout:.0f} s"
    if csv_dir is not None:
        csv_dir.mkdir(parents=True, exist_ok=True)
        (csv_dir / f"ncu-{case.side}-{case.dtype}.csv").write_text(done.stdout)
    rows, units = parse_raw_csv(done.stdout), raw_csv_units(done.stdout)
    if done.returncode != 0 or not rows:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        return rows, units, f"ncu exit {done.returncode}, {len(rows)} launches profiled:\n{tail}"
    return rows, units, ""


def _gpu_ready() -> str:
    """Why nothing can be profiled here, or "" when the GPU and the CUDA kernel are there."""
    import torch

    if not torch.cuda.is_available():
        return "no GPU visible to torch"
    from vmamba2d.ops import resolve_backend

    try:
        resolve_backend("cuda", torch.device("cuda"), torch.float32)
    except (RuntimeError, ValueError) as err:
        return f"the cuda backend cannot run: {err}"
    return ""


def main(argv: Optional[list[str]] = None) -> int:
    sys.path.insert(0, str(TOOLS))
    sys.path.insert(0, str(REPO))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", type=parse_case, default=None,
                        help=f"SIDE:DTYPE model shapes (default: {' '.join(DEFAULT_CASES)})")
    parser.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    parser.add_argument("--timeout-s", type=float, default=120, help="per case")
    parser.add_argument("--csv-dir", type=Path, help="also keep ncu's raw csv per case here")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    parser.add_argument("--worker", type=parse_case, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        run_worker(args.worker)
        return 0
    cases = args.cases or [parse_case(c) for c in DEFAULT_CASES]
    if not Path(args.ncu).exists():
        print(f"gpu_profile: ncu not found ({args.ncu}); nothing profiled")
        return 2
    why = _gpu_ready()
    if why:
        print(f"gpu_profile: {why}; nothing profiled")
        return 2
    import torch

    lines, errors = [], []
    for case in cases:
        rows, units, error = profile(args.ncu, case, args.csv_dir, args.timeout_s)
        lines += summary_rows(case, rows, units)
        if error:
            errors.append(f"- {case.label}: {error}")
        print(f"{case.label}: {len(rows)} launches profiled" + (" (errors)" if error else ""), flush=True)
    report = "\n".join([
        "# Nsight Compute profile of the CUDA scan kernels (dev/gpu/gpu_profile.py)",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- device: {torch.cuda.get_device_name()}; torch {torch.__version__}",
        f"- cases: model shapes of vmamba2d_tiny at batch 128 (N = 1, 4 groups), each one forward without "
        f"autograd, then forward + backward; ncu --clock-control none, sections {', '.join(SECTIONS)}, "
        f"the stall metrics and {', '.join(EXTRA_METRICS)}, launches of kernels matching {KERNEL_FILTER}",
        "- stalls: ncu's smsp__average_warps_issue_stalled_*_per_issue_active.ratio, the warps in that "
        "state per issue-active cycle (summed over reasons: cycles per issued instruction)",
        "",
        table(lines),
    ] + (["", "Errors:", ""] + errors if errors else [])) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        temporary = args.out.with_suffix(".tmp")
        temporary.write_text(report)
        os.replace(temporary, args.out)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
