#!/usr/bin/env python3
"""This checkout's CUDA scan kernel against an earlier version of it, on the same tensors and GPU.

The earlier version is a module built by ``dev/gpu/cuda_baseline.py`` (by default kernel v2, the
last commit before the v3 work). Both are called the same way, through their Python bindings
(``forward`` / ``backward``, no autograd, no dispatch), so the times differ only by the kernels:

    fwd      forward(save_carries=False)
    fwd+bwd  forward(save_carries=True) + backward(dy, carries)

per shape of ``dev/gpu/bench_scan_cuda.py`` (model shapes first) and dtype: median milliseconds of
each (CUDA events; the two versions alternate, each its warm-up first), speedup = baseline time /
this checkout's time, and the largest difference between the two versions' y (both must agree
with the fp64 reference within the tested bounds; a large difference means one of them is wrong).

    python dev/gpu/cuda_baseline.py export && python dev/gpu/cuda_baseline.py build
    python dev/gpu/bench_cuda_versions.py --families model --out benchmarks/scan_cuda_versions.md
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
from typing import Callable, Optional

import torch

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

import bench_scan_cuda as scan_bench  # noqa: E402  (puts the checkout on sys.path)
import cuda_baseline  # noqa: E402
from vmamba2d.ops.compiled import extensions  # noqa: E402

Tensor = torch.Tensor


@dataclass
class Comparison:
    shape: scan_bench.Shape
    dtype: str
    fwd_ms: Optional[float] = None  # this checkout
    train_ms: Optional[float] = None
    base_fwd_ms: Optional[float] = None  # the baseline
    base_train_ms: Optional[float] = None
    y_max_diff: Optional[float] = None
    note: str = ""

    @property
    def fwd_speedup(self) -> Optional[float]:
        return _ratio(self.base_fwd_ms, self.fwd_ms)

    @property
    def train_speedup(self) -> Optional[float]:
        return _ratio(self.base_train_ms, self.train_ms)


def _ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return numerator / denominator if numerator and denominator else None


def kernel_steps(module: ModuleType, inputs: dict, dy: Tensor, height: int, width: int
                 ) -> tuple[Callable[[], Tensor], Callable[[], None]]:
    """(forward, forward + backward) of one kernel module on ``inputs`` (u, delta: (batch, dim, L);
    B, C: (batch, groups, N, L); A, D, delta_bias fp32) with delta_softplus on."""
    args = [inputs[k] for k in ("u", "delta", "A", "B", "C", "D", "delta_bias")]

    def forward() -> Tensor:
        return module.forward(*args, True, height, width, False, False)[0]

    def train() -> None:
        _, carry_h, carry_v = module.forward(*args, True, height, width, False, True)
        module.backward(*args, True, height, width, dy, carry_h, carry_v)

    return forward, train


def compare_shape(current: ModuleType, baseline: ModuleType, shape: scan_bench.Shape, dtype_name: str,
                  device: torch.device, warmup: int, repeats: int) -> Comparison:
    """Times both modules on one shape and dtype; the order alternates per repeat."""
    inputs = scan_bench.make_inputs(shape, scan_bench.DTYPES[dtype_name], device)
    dy = torch.randn(inputs["u"].shape, device=device, generator=torch.Generator(device=device).manual_seed(1))
    dy = dy.to(inputs["u"].dtype)
    ours = kernel_steps(current, inputs, dy, shape.height, shape.width)
    theirs = kernel_steps(baseline, inputs, dy, shape.height, shape.width)
    row = Comparison(shape, dtype_name)
    with torch.no_grad():
        row.y_max_diff = (ours[0]().float() - theirs[0]().float()).abs().max().item()
        times = {}
        for index in (0, 1):  # fwd, then fwd+bwd
            for step in (ours[index], theirs[index]):
                scan_bench.time_ms(step, device, warmup, 1)
            samples = ([], [])
            for repeat in range(repeats):
                order = (0, 1) if repeat % 2 == 0 else (1, 0)
                for which in order:
                    step = (ours, theirs)[which][index]
                    samples[which].append(scan_bench.time_ms(step, device, 0, 1))
            times[index] = (statistics.median(samples[0]), statistics.median(samples[1]))
    row.fwd_ms, row.base_fwd_ms = times[0]
    row.train_ms, row.base_train_ms = times[1]
    return row


def _num(value: Optional[float], digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def format_table(rows: list[Comparison], label: str) -> str:
    lines = [
        f"| shape | dtype | fwd ms | fwd ms {label} | fwd speedup | fwd+bwd ms | fwd+bwd ms {label} "
        "| fwd+bwd speedup | max abs y difference | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(f"| {r.shape.label} | {r.dtype} | {_num(r.fwd_ms)} | {_num(r.base_fwd_ms)} | "
                     f"{_num(r.fwd_speedup, 2)}x | {_num(r.train_ms)} | {_num(r.base_train_ms)} | "
                     f"{_num(r.train_speedup, 2)}x | {_num(r.y_max_diff, 6)} | {r.note} |")
    speedups = [(r.fwd_speedup, r.train_speedup) for r in rows if r.fwd_speedup and r.train_speedup]
    if speedups:
        geo = [math.exp(statistics.mean(math.log(s[i]) for s in speedups)) for i in (0, 1)]
        lines.append(f"\nGeometric mean speedup over {len(speedups)} rows: fwd {geo[0]:.2f}x, fwd+bwd {geo[1]:.2f}x.")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, default=cuda_baseline.DEFAULT_DIR,
                        help="the baseline's folder (dev/gpu/cuda_baseline.py build) or module file")
    parser.add_argument("--families", nargs="+", default=["model"], choices=["table3", "model"])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(scan_bench.DTYPES))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop starting new shapes after this many seconds")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_cuda_versions: no CUDA device is visible; nothing measured.")
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    current = extensions.cuda_extension()
    if current is None or not current.kernel_image_available(device.index):
        print("bench_cuda_versions: this checkout's CUDA kernel is not built for this GPU "
              "(make gpu-compare, or gpu-check --nvcc-build, builds it).")
        return 2
    folder = args.baseline if args.baseline.is_dir() else args.baseline.parent
    info = cuda_baseline.read_info(folder) or {"short": "unknown", "subject": ""}
    baseline = cuda_baseline.load(args.baseline)
    if not baseline.kernel_image_available(device.index):
        print(f"bench_cuda_versions: the baseline {args.baseline} has no kernel image for this GPU.")
        return 2
    label = info["short"]
    deadline = time.monotonic() + args.max_seconds if args.max_seconds else math.inf
    rows = []
    table3_maps = dict(scan_bench.TABLE3_MAPS)
    for shape in scan_bench.default_shapes(args.families, table3_maps):
        for dtype_name in args.dtypes:
            if time.monotonic() > deadline:
                rows.append(Comparison(shape, dtype_name, note="not measured: --max-seconds reached"))
                continue
            try:
                row = compare_shape(current, baseline, shape, dtype_name, device, args.warmup, args.repeats)
            except Exception as err:  # reported in the row, not fatal for the run
                torch.cuda.empty_cache()
                row = Comparison(shape, dtype_name, note=f"error: {type(err).__name__}: {str(err)[:120]}")
            rows.append(row)
            print(f"  {shape.label} {dtype_name}: fwd {_num(row.fwd_ms)} vs {_num(row.base_fwd_ms)} ms, "
                  f"fwd+bwd {_num(row.train_ms)} vs {_num(row.base_train_ms)} ms {row.note}".rstrip(), flush=True)
    header = "\n".join([
        "# CUDA scan kernel: this checkout against an earlier version (dev/gpu/bench_cuda_versions.py)",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- this checkout: {scan_bench._git_commit()}; baseline: {label} ({info.get('subject', '')})",
        f"- device: {torch.cuda.get_device_name(device)}; torch {torch.__version__} (CUDA {torch.version.cuda})",
        f"- time: CUDA events, median of {args.repeats} alternating calls after {args.warmup} warm-up calls each; "
        "both through their bindings (no autograd); speedup = baseline ms / this checkout's ms",
        f"- command: `python dev/gpu/bench_cuda_versions.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
    ])
    table = format_table(rows, label)
    print("\n" + table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(header + "\n\n" + table + "\n")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
