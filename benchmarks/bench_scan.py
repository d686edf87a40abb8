#!/usr/bin/env python
"""Benchmark the 2D selective scan: forward and forward+backward time and peak memory per backend.

``--device cuda`` runs the GPU benchmark instead (dev/gpu/bench_scan_cuda.py: the shapes of
docs/benchmarks.md, bandwidth against the measured copy bandwidth, 2D vs 1D, targets); its options
are listed by ``python benchmarks/bench_scan.py --device cuda --help``. The rest of this text is the CPU benchmark.

Two settings (issue #2, docs/benchmarks.md):
    table3  the paper's Table 3 operator setting: N=16 states, one channel per map, a batch of maps
    model   a 2DVMamba-like layer: dim 384 in 4 groups, N=1, batch 2
at map sizes 14x14, 56x56 and 200x200, for the backends
    cpu         our compiled CPU kernel
    torch       the vectorised pure-PyTorch backend
    naive       the naive 2D scan written below: the N per-state maps are materialised, a Python
                loop steps over the columns (horizontal scans of all rows at once) and then over the
                rows (vertical scans), autograd does the backward

Time: median over --repeats runs after one warm-up run (the naive scan on maps above
--naive-full-pixels gets --naive-repeats runs and no warm-up, it is slow); the runs of the
backends of one case are interleaved so that load from other processes hits them alike. "fwd" runs under
torch.no_grad(); "fwd+bwd" runs the forward with every input requiring grad and backward of a
fixed random dy.
Peak memory: the largest amount of tensor memory alive at once during one step, above what was
allocated before it (the inputs). On CPU it is computed from the torch profiler's allocation
events (every allocation and free made through PyTorch's CPU allocator, including the compiled
kernel's per-thread workspaces, which it allocates as tensors); memory not allocated as tensors
(Python objects, allocator caches) is not counted.
Cases whose estimated peak exceeds --memory-limit-gb are skipped and listed as such.

Usage:
    python benchmarks/bench_scan.py                                   # CPU, everything, prints a table
    python benchmarks/bench_scan.py --out benchmarks/scan_cpu.md      # also writes it (with metadata)
    python benchmarks/bench_scan.py --device cuda --out out/bench_scan_cuda.md   # GPU mode
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from vmamba2d.ops import backend_info, selective_scan_2d  # noqa: E402

Tensor = torch.Tensor
Inputs = dict


@dataclass(frozen=True)
class Setting:
    key: str
    batch: int
    dim: int
    groups: int
    nstate: int

    def describe(self) -> str:
        return f"{self.key} (batch {self.batch}, dim {self.dim}, groups {self.groups}, N={self.nstate})"


def make_settings(table3_batch: int) -> dict[str, Setting]:
    return {
        "table3": Setting("table3", batch=table3_batch, dim=1, groups=1, nstate=16),
        "model": Setting("model", batch=2, dim=384, groups=4, nstate=1),
    }


# ------------------------------------------------------------------------------------------------
# The naive 2D scan (baseline)
# ------------------------------------------------------------------------------------------------
def naive_scan_2d(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                  delta_bias: Optional[Tensor], delta_softplus: bool, height: int, width: int) -> Tensor:
    """Naive 2D selective scan: materialises the (batch, dim, N, H, W) per-state maps, then runs the
    horizontal scans (a Python loop over columns) and the vertical scans (a loop over rows).

    u, delta (batch, dim, L); A (dim, N); B, C (batch, groups, N, L); D, delta_bias (dim,) or None.
    Returns y (batch, dim, L).
    """
    batch, dim, length = u.shape
    groups, nstate = B.shape[1], A.shape[1]
    per_group = dim // groups
    dt = delta if delta_bias is None else delta + delta_bias[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    grid = (batch, dim, nstate, height, width)
    decay = torch.exp(dt[:, :, None, :] * A[:, :, None]).reshape(grid)
    x = ((dt * u)[:, :, None, :] * B.repeat_interleave(per_group, dim=1)).reshape(grid)
    # unbind, not indexing in the loop: its backward is one stack instead of a full-size zero
    # tensor per step (which would make the baseline quadratic, not just naive).
    decay_columns, x_columns = decay.unbind(-1), x.unbind(-1)
    columns = [x_columns[0]]
    for j in range(1, width):
        columns.append(decay_columns[j] * columns[-1] + x_columns[j])
    hh_rows = torch.stack(columns, dim=-1).unbind(-2)
    decay_rows = decay.unbind(-2)
    rows = [hh_rows[0]]
    for i in range(1, height):
        rows.append(decay_rows[i] * rows[-1] + hh_rows[i])
    h = torch.stack(rows, dim=-2).reshape(batch, dim, nstate, length)
    y = (h * C.repeat_interleave(per_group, dim=1)).sum(dim=2)
    if D is not None:
        y = y + D[:, None] * u
    return y


# ------------------------------------------------------------------------------------------------
# Cases and measurement
# ------------------------------------------------------------------------------------------------
def make_inputs(setting: Setting, height: int, width: int, device: torch.device, seed: int = 0) -> Inputs:
    """Scan inputs in the range a freshly initialised 2DVMamba layer feeds the op
    (docs/models.md, initialisation): A = -(1..N) per channel, delta_bias the inverse softplus
    of a log-uniform step in [1e-3, 0.1], delta = 0.5 * randn (the dt projection's output), D = 1,
    u / B / C ~ randn."""
    gen = torch.Generator().manual_seed(seed)
    b, d, g, n, length = setting.batch, setting.dim, setting.groups, setting.nstate, height * width

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen)

    log_step = torch.empty(d).uniform_(math.log(1e-3), math.log(0.1), generator=gen)
    step = torch.exp(log_step)
    inputs = dict(
        u=randn(b, d, length),
        delta=0.5 * randn(b, d, length),
        A=-torch.arange(1, n + 1, dtype=torch.float32).repeat(d, 1),
        B=randn(b, g, n, length),
        C=randn(b, g, n, length),
        D=torch.ones(d),
        delta_bias=step + torch.log(-torch.expm1(-step)),
    )
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def scan_function(backend: str) -> Callable[[Inputs, int, int], Tensor]:
    """fn(inputs, height, width) -> y for a benchmark backend name."""
    if backend == "naive":
        return lambda t, h, w: naive_scan_2d(**t, delta_softplus=True, height=h, width=w)
    return lambda t, h, w: selective_scan_2d(**t, delta_softplus=True, height=h, width=w, backend=backend)


def estimated_peak_bytes(backend: str, setting: Setting, height: int, width: int) -> int:
    """Rough upper bound of a fwd+bwd step's tensor memory (to skip cases that would swamp the machine)."""
    state_maps = 4 * setting.batch * setting.dim * setting.nstate * height * width
    if backend == "torch":  # every doubling step of both scans keeps ~5 state-map sized tensors
        steps = math.ceil(math.log2(max(height, width, 2)))
        return state_maps * (6 + 10 * steps)
    if backend == "naive":
        return state_maps * 12
    return 4 * setting.batch * (3 * setting.dim + 4 * setting.groups * setting.nstate) * height * width


def forward_step(fn, inputs: Inputs, height: int, width: int) -> Callable[[], None]:
    def step() -> None:
        with torch.no_grad():
            fn(inputs, height, width)
    return step


def train_step(fn, inputs: Inputs, height: int, width: int) -> Callable[[], None]:
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()}
    dy = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(1)).to(inputs["u"].device)

    def step() -> None:
        fn(leaves, height, width).backward(dy)
        for leaf in leaves.values():  # the gradients count towards this step's peak, then go
            leaf.grad = None
    return step


def timed(step: Callable[[], None], device: torch.device) -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds of this process over all its threads) of one ``step``."""
    start, start_cpu = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - start, time.process_time() - start_cpu


def peak_bytes(step: Callable[[], None], device: torch.device) -> int:
    """Peak tensor memory allocated during one ``step`` above what was allocated before it."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    changes = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == DeviceType.CPU
    )
    live = peak = 0
    for _, nbytes in changes:
        live += nbytes
        peak = max(peak, live)
    return peak


@dataclass
class Row:
    setting: Setting
    size: int
    backend: str
    fwd_s: Optional[float] = None
    train_s: Optional[float] = None
    train_cpu_s: Optional[float] = None
    fwd_peak: Optional[int] = None
    train_peak: Optional[int] = None
    note: str = ""


def run_cases(setting: Setting, size: int, backends: list[str], device: torch.device, args) -> list[Row]:
    """Measure every backend on one (setting, map size).

    The timed runs are interleaved (round r times each backend once, then round r + 1), so that
    load from other processes on a shared machine hits all backends alike; medians per backend.
    """
    inputs = make_inputs(setting, size, size, device)
    rows, steps, runs = [], {}, {}
    for backend in backends:
        row = Row(setting, size, backend)
        rows.append(row)
        estimate = estimated_peak_bytes(backend, setting, size, size)
        if estimate > args.memory_limit_gb * 2**30:
            row.note = f"skipped: est. {estimate / 2**30:.1f} GB > --memory-limit-gb {args.memory_limit_gb}"
            continue
        fn = scan_function(backend)
        steps[backend] = (forward_step(fn, inputs, size, size), train_step(fn, inputs, size, size))
        slow = backend == "naive" and size * size > args.naive_full_pixels
        runs[backend] = args.naive_repeats if slow else args.repeats
        if slow:
            row.note = f"{runs[backend]} run(s), no warm-up"
        else:
            for step in steps[backend]:
                step()
    times = {backend: ([], [], []) for backend in steps}  # fwd wall, fwd+bwd wall, fwd+bwd CPU
    for round_index in range(max(runs.values(), default=0)):
        for backend, (fwd, train) in steps.items():
            if round_index < runs[backend]:
                times[backend][0].append(timed(fwd, device)[0])
                wall, cpu = timed(train, device)
                times[backend][1].append(wall)
                times[backend][2].append(cpu)
    for row in rows:
        if row.backend in steps:
            fwd, train = steps[row.backend]
            fwd_wall, train_wall, train_cpu = times[row.backend]
            row.fwd_s, row.train_s = statistics.median(fwd_wall), statistics.median(train_wall)
            row.train_cpu_s = statistics.median(train_cpu)
            row.fwd_peak, row.train_peak = peak_bytes(fwd, device), peak_bytes(train, device)
    return rows


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
def _ms(seconds: Optional[float]) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f}"


def _mb(nbytes: Optional[int]) -> str:
    return "—" if nbytes is None else f"{nbytes / 2**20:.2f}"


def format_table(rows: list[Row]) -> str:
    naive = {(r.setting.key, r.size): r for r in rows if r.backend == "naive"}
    lines = [
        "| setting | map | backend | fwd ms | fwd+bwd ms | fwd+bwd CPU ms | fwd maps/s | peak MB fwd "
        "| peak MB fwd+bwd | fwd+bwd speed-up vs naive (CPU time) | peak fwd+bwd vs naive | note |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        base = naive.get((r.setting.key, r.size))
        speedup = mem_ratio = "—"
        if base is not None and base.train_s and r.train_s and r.backend != "naive":
            speedup = f"{base.train_s / r.train_s:.1f}× ({base.train_cpu_s / r.train_cpu_s:.1f}×)"
            mem_ratio = f"{r.train_peak / base.train_peak:.2f}×" if base.train_peak else "—"
        maps = r.setting.batch * r.setting.dim
        rate = "—" if r.fwd_s is None else f"{maps / r.fwd_s:,.0f}"
        lines.append(
            f"| {r.setting.key} | {r.size}×{r.size} | {r.backend} | {_ms(r.fwd_s)} | {_ms(r.train_s)} | "
            f"{_ms(r.train_cpu_s)} | {rate} | {_mb(r.fwd_peak)} | {_mb(r.train_peak)} | {speedup} | {mem_ratio} | {r.note} |"
        )
    return "\n".join(lines)


def git_commit(paths: tuple[str, ...] = ("csrc", "vmamba2d/ops", "benchmarks/bench_scan.py",
                                         "dev/gpu/bench_scan_cuda.py")) -> str:
    """Short HEAD commit, marked when ``paths`` (what a benchmark measures) have uncommitted changes."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *paths],
                               cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()
        return out + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_description(device: torch.device) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical cores visible, torch threads {torch.get_num_threads()}"


def _cpu_kernel_isa() -> str:
    from vmamba2d.ops.compiled import extensions

    module = extensions.cpu_extension()
    return module.isa() if module is not None and hasattr(module, "isa") else "unknown"


def report_header(args, settings: dict[str, Setting], device: torch.device) -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    info = backend_info()
    lines = [
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {git_commit()}",
        f"- machine: {machine_description(device)}; load average at start: {load}",
        f"- torch {torch.__version__}, device {device}, float32, cpu kernel: "
        f"{info['cpu_extension_source']} build, {_cpu_kernel_isa()} code path",
        f"- settings: " + "; ".join(settings[k].describe() for k in args.settings)
        + "; inputs as a freshly initialised 2DVMamba layer gives them (A = -(1..N), dt in [1e-3, 0.1])",
        f"- repeats: median of {args.repeats} after 1 warm-up; naive maps > {args.naive_full_pixels} "
        f"pixels: {args.naive_repeats} run(s) without warm-up; runs of the backends interleaved",
        "- times: wall clock; \"CPU ms\" is the CPU time of the process over the step, summed over "
        "its threads (less sensitive to other processes competing for the cores)",
        "- peak memory: max tensor memory alive during one step above the inputs "
        "(from torch profiler allocation events; includes the kernel's workspaces)",
        f"- command: `python benchmarks/bench_scan.py {' '.join(sys.argv[1:])}`",
    ]
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu"], help="cuda: see dev/gpu/bench_scan_cuda.py")
    parser.add_argument("--sizes", type=int, nargs="+", default=[14, 56, 200], help="square map sides")
    parser.add_argument("--settings", nargs="+", default=["table3", "model"], choices=["table3", "model"])
    parser.add_argument("--backends", nargs="+", default=None,
                        help="default: cpu torch naive")
    parser.add_argument("--table3-batch", type=int, default=8, help="maps per batch in the table3 setting")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--naive-repeats", type=int, default=1)
    parser.add_argument("--naive-full-pixels", type=int, default=100 * 100,
                        help="naive maps with more pixels get --naive-repeats runs and no warm-up")
    parser.add_argument("--memory-limit-gb", type=float, default=3.0,
                        help="skip cases whose estimated peak memory exceeds this")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    return parser.parse_args(argv)


def _load_gpu_benchmark():
    path = REPO_ROOT / "dev" / "gpu" / "bench_scan_cuda.py"
    spec = importlib.util.spec_from_file_location("bench_scan_cuda", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(argv: Optional[list[str]] = None) -> None:
    device_only = argparse.ArgumentParser(add_help=False)
    device_only.add_argument("--device", default="cpu")
    if device_only.parse_known_args(argv)[0].device == "cuda":
        return _load_gpu_benchmark().main(argv)
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    backends = args.backends or ["cpu", "torch", "naive"]
    settings = make_settings(args.table3_batch)
    header = report_header(args, settings, device)
    print(header, flush=True)
    rows = []
    for key in args.settings:
        for size in args.sizes:
            for row in run_cases(settings[key], size, backends, device, args):
                rows.append(row)
                print(f"  {key} {size}x{size} {row.backend}: fwd {_ms(row.fwd_s)} ms, fwd+bwd "
                      f"{_ms(row.train_s)} ms, peak {_mb(row.train_peak)} MB {row.note}", flush=True)
    table = format_table(rows)
    print()
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        title = f"# 2D selective scan benchmark ({device.type})\n\n"
        args.out.write_text(title + header + "\n\n" + table + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
