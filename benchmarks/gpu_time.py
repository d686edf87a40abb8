"""Where a CUDA step's GPU time goes: kernel time by kind, and how much of the step the GPU is idle.

``profile_step(step)`` runs ``step()`` once under torch.profiler with CUDA activity, reads the
kernels, copies and memsets back from the exported Chrome trace (a stable, public format) and
returns a :class:`GpuTime`: the summed duration of each kind of kernel (:func:`kernel_kind`: our scan
forward and backward, GEMM, convolution, layer norm, elementwise, copies and casts, ...), the time
the GPU was busy with anything (the union of the intervals, so overlapping streams count once) and
the step's wall time. A busy share well under 1 means the GPU waits on the host (launch glue,
Python) or on synchronisation, which no kernel tuning recovers.

Used by ``benchmarks/bench_model.py --profile`` on CUDA; the parsing runs anywhere (tests feed it
a hand-written trace).
"""
from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

# (kind, pattern on the lower-cased kernel name), first match wins: our kernels before the
# libraries' (an NVRTC scan kernel name has no library marker), convolutions before GEMMs (cuDNN's
# implicit-GEMM convolutions carry "gemm" in their names).
KERNEL_KINDS: tuple[tuple[str, re.Pattern], ...] = tuple((kind, re.compile(pattern)) for kind, pattern in (
    ("scan backward (vmamba2d)", r"(scan2d|vmamba2d).*(bwd|backward)|(bwd|backward).*(scan2d|vmamba2d)"),
    ("scan forward (vmamba2d)", r"scan2d|vmamba2d|rows_cross|carry_scan"),
    ("convolution", r"conv|fprop|dgrad|wgrad|winograd|implicit"),
    ("GEMM", r"gemm|xmma|cutlass|cublas|wgmma|sm\d+_.*(tensorop|hmma)|splitk"),
    ("layer norm", r"layer_?norm|layernorm"),
    ("softmax / cross-entropy", r"softmax|nll_loss|cross_entropy"),
    ("optimizer", r"adam|multi_tensor|foreach|fused_optim"),
    ("reduction", r"reduce"),
    ("copy / cast / layout", r"copy|transpose|permute|\bcat\b|catarray|contiguous|index|gather|scatter"),
    ("elementwise", r"elementwise|vectorized|unrolled|gelu|silu"),
))
OTHER = "other kernels"
MEMCPY = "memcpy / memset"
# Chrome-trace categories of device activity (torch.profiler's kineto export).
_KERNEL_CATEGORIES = {"kernel"}
_TRANSFER_CATEGORIES = {"gpu_memcpy", "gpu_memset"}


def kernel_kind(name: str) -> str:
    """The kind of a CUDA kernel from its (demangled) name; :data:`OTHER` when no pattern matches."""
    lowered = name.lower()
    for kind, pattern in KERNEL_KINDS:
        if pattern.search(lowered):
            return kind
    return OTHER


@dataclass
class GpuTime:
    """GPU time of one step: ``kinds`` maps a kind to (kernel count, summed µs); ``busy_us`` the union
    of all device intervals; ``wall_us`` the step's host wall time, synchronised at both ends."""

    kinds: dict[str, tuple[int, float]] = field(default_factory=dict)
    busy_us: float = 0.0
    wall_us: float = 0.0

    @property
    def kernel_us(self) -> float:
        return sum(us for _, us in self.kinds.values())

    def rows(self) -> list[tuple[str, int, float, float]]:
        """(kind, count, ms, share of the summed device time), largest first."""
        total = self.kernel_us or 1.0
        return [(kind, count, us / 1e3, us / total)
                for kind, (count, us) in sorted(self.kinds.items(), key=lambda item: -item[1][1])]

    def as_dict(self) -> dict:
        return {"kinds": {k: list(v) for k, v in self.kinds.items()}, "busy_us": self.busy_us, "wall_us": self.wall_us}

    @classmethod
    def from_dict(cls, data: dict) -> "GpuTime":
        return cls({k: (int(v[0]), float(v[1])) for k, v in data["kinds"].items()}, data["busy_us"], data["wall_us"])


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by half-open intervals (start, end), overlaps counted once."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        covered += end - max(start, reach)
        reach = end
    return covered


def gpu_time_from_trace(trace: dict, wall_us: float) -> GpuTime:
    """A :class:`GpuTime` from a Chrome trace (``{"traceEvents": [...]}``, complete events with
    ``cat``, ``name``, ``ts`` and ``dur`` in µs) of a step that took ``wall_us``."""
    kinds: dict[str, tuple[int, float]] = {}
    intervals = []
    for event in trace.get("traceEvents", []):
        category = str(event.get("cat", "")).lower()
        if event.get("ph") != "X" or category not in _KERNEL_CATEGORIES | _TRANSFER_CATEGORIES:
            continue
        start, duration = float(event["ts"]), float(event.get("dur", 0.0))
        kind = kernel_kind(event.get("name", "")) if category in _KERNEL_CATEGORIES else MEMCPY
        count, us = kinds.get(kind, (0, 0.0))
        kinds[kind] = (count + 1, us + duration)
        intervals.append((start, start + duration))
    return GpuTime(kinds, union_length(intervals), wall_us)


def profile_step(step: Callable[[], None]) -> GpuTime:
    """Run ``step()`` once (after the caller's warm-up) under torch.profiler with CPU and CUDA
    activity; its kernels by kind, the GPU's busy time and the step's wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return gpu_time_from_trace(trace, wall_us)


def markdown_table(title: str, gpu: GpuTime) -> list[str]:
    """Markdown lines: the step's wall and busy time, then one row per kind."""
    busy_share = gpu.busy_us / gpu.wall_us if gpu.wall_us else 0.0
    lines = [f"### {title}", "",
             f"wall {gpu.wall_us / 1e3:.2f} ms (under the profiler), GPU busy {gpu.busy_us / 1e3:.2f} ms "
             f"({100 * busy_share:.0f}% of the wall time), kernels summed {gpu.kernel_us / 1e3:.2f} ms", "",
             "| kind | kernels | ms | share of device time |", "|---|---:|---:|---:|"]
    lines += [f"| {kind} | {count} | {ms:.2f} | {100 * share:.1f}% |" for kind, count, ms, share in gpu.rows()]
    return lines
