#!/usr/bin/env python
"""MIL throughput at the paper's Table 3 sizes: 2DMambaMIL (2D scan) against the 1D MambaMIL and
the paper's other baselines.

One slide per step (batch 1, as in the paper) whose H x W grid is fully occupied by tissue
(14x14, 56x56, 200x200 by default), 128-d input features. The Mamba models (``MambaMIL2D``,
``MambaMIL`` = the same block on the 1 x L raster sequence, ``mambamil_sr``) run with model width
--dim (128), N = --d-state (16), one block; the other baselines (``--models abmil clam_sb dsmil
transmil s4mil``) at their default (official) sizes. "fwd" = inference (eval mode, torch.inference_mode); "fwd+bwd" = training-mode forward,
cross-entropy and backward (no optimizer step). Time: median of --repeats runs after --warmup
runs, the two models' runs interleaved so that load from other processes hits them alike; slides/s
= 1 / median. Peak memory: tensor memory alive at once during one step above the inputs and
weights (CUDA: torch.cuda.max_memory_allocated; CPU: torch profiler allocation events).

    python benchmarks/bench_mil.py                                  # CPU, prints a markdown table
    python benchmarks/bench_mil.py --sizes 14 56 --repeats 5 --out benchmarks/mil_speed_cpu.md
    python benchmarks/bench_mil.py --device cuda --out benchmarks/mil_speed_cuda.md
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench_scan import git_commit, machine_description, peak_bytes, timed  # noqa: E402  (this script's folder is on sys.path)
from vmamba2d.cpu_malloc import keep_freed_memory  # noqa: E402
from vmamba2d.mil.models import build_model  # noqa: E402
from vmamba2d.ops import backend_info  # noqa: E402

MODEL_LABELS = {"mambamil2d": "2DMambaMIL (2D scan)", "mambamil": "MambaMIL (1D scan)",
                "mambamil_sr": "MambaMIL, SRMamba (1D scan x 2)", "abmil": "ABMIL", "clam_sb": "CLAM-SB",
                "dsmil": "DSMIL", "transmil": "TransMIL", "s4mil": "S4MIL"}
MAMBA_MODELS = ("mambamil2d", "mambamil", "mambamil_sr")
PAPER_THROUGHPUT = {  # paper Table 3, inference, feature maps per second (GPU not named)
    ("mambamil", 14): 894, ("mambamil", 56): 752, ("mambamil", 200): 203,
    ("mambamil2d", 14): 655, ("mambamil2d", 56): 625, ("mambamil2d", 200): 185,
}


@dataclass
class Case:
    model: str
    size: int
    fwd_s: list[float] = field(default_factory=list)
    fwd_cpu_s: list[float] = field(default_factory=list)
    train_s: list[float] = field(default_factory=list)
    train_cpu_s: list[float] = field(default_factory=list)
    fwd_peak: Optional[int] = None
    train_peak: Optional[int] = None


def make_slide(size: int, in_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A fully occupied size x size slide: features (L, in_dim), coords (L, 2) in raster order."""
    gen = torch.Generator().manual_seed(size)
    rows, cols = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    coords = torch.stack([cols.flatten(), rows.flatten()], dim=1)
    features = torch.randn(size * size, in_dim, generator=gen)
    return features.to(device), coords.to(device)


def make_steps(model: torch.nn.Module, features: torch.Tensor, coords: torch.Tensor,
               amp: bool) -> tuple[Callable[[], None], Callable[[], None]]:
    """(inference step, forward + cross-entropy + backward step) of one slide."""
    device_type = features.device.type
    target = torch.zeros(1, dtype=torch.long, device=features.device)

    def autocast():
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=amp)

    def infer() -> None:
        model.eval()
        with torch.inference_mode(), autocast():
            model(features, coords)

    def train() -> None:
        model.train()
        with autocast():
            loss = F.cross_entropy(model(features, coords)["logits"].float(), target)
        loss.backward()
        model.zero_grad(set_to_none=True)

    return infer, train


def run_size(size: int, args: argparse.Namespace, device: torch.device) -> list[Case]:
    features, coords = make_slide(size, args.in_dim, device)
    models, steps, cases = {}, {}, []
    for name in args.models:
        torch.manual_seed(0)
        sizes = (dict(dim=args.dim, d_state=args.d_state, scan_backend=args.scan_backend)
                 if name in MAMBA_MODELS else {})
        models[name] = build_model(name, in_dim=args.in_dim, num_classes=2, **sizes).to(device)
        steps[name] = make_steps(models[name], features, coords, args.amp)
        cases.append(Case(name, size))
    modes = [("fwd", 0)] + ([] if args.no_train else [("train", 1)])
    for mode, which in modes:
        for case in cases:
            for _ in range(args.warmup):
                steps[case.model][which]()
        for _ in range(args.repeats):
            for case in cases:
                wall, cpu = timed(steps[case.model][which], device)
                getattr(case, f"{mode}_s").append(wall)
                getattr(case, f"{mode}_cpu_s").append(cpu)
        if not args.no_memory:
            for case in cases:
                setattr(case, f"{mode}_peak", peak_bytes(steps[case.model][which], device))
    return cases


def _rate(times: list[float]) -> str:
    return f"{1.0 / statistics.median(times):,.2f}" if times else "-"


def _ms(times: list[float]) -> str:
    return f"{1e3 * statistics.median(times):,.1f}" if times else "-"


def _mb(nbytes: Optional[int]) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:,.1f}"


def _ratio(two_d: Case, one_d: Case, mode: str) -> str:
    """Median time of the 2D model over the 1D model's, wall clock and (CPU time)."""
    wall, cpu = getattr(two_d, f"{mode}_s"), getattr(two_d, f"{mode}_cpu_s")
    if not wall:
        return "-"
    return (f"{statistics.median(wall) / statistics.median(getattr(one_d, f'{mode}_s')):.2f}x "
            f"({statistics.median(cpu) / statistics.median(getattr(one_d, f'{mode}_cpu_s')):.2f}x)")


def format_table(cases: list[Case]) -> str:
    lines = [
        "| grid | model | fwd slides/s | fwd ms | fwd CPU ms | fwd+bwd slides/s | fwd+bwd ms | fwd+bwd CPU ms "
        "| peak MB fwd | peak MB fwd+bwd | 2D / 1D fwd time (CPU time) | 2D / 1D fwd+bwd time (CPU time) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_key = {(c.model, c.size): c for c in cases}
    for c in cases:
        one_d = by_key.get(("mambamil", c.size))
        ratios = [_ratio(c, one_d, mode) if c.model == "mambamil2d" and one_d is not None else "" for mode in ("fwd", "train")]
        lines.append(
            f"| {c.size}x{c.size} | {MODEL_LABELS.get(c.model, c.model)} | {_rate(c.fwd_s)} | {_ms(c.fwd_s)} | "
            f"{_ms(c.fwd_cpu_s)} | {_rate(c.train_s)} | {_ms(c.train_s)} | {_ms(c.train_cpu_s)} | "
            f"{_mb(c.fwd_peak)} | {_mb(c.train_peak)} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines)


# What this benchmark measures: uncommitted changes there mark the commit line.
MEASURED_PATHS = ("csrc", "vmamba2d", "benchmarks/bench_mil.py")


def report_header(args: argparse.Namespace, device: torch.device) -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    info = backend_info()
    scan = args.scan_backend if args.scan_backend != "auto" else info["auto_cuda" if device.type == "cuda" else "auto_cpu"]
    return "\n".join([
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {git_commit(MEASURED_PATHS)}",
        f"- machine: {machine_description(device)}; load average at start: {load}",
        f"- software: python {platform.python_version()}, torch {torch.__version__}; scan backend: {scan}",
        f"- settings: one slide per step, grid fully occupied, in_dim {args.in_dim}; Mamba models dim {args.dim}, "
        f"N {args.d_state}, 1 block, conv 1d; other baselines at their default sizes; "
        f"{'bf16 autocast' if args.amp else 'fp32'}; "
        f"median of {args.repeats} runs after {args.warmup} warm-up, models interleaved",
        "- times: wall clock; \"CPU ms\" = CPU time of the process over the step, summed over its threads",
        "- peak memory: tensor memory alive at once during one step above the inputs and weights "
        + ("(torch.cuda.max_memory_allocated)" if device.type == "cuda" else "(torch profiler allocation events)"),
        f"- CPU malloc: {'freed memory kept for reuse (vmamba2d.cpu_malloc.keep_freed_memory())' if args.malloc == 'keep' else 'the C library defaults'}",
        f"- command: `python benchmarks/bench_mil.py {' '.join(sys.argv[1:])}`",
    ])


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[14, 56, 200], help="square grid sides")
    parser.add_argument("--models", nargs="+", default=["mambamil2d", "mambamil"], choices=sorted(MODEL_LABELS))
    parser.add_argument("--in-dim", type=int, default=128)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--d-state", type=int, default=16)
    parser.add_argument("--scan-backend", default="auto")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-train", action="store_true", help="inference only")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--malloc", choices=["keep", "default"], default="default",
                        help="keep: vmamba2d.cpu_malloc.keep_freed_memory() first; default: glibc's own thresholds, as the "
                             "MIL CLI runs (default)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    args = parser.parse_args(argv)
    if min(args.sizes) < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--sizes and --repeats must be >= 1, --warmup >= 0")
    return args


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if args.malloc == "keep":
        keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    header = report_header(args, device)
    print(header, flush=True)
    cases = []
    for size in args.sizes:
        for case in run_size(size, args, device):
            cases.append(case)
            print(f"  {size}x{size} {case.model}: fwd {_ms(case.fwd_s)} ms, fwd+bwd {_ms(case.train_s)} ms", flush=True)
    table = format_table(cases)
    print("\n" + table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"# MIL throughput ({device.type})\n\n{header}\n\n{table}\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
