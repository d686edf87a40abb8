#!/usr/bin/env python
"""Benchmark the four-route op against scanning the routes one by one on route-order copies.

For each SS2D call of vmamba2d_tiny at 224 (stage maps 56x56 / 28x28 / 14x14 / 7x7 with 96 / 192 /
384 / 768 channels, N = 1, the paper's four 2D routes, or their flat 1D versions for VMamba) and
each backend, times

    fused      ``cross_selective_scan_2d(..., backend=B)``: one op for all routes (native on
               backends that have a route kernel, see ``backend_info()["cross_scan"]``)
    per-route  ``cross_scan_per_route(..., backend=B)``: route-order copies of u, delta, B, C, one
               single-route scan per route, outputs permuted back and summed

forward (no grad) and forward + backward, median of --repeats runs after a warm-up run, the two
interleaved, each call timed alone between two synchronisations (so on a GPU a host cost above the
kernel's shows), and the fused forward once more as --burst calls issued back to back with one
synchronisation after the last (CUDA events on a GPU): the host queues the next call while the GPU
runs one, so a host cost below the kernel's is hidden there. Prints a markdown table (fused / per-route time ratio: below 1 means the fused op is
faster); ``--out FILE`` also writes it with the machine, date, commit and settings.

    python benchmarks/bench_cross_scan.py                                  # CPU, cpu backend, batch 8
    python benchmarks/bench_cross_scan.py --device cuda --backends cuda triton --batch 128
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from vmamba2d.ops import backend_info, cross_selective_scan_2d, route_set  # noqa: E402
from vmamba2d.ops.interface import cross_scan_per_route  # noqa: E402

TINY_STAGES = ((56, 96), (28, 192), (14, 384), (7, 768))  # (map side, channels) at 224


def make_inputs(batch: int, dim: int, side: int, device: str, dtype: torch.dtype, routes: int = 4) -> dict:
    """Random inputs of one SS2D call: u (batch, dim, side, side), per-route delta / B / C, A, D, bias."""
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
    return dict(
        u=rand(batch, dim, side, side),
        delta=rand(batch, routes, dim, side, side) * 0.5 - 1.0,
        A=-(torch.rand(routes * dim, 1, generator=gen) + 0.5).to(device),
        B=rand(batch, routes, 1, side, side),
        C=rand(batch, routes, 1, side, side),
        D=torch.ones(routes * dim, device=device),
        delta_bias=torch.zeros(routes * dim, device=device),
    )


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _step(fn, inputs: dict, backward: bool, grad_out: torch.Tensor):
    if not backward:
        def run():
            with torch.no_grad():
                fn(inputs)
        return run
    leaves = {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}

    def run_with_backward():
        fn(leaves).backward(grad_out)
        for leaf in leaves.values():
            leaf.grad = None
    return run_with_backward


def time_interleaved(steps: dict, repeats: int, device: str) -> dict:
    """Median seconds per call of each step, runs interleaved after one warm-up call each."""
    for step in steps.values():
        step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            _synchronize(device)
            start = time.perf_counter()
            step()
            _synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def time_back_to_back(step, calls: int, device: str) -> float:
    """Seconds per call of ``calls`` calls of ``step`` issued back to back after a warm-up call, with
    one synchronisation after the last (CUDA events on a GPU, the host clock on a CPU)."""
    step()
    _synchronize(device)
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    begin = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - begin) / calls


def measure(backend: str, scan: str, batch: int, side: int, dim: int, args: argparse.Namespace) -> dict:
    routes = route_set("cross", scan)
    dtype = getattr(torch, args.dtype)
    inputs = make_inputs(batch, dim, side, args.device, dtype)
    grad_out = torch.randn(batch, dim, side, side, device=args.device, dtype=dtype)

    def fused(x):
        return cross_selective_scan_2d(**x, routes=routes, backend=backend)

    def per_route(x):
        return cross_scan_per_route(**x, delta_softplus=True, routes=routes, backend=backend, out_dtype=x["u"].dtype)

    row = dict(backend=backend, scan=scan, batch=batch, side=side, dim=dim)
    for phase, backward in (("fwd", False), ("fwd+bwd", True)):
        steps = {name: _step(fn, inputs, backward, grad_out) for name, fn in (("fused", fused), ("per_route", per_route))}
        result = time_interleaved(steps, args.repeats, args.device)
        row[f"{phase} fused ms"] = 1e3 * result["fused"]
        row[f"{phase} per-route ms"] = 1e3 * result["per_route"]
    row["fwd fused ms back to back"] = 1e3 * time_back_to_back(_step(fused, inputs, False, grad_out), args.burst,
                                                              args.device)
    return row


def _header(args: argparse.Namespace) -> list[str]:
    def git(*cmd: str) -> str:
        out = subprocess.run(["git", *cmd], capture_output=True, text=True, cwd=REPO_ROOT)
        return out.stdout.strip() or "unknown"

    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") != "unknown" else ""
    if args.device == "cuda":
        machine = torch.cuda.get_device_name()
    else:
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"
    load = os.getloadavg()
    return [
        f"# Four-route op vs per-route copies ({args.device})",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {git('rev-parse', '--short', 'HEAD')}{dirty}",
        f"- machine: {machine}; load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}",
        f"- torch {torch.__version__}; cross_scan modes: {backend_info()['cross_scan']}",
        f"- settings: vmamba2d_tiny SS2D shapes at 224, batch {args.batch}, N = 1, 4 routes, {args.dtype}, "
        f"median of {args.repeats} interleaved runs after one warm-up, each call synchronised alone; "
        f"\"back to back\": {args.burst} fused forward calls with one synchronisation after the last",
        "",
    ]


def _table(rows: list[dict]) -> list[str]:
    lines = ["| backend | scan | map | channels | fwd fused ms | fwd per-route ms | fwd ratio | "
             "fwd+bwd fused ms | fwd+bwd per-route ms | fwd+bwd ratio | fwd fused ms back to back |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["backend"], r["scan"], f"{r['side']}x{r['side']}", str(r["dim"])]
        for phase in ("fwd", "fwd+bwd"):
            fused, per_route = r[f"{phase} fused ms"], r[f"{phase} per-route ms"]
            cells += [f"{fused:.2f}", f"{per_route:.2f}", f"{fused / per_route:.2f}"]
        cells.append(f"{r['fwd fused ms back to back']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--backends", nargs="+", default=None, help="default: cpu on CPU, cuda triton on GPU")
    parser.add_argument("--scans", nargs="+", choices=["2d", "1d"], default=["2d", "1d"])
    parser.add_argument("--batch", type=int, default=None, help="default: 8 on CPU, 128 on GPU")
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3], help="tiny stages to measure")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--burst", type=int, default=None,
                        help="fused forward calls timed back to back (default: 20 on a GPU, 2 on a CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a GPU")
    args.burst = args.burst or (20 if args.device == "cuda" else 2)
    if args.repeats < 1 or args.burst < 1 or any(s not in range(4) for s in args.stages):
        parser.error("--repeats and --burst must be >= 1 and --stages values in 0..3")
    args.backends = args.backends or (["cuda", "triton"] if args.device == "cuda" else ["cpu"])
    args.batch = args.batch or (128 if args.device == "cuda" else 8)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for backend in args.backends:
        for scan in args.scans:
            for stage in args.stages:
                side, dim = TINY_STAGES[stage]
                rows.append(measure(backend, scan, args.batch, side, dim, args))
                print(f"{backend} {scan} {side}x{side}x{dim}: done", file=sys.stderr)
    text = "\n".join(_header(args) + _table(rows)) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        temporary = args.out.with_suffix(args.out.suffix + ".tmp")
        temporary.write_text(text)
        os.replace(temporary, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
