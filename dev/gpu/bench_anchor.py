#!/usr/bin/env python3
"""Our 2D scan against mamba_ssm's 1D selective scan (the "anchor"), forward, same GPU, same tensors.

The anchor is the CUB scan the paper's Table 3 compares against, built from the pinned sdist by
``dev/gpu/mamba_anchor.py`` (fetch here, build on the GPU machine) and called through its binding
``fwd(u, delta, A, B, C, D, None, delta_bias, True)``: u, delta (batch, dim, L); A (dim, 16) fp32;
B, C (batch, 1, 16, L), variable per position, one group; D and delta_bias (dim,) fp32. Our scan
takes the same tensors as ``height x width`` maps (``vmamba2d.ops.selective_scan_2d``, --backend,
default auto; the backend that runs is in each row). The two compute different scans (1D over the
flattened map, 2D over the map), so their outputs are not compared; each is checked to be finite.

Rows, at the paper's Table-3 sizes (N = 16; 14x14, 56x56, 200x200) in fp32 and bf16:
    channels  batch x CHANNELS channels (the paper's MIL feature width), the batch the smallest power
              of two that moves at least --min-mib per call in bf16 (the same batch for fp32)
    paper     the paper's operator setting: one channel per map, a batch of maps
              (dev/gpu/bench_scan_cuda.py TABLE3_MAPS)
Per row: median ms of each (CUDA events, the two alternating, each after its warm-up calls), the
bytes a forward must move (inputs read once, y written once: bench_scan_cuda.BYTES_FORMULA), GB/s
and the share of a device-to-device copy moving the same bytes (measured for the row), feature maps
per second (batch x dim single-channel maps), and 2D / 1D throughput (t_1D / t_2D) against the
target 2D >= 1.0x the 1D scan (issue 39; the paper reports 0.82 / 0.5 / 0.33 for its own kernel).
A benchmark, never a test. The table is written after every row; rows past --max-seconds are
marked not measured. Exit 2 (one line) without a GPU or without the built anchor.

    python dev/gpu/mamba_anchor.py build && python dev/gpu/bench_anchor.py --out benchmarks/gpu-anchor.md
"""
from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional, Sequence

import torch

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

import bench_scan_cuda as scan_bench  # noqa: E402  (puts the checkout on sys.path)
import mamba_anchor  # noqa: E402
from vmamba2d.ops import BACKENDS, backend_info, resolve_backend, selective_scan_2d  # noqa: E402

Tensor = torch.Tensor

NSTATE = 16
SIDES = (14, 56, 200)
CHANNELS = 128  # the paper's MIL framework runs 128-dimensional features
DEFAULT_MIN_MIB = 64
TARGET_2D_OVER_1D = 1.0
PAPER_RATIOS = {14: 40 / 49, 56: 6 / 12, 200: 1 / 3}  # its 2D scan / CUB 1D scan throughput, Table 3


def _bf16_bytes(shape: scan_bench.Shape) -> int:
    return scan_bench.bytes_moved(shape, torch.bfloat16)


def batch_for(side: int, dim: int, min_bytes: int) -> int:
    """The smallest power-of-two batch of ``dim``-channel side x side maps (one group, N = 16)
    whose bf16 forward moves at least ``min_bytes``."""
    batch = 1
    while _bf16_bytes(scan_bench.Shape("anchor", batch, dim, 1, NSTATE, side, side)) < min_bytes:
        batch *= 2
    return batch


def cases(settings: Sequence[str], sides: Sequence[int], min_bytes: int) -> list[tuple[str, scan_bench.Shape]]:
    """(setting, shape) per row group, in the order measured: every size of one setting, then the next."""
    out = []
    for setting in settings:
        for side in sides:
            if setting == "channels":
                shape = scan_bench.Shape("anchor", batch_for(side, CHANNELS, min_bytes), CHANNELS, 1, NSTATE, side, side)
            else:
                shape = scan_bench.Shape("table3", scan_bench.TABLE3_MAPS[side], 1, 1, NSTATE, side, side)
            out.append((setting, shape))
    return out


@dataclass
class Row:
    setting: str
    shape: scan_bench.Shape
    dtype: str
    backend: str = "—"  # ours, as resolved for this dtype
    bytes: int = 0
    copy_bytes_per_s: Optional[float] = None
    ms_1d: Optional[float] = None
    ms_2d: Optional[float] = None
    finite_1d: Optional[bool] = None
    finite_2d: Optional[bool] = None
    note: str = ""

    @property
    def maps(self) -> int:
        return self.shape.batch * self.shape.dim

    def gbs(self, ms: Optional[float]) -> Optional[float]:
        return None if not ms else self.bytes / (ms / 1e3) / 1e9

    def copy_share(self, ms: Optional[float]) -> Optional[float]:
        return None if not ms or not self.copy_bytes_per_s else self.bytes / (ms / 1e3) / self.copy_bytes_per_s

    def maps_per_s(self, ms: Optional[float]) -> Optional[float]:
        return None if not ms else self.maps / (ms / 1e3)

    @property
    def ratio(self) -> Optional[float]:
        """2D throughput / 1D throughput on the same bytes = t_1D / t_2D."""
        return None if not self.ms_1d or not self.ms_2d else self.ms_1d / self.ms_2d


def _num(value: Optional[float], digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _share(value: Optional[float]) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def _rate(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _finite(value: Optional[bool]) -> str:
    return "—" if value is None else ("yes" if value else "NO")


TABLE_HEADER = (
    "| setting | map | batch x ch | dtype | 2D backend | MiB moved | copy GB/s | 1D ms | 1D GB/s | 1D % copy "
    "| 1D maps/s | 2D ms | 2D GB/s | 2D % copy | 2D maps/s | 2D / 1D | paper 2D / 1D | target 2D / 1D >= 1.0 "
    "| finite 1D, 2D | note |\n"
    "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"
)


def format_table(rows: Sequence[Row]) -> str:
    lines = [TABLE_HEADER]
    for r in rows:
        ratio = r.ratio
        if ratio is None:
            mark = "—"
        elif r.finite_1d is False or r.finite_2d is False:
            mark = "— (an output not finite)"
        else:
            mark = "pass" if ratio >= TARGET_2D_OVER_1D else "FAIL"
        cells = [
            r.setting, f"{r.shape.height}x{r.shape.width}", f"{r.shape.batch} x {r.shape.dim}", r.dtype, r.backend,
            _num(r.bytes / 2**20 if r.bytes else None, 1),
            _num(None if r.copy_bytes_per_s is None else r.copy_bytes_per_s / 1e9, 0),
            _num(r.ms_1d), _num(r.gbs(r.ms_1d), 0), _share(r.copy_share(r.ms_1d)), _rate(r.maps_per_s(r.ms_1d)),
            _num(r.ms_2d), _num(r.gbs(r.ms_2d), 0), _share(r.copy_share(r.ms_2d)), _rate(r.maps_per_s(r.ms_2d)),
            _num(ratio, 2), _num(PAPER_RATIOS.get(r.shape.height), 2), mark,
            f"{_finite(r.finite_1d)}, {_finite(r.finite_2d)}", r.note,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def anchor_problem(folder: Path) -> Optional[str]:
    """Why the anchor in ``folder`` cannot be timed (one line), or None when it is built."""
    if mamba_anchor.read_info(folder) is None:
        return (f"no anchor sources in {folder} (run `make mamba-anchor` where the network works and carry "
                "build/mamba-anchor to the GPU machine)")
    if mamba_anchor.built_module(folder) is None:
        return f"the anchor in {folder} is not built (run `python dev/gpu/mamba_anchor.py build` on the GPU machine)"
    return None


def _alternating_ms(calls: Sequence[Callable[[], Tensor]], device: torch.device, warmup: int,
                    repeats: int) -> list[float]:
    """Median ms of each call, the calls alternating (order flipped every repeat) after each's warm-up."""
    for call in calls:
        for _ in range(warmup):
            call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    samples: list[list[float]] = [[] for _ in calls]
    for repeat in range(repeats):
        order = range(len(calls)) if repeat % 2 == 0 else reversed(range(len(calls)))
        for which in order:
            samples[which].append(scan_bench.time_ms(calls[which], device, 0, 1))
    return [statistics.median(s) for s in samples]


def measure_row(row: Row, anchor: ModuleType, backend: str, device: torch.device, warmup: int, repeats: int) -> None:
    """Times the anchor and our scan on one shape and dtype into ``row``."""
    dtype = scan_bench.DTYPES[row.dtype]
    shape = row.shape
    row.backend = resolve_backend(backend, device, dtype)
    t = scan_bench.make_inputs(shape, dtype, device)

    def one_d() -> Tensor:
        return anchor.fwd(t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], None, t["delta_bias"], True)[0]

    def two_d() -> Tensor:
        return selective_scan_2d(t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["delta_bias"], True,
                                 height=shape.height, width=shape.width, backend=row.backend)

    with torch.no_grad():
        row.finite_1d = bool(torch.isfinite(one_d()).all().item())
        row.finite_2d = bool(torch.isfinite(two_d()).all().item())
        row.ms_1d, row.ms_2d = _alternating_ms((one_d, two_d), device, warmup, repeats)
    del t
    # the reference: a device-to-device copy that reads and writes row.bytes in all
    row.copy_bytes_per_s = scan_bench.copy_bandwidth(device, row.bytes // 2, warmup, repeats)


def report_header(args: argparse.Namespace, argv: Sequence[str], device: torch.device, info: dict) -> str:
    backends = backend_info()
    return "\n".join([
        "# 2D scan against mamba_ssm's 1D selective scan, forward (dev/gpu/bench_anchor.py)",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {scan_bench._git_commit()}",
        f"- device: {torch.cuda.get_device_name(device)}; torch {torch.__version__} (CUDA {torch.version.cuda})",
        f"- 1D anchor: {info.get('package')} {info.get('version')} sdist (sha256 {info.get('sha256', '')[:16]}...), "
        "forward sources built for this GPU by dev/gpu/mamba_anchor.py; binding fwd, no z, delta_softplus; "
        "it also writes its chunk states (batch x dim x chunks x 32 fp32), not counted in the bytes",
        f"- 2D: vmamba2d selective_scan_2d, backend={args.backend}; backend_info: auto_cuda={backends.get('auto_cuda')}, "
        f"cuda_compiler={backends.get('cuda_compiler')}, cuda_kernel_arch={backends.get('cuda_kernel_arch')}",
        f"- N = {NSTATE}, one B / C group; channels rows: {CHANNELS} channels, batch = smallest power of two moving "
        f">= {args.min_mib} MiB in bf16; paper rows: 1 channel per map (the paper's operator setting)",
        f"- {scan_bench.BYTES_FORMULA}",
        f"- time: CUDA events, median of {args.repeats} alternating calls after {args.warmup} warm-up calls each, "
        "under torch.no_grad; % copy: against a device-to-device copy moving the same bytes, measured per row; "
        "maps/s = batch x channels single-channel maps per second; 2D / 1D = t_1D / t_2D",
        "- outputs are not compared (1D over the flattened map vs 2D over the map); each is checked finite",
        f"- command: `python dev/gpu/bench_anchor.py {' '.join(argv)}`",
    ])


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--anchor", type=Path, default=mamba_anchor.DEFAULT_DIR,
                        help="the anchor's folder (dev/gpu/mamba_anchor.py fetch + build)")
    parser.add_argument("--backend", default="auto", choices=[b for b in BACKENDS if b not in ("cpu", "reference")])
    parser.add_argument("--settings", nargs="+", default=["channels", "paper"], choices=["channels", "paper"])
    parser.add_argument("--sides", type=int, nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(scan_bench.DTYPES))
    parser.add_argument("--min-mib", type=int, default=DEFAULT_MIN_MIB, help="channels rows: bytes per call, at least")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop starting new rows after this many seconds (the rest: not measured)")
    parser.add_argument("--out", type=Path, help="also write the markdown report here (after every row)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    start = time.monotonic()
    if not torch.cuda.is_available():
        print("bench_anchor: no CUDA device is visible; nothing measured.")
        return 2
    problem = anchor_problem(args.anchor)
    if problem is not None:
        print(f"bench_anchor: {problem}; nothing measured.")
        return 2
    try:
        anchor = mamba_anchor.load(args.anchor)
    except ImportError as err:
        print(f"bench_anchor: the built anchor does not import here ({err}); nothing measured.")
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    header = report_header(args, argv, device, mamba_anchor.read_info(args.anchor))
    deadline = start + args.max_seconds if args.max_seconds else math.inf
    rows = [Row(setting, shape, dtype, bytes=scan_bench.bytes_moved(shape, scan_bench.DTYPES[dtype]))
            for setting, shape in cases(args.settings, args.sides, args.min_mib * 2**20) for dtype in args.dtypes]

    def save() -> None:
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(header + "\n\n" + format_table(rows) + "\n")

    print(header, flush=True)
    for row in rows:
        if time.monotonic() > deadline:
            row.note = "not measured: --max-seconds reached"
        else:
            try:
                measure_row(row, anchor, args.backend, device, args.warmup, args.repeats)
            except Exception as err:  # reported in the row, not fatal for the run
                torch.cuda.empty_cache()
                first_line = (str(err).strip().splitlines() or [""])[0][:160]
                row.note = f"error: {type(err).__name__}: {first_line}"
        print(f"  {row.setting} {row.shape.height}x{row.shape.width} {row.shape.batch}x{row.shape.dim} {row.dtype}: "
              f"1D {_num(row.ms_1d)} ms, 2D {_num(row.ms_2d)} ms ({row.backend}), 2D/1D {_num(row.ratio, 2)} "
              f"{row.note}".rstrip(), flush=True)
        save()
    print("\n" + format_table(rows))
    if args.out is not None:
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
