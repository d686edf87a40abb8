#!/usr/bin/env python
"""A/B of the CPU four-route op's channel-lane kernels against its per-channel kernels.

The same call with ``VMAMBA2D_CPU_LANES=1`` (one channel per vector lane, the AVX-512 build's
default for fp32 channels-last maps with ``delta_proj_weight``) and ``=0`` (one channel's plane at
a time), alternating every round in one process (the order swapped each round); per variant the
median wall-clock time and process CPU time of a call. Rows: the op alone at vmamba2d_tiny's four
SS2D shapes at 224 (channels-last u, low-rank step sizes, N = 1, the paper's four routes): its
forward (under ``torch.inference_mode``) and, with ``--backward``, its backward op (every
gradient, the low-rank step sizes' and the projection weight's included: the per-channel kernel
forms those from its full-rank ddelta by matmuls); then the whole model's inference (``--model``).

    python tools/bench_lanes.py                       # batch 1 and 8, 2 threads
    python tools/bench_lanes.py --batch 1 --rounds 15 --out benchmarks/cross_scan_lanes_cpu.md
    python tools/bench_lanes.py --batch 8 --backward --model none
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import timm  # noqa: E402
import torch  # noqa: E402

import vmamba2d  # noqa: E402,F401  (registers the models)
from vmamba2d.ops import backend_info, cross_selective_scan_2d  # noqa: E402
from vmamba2d.ops.routes import resolve_routes  # noqa: E402

ENV = "VMAMBA2D_CPU_LANES"
VARIANTS = {"lanes": "1", "per-channel": "0"}
# vmamba2d_tiny at 224: (map side, inner dim, step-size rank) of each stage's SS2D
STAGES = [(56, 96, 6), (28, 192, 12), (14, 384, 24), (7, 768, 48)]


def _stage_inputs(batch: int, side: int, dim: int, rank: int) -> dict:
    """The op's inputs at one stage's shape (channels-last u, low-rank delta and its weight)."""
    gen = torch.Generator().manual_seed(0)
    B, C = (torch.randn(batch, 4, 1, side, side, generator=gen) for _ in range(2))
    return dict(
        u=torch.randn(batch, dim, side, side, generator=gen).contiguous(memory_format=torch.channels_last),
        delta=torch.randn(batch, 4, rank, side, side, generator=gen),
        A=-torch.rand(4 * dim, 1, generator=gen), B=B, C=C,
        D=torch.randn(4 * dim, generator=gen), delta_bias=torch.randn(4 * dim, generator=gen),
        delta_proj_weight=torch.randn(4, dim, rank, generator=gen) * rank**-0.5,
    )


def op_call(batch: int, side: int, dim: int, rank: int):
    """The op's forward at one stage's shape, as a zero-argument call."""
    x = _stage_inputs(batch, side, dim, rank)
    return lambda: cross_selective_scan_2d(**x, delta_softplus=True, routes="cross", backend="cpu")


def op_backward_call(batch: int, side: int, dim: int, rank: int):
    """The op's backward (the custom op the autograd formula calls) at one stage's shape."""
    x = _stage_inputs(batch, side, dim, rank)
    dy = torch.randn(x["u"].shape, generator=torch.Generator().manual_seed(1)).contiguous(
        memory_format=torch.channels_last)
    codes = [route.code for route in resolve_routes("cross")]
    args = [x[name] for name in ("u", "delta", "A", "B", "C", "D", "delta_bias")]
    return lambda: torch.ops.vmamba2d.cross_selective_scan_2d_bwd(*args, True, codes, dy, x["delta_proj_weight"])


def model_call(name: str, batch: int):
    model = timm.create_model(name).eval()
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return lambda: model(x)


def interleaved(call, rounds: int, warmup: int) -> dict:
    """{variant: (median wall ms, median CPU ms)} over `rounds` alternating rounds."""
    times = {name: ([], []) for name in VARIANTS}
    with torch.inference_mode():
        for round_index in range(warmup + rounds):
            order = list(VARIANTS) if round_index % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                os.environ[ENV] = VARIANTS[name]
                wall, cpu = time.perf_counter(), time.process_time()
                call()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if round_index >= warmup:
                    times[name][0].append(wall * 1e3)
                    times[name][1].append(cpu * 1e3)
    os.environ.pop(ENV, None)
    return {name: (statistics.median(w), statistics.median(c)) for name, (w, c) in times.items()}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--model", default="vmamba2d_tiny", help="timm name; 'none' skips the model rows")
    parser.add_argument("--backward", action="store_true", help="also time the op's backward at each shape")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    info = backend_info()
    if info["cpu_isa"] is None:
        print("no CPU kernel: nothing to compare", file=sys.stderr)
        return 1
    os.environ[ENV] = "1"
    if not backend_info()["cpu_channel_lanes"]:
        print(f"the CPU kernel's {info['cpu_isa']} build has no channel-lane kernels (AVX-512 only)", file=sys.stderr)
        return 1
    os.environ.pop(ENV, None)

    rows = []
    for batch in args.batch:
        cases = [(f"op {side}x{side} x {dim} ch, R={rank}", op_call(batch, side, dim, rank))
                 for side, dim, rank in STAGES]
        if args.backward:
            cases += [(f"op backward {side}x{side} x {dim} ch, R={rank}", op_backward_call(batch, side, dim, rank))
                      for side, dim, rank in STAGES]
        if args.model != "none":
            cases.append((f"{args.model} inference", model_call(args.model, batch)))
        for label, call in cases:
            result = interleaved(call, args.rounds, args.warmup)
            lanes, per_channel = result["lanes"], result["per-channel"]
            rows.append(f"| {label} | {batch} | {per_channel[0]:.3f} | {lanes[0]:.3f} | "
                        f"{per_channel[0] / lanes[0]:.2f}x | {per_channel[1] / lanes[1]:.2f}x |")
            print(rows[-1], flush=True)

    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    lines = [
        "# CPU four-route op: channel-lane kernels vs per-channel kernels",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; commit {_commit()}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, torch threads {args.threads}, CPU kernel build "
        f"{info['cpu_isa']}; load average at end {load}",
        f"- torch {torch.__version__}; {args.rounds} alternating rounds after {args.warmup} warm-up rounds, medians; "
        f"`{ENV}=1` (lanes) vs `{ENV}=0` (per-channel)",
        "",
        "| call | batch | per-channel ms | lanes ms | speed-up (wall) | speed-up (CPU time) |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
