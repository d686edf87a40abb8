#!/usr/bin/env python
"""GPU benchmark of the 2D selective scan against the memory-bandwidth floor (docs/benchmarks.md).

Run as ``python benchmarks/bench_scan.py --device cuda [options]`` (or this file directly).

Shapes:
    table3  the paper's Table 3 operator setting: 1-channel maps, N = 16, 14x14 / 56x56 / 200x200,
            a batch of maps large enough to fill the GPU (--table3-maps)
    model   the SS2D calls of vmamba2d_tiny at batch 128: 56x56 x 384 channels, 28x28 x 768,
            14x14 x 1536, 7x7 x 3072 (4 groups: one per scan route), N = 1
each in every --dtypes (u, delta, B, C and y in that dtype; A, D, delta_bias fp32).

Backends (rows): every GPU backend available here (cuda: our kernel, when built with an image for
this GPU; triton: when importable; torch: the vectorised PyTorch scan, skipped where its state maps
would not fit), plus mamba_ssm's 1D selective_scan_fn when importable. Each of our backends also
runs the 1D path at the same L: the same tensors as one 1 x L map through the same backend.

Per row: forward and forward+backward time (CUDA events, --warmup calls, median of --repeats),
bytes that must move (BYTES_FORMULA) and the achieved forward bandwidth as a share of the
device-to-device copy bandwidth measured at the start of the same run, peak extra memory of a
forward+backward step (torch.cuda.max_memory_allocated above the inputs: y, the gradients and
every workspace), and the ratios to the 1D path and to mamba_ssm. Targets (issue 10) are columns
with a pass / fail mark, not assertions:
    T1  forward >= 70% of copy bandwidth (model shapes only)
    T2  forward+backward <= 3.5x forward
    T3  2D / 1D throughput >= 0.9 (forward and forward+backward)
    T4  peak extra memory <= 1.2x the 1D path's
"""
from __future__ import annotations

import argparse
import datetime
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from vmamba2d.ops import backend_info, selective_scan_2d
from vmamba2d.ops.compiled import extensions  # noqa: E402
from vmamba2d.ops.interface import BACKENDS  # noqa: E402

Tensor = torch.Tensor

BYTES_FORMULA = ("bytes = s * (2*b*d*L [u, delta] + 2*b*g*N*L [B, C, once per group]) + s_y * b*d*L [y] "
                 "+ 4 * (d*N + 2*d) [A, D, delta_bias]; s = input element size, s_y = output element size")
TABLE3_MAPS = {14: 8192, 56: 1024, 200: 128}
MODEL_SHAPES = ((56, 384), (28, 768), (14, 1536), (7, 3072))
MODEL_BATCH, MODEL_GROUPS = 128, 4
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TARGET_COPY_SHARE, TARGET_TRAIN_OVER_FWD, TARGET_2D_OVER_1D, TARGET_MEMORY_VS_1D = 0.70, 3.5, 0.9, 1.2


@dataclass(frozen=True)
class Shape:
    family: str  # "table3" or "model"
    batch: int
    dim: int
    groups: int
    nstate: int
    height: int
    width: int

    @property
    def length(self) -> int:
        return self.height * self.width

    @property
    def label(self) -> str:
        extra = f" x {self.dim} ch" if self.family == "model" else f" x {self.batch} maps"
        return f"{self.family} {self.height}x{self.width}{extra}"


def default_shapes(families: list[str], table3_maps: dict[int, int]) -> list[Shape]:
    """Model shapes first: under --max-seconds they are the ones measured before time runs out."""
    shapes = []
    if "model" in families:
        shapes += [Shape("model", MODEL_BATCH, dim, MODEL_GROUPS, 1, s, s) for s, dim in MODEL_SHAPES]
    if "table3" in families:
        shapes += [Shape("table3", table3_maps[s], 1, 1, 16, s, s) for s in sorted(table3_maps)]
    return shapes


def bytes_moved(shape: Shape, dtype: torch.dtype, out_dtype: Optional[torch.dtype] = None) -> int:
    """The bytes a forward must move at least (BYTES_FORMULA): inputs read once, y written once."""
    s = torch.empty((), dtype=dtype).element_size()
    s_y = torch.empty((), dtype=out_dtype or dtype).element_size()
    b, d, g, n, length = shape.batch, shape.dim, shape.groups, shape.nstate, shape.length
    return s * (2 * b * d * length + 2 * b * g * n * length) + s_y * b * d * length + 4 * (d * n + 2 * d)


def make_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict[str, Tensor]:
    """Scan inputs in the range a freshly initialised 2DVMamba layer feeds the op, drawn on ``device``:
    u, B, C ~ randn; delta = 0.5 randn; A = -(1..N); D = 1; delta_bias = softplus^-1 of steps in
    [1e-3, 0.1]. u, delta: (batch, dim, L); B, C: (batch, groups, N, L); A: (dim, N)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    b, d, g, n, length = shape.batch, shape.dim, shape.groups, shape.nstate, shape.length

    def randn(*size: int) -> Tensor:
        return torch.randn(*size, generator=gen, device=device).to(dtype)

    step = torch.exp(torch.empty(d, device=device).uniform_(math.log(1e-3), math.log(0.1), generator=gen))
    return dict(
        u=randn(b, d, length), delta=0.5 * randn(b, d, length),
        A=-torch.arange(1, n + 1, dtype=torch.float32, device=device).repeat(d, 1),
        B=randn(b, g, n, length), C=randn(b, g, n, length),
        D=torch.ones(d, device=device), delta_bias=step + torch.log(-torch.expm1(-step)),
    )


# ------------------------------------------------------------------------------------------------
# backends
# ------------------------------------------------------------------------------------------------
def _mamba_ssm_scan() -> Optional[Callable]:
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except Exception:  # not installed, or installed without its compiled kernel
        return None
    return selective_scan_fn


def available_backends(device: torch.device) -> tuple[list[str], list[str]]:
    """(our backends to benchmark on the GPU ``device``, notes on those left out)."""
    chosen, notes = [], []
    if extensions.cuda_extension() is not None and extensions.cuda_kernel_usable(device):
        chosen.append("cuda")
    else:
        notes.append(f"cuda: not benchmarked ({extensions.failure_reason('cuda')})")
    if "triton" in BACKENDS and backend_info().get("triton"):
        chosen.append("triton")
    else:
        notes.append("triton: not benchmarked (backend not available here)")
    chosen.append("torch")
    if _mamba_ssm_scan() is None:
        notes.append("mamba_ssm: not importable, no comparison with its 1D selective_scan_fn")
    return chosen, notes


def scan_call(backend: str, one_d: bool, shape: Shape) -> Callable[[dict], Tensor]:
    """fn(inputs) -> y for our ``backend`` on the 2D grid, or on one 1 x L map when ``one_d``."""
    height, width = (1, shape.length) if one_d else (shape.height, shape.width)
    return lambda t: selective_scan_2d(**t, delta_softplus=True, height=height, width=width, backend=backend)


def mamba_ssm_call() -> Callable[[dict], Tensor]:
    scan = _mamba_ssm_scan()
    return lambda t: scan(t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], None, t["delta_bias"], True)


def torch_backend_fits(shape: Shape, one_d: bool, limit_bytes: int) -> bool:
    """The torch backend materialises the per-state maps at every doubling step of its scans."""
    steps = math.ceil(math.log2(max(shape.length if one_d else max(shape.height, shape.width), 2)))
    state_maps = 4 * shape.batch * shape.dim * shape.nstate * shape.length
    return state_maps * (6 + 10 * steps) <= limit_bytes


# ------------------------------------------------------------------------------------------------
# measurement
# ------------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(step: Callable[[], None], device: torch.device, warmup: int, repeats: int) -> float:
    """Median milliseconds of ``step`` over ``repeats`` calls after ``warmup`` untimed calls (CUDA
    events on a GPU, the host clock around a synchronised call elsewhere)."""
    for _ in range(warmup):
        step()
    _sync(device)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            step()
            samples.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(samples)


def copy_bandwidth(device: torch.device, nbytes: int, warmup: int = 3, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, warmup, repeats)
    return 2 * src.numel() * 4 / (ms / 1e3)


def peak_extra_bytes(step: Callable[[], None], device: torch.device) -> Optional[int]:
    """Peak memory allocated during one ``step`` above what was allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    _sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    _sync(device)
    return torch.cuda.max_memory_allocated(device) - base


@dataclass
class Timing:
    fwd_ms: Optional[float] = None
    train_ms: Optional[float] = None
    peak_train: Optional[int] = None
    note: str = ""


def measure(fn: Callable[[dict], Tensor], inputs: dict, device: torch.device, warmup: int, repeats: int) -> Timing:
    """Forward (no grad) and forward+backward (every input requires grad) of ``fn``."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()}
    dy = torch.randn(inputs["u"].shape, device=device, generator=torch.Generator(device=device).manual_seed(1))
    dy = dy.to(inputs["u"].dtype)

    def forward() -> None:
        with torch.no_grad():
            fn(inputs)

    def train() -> None:
        fn(leaves).backward(dy)
        for leaf in leaves.values():  # the gradients count towards the step's peak, then go
            leaf.grad = None

    timing = Timing()
    timing.fwd_ms = time_ms(forward, device, warmup, repeats)
    timing.train_ms = time_ms(train, device, warmup, repeats)
    timing.peak_train = peak_extra_bytes(train, device)
    return timing


@dataclass
class Row:
    shape: Shape
    dtype: str
    backend: str
    two_d: Timing = field(default_factory=Timing)
    one_d: Timing = field(default_factory=Timing)
    bytes: int = 0


def _guarded(action: Callable[[], Timing], device: torch.device) -> Timing:
    """Run a measurement; an error (out of memory, a kernel that fails) becomes the row's note."""
    try:
        return action()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return Timing(note="out of memory")
    except Exception as err:  # a backend that fails here is reported, not fatal for the run
        if device.type == "cuda":
            torch.cuda.empty_cache()
        first_line = (str(err).strip().splitlines() or [""])[0][:160]
        return Timing(note=f"error: {type(err).__name__}: {first_line}")


def run_shape(shape: Shape, dtype_name: str, backends: list[str], device: torch.device, args,
              deadline: float) -> list[Row]:
    """Every backend (2D and its 1D path) and mamba_ssm on one shape and dtype."""
    dtype = DTYPES[dtype_name]
    inputs = make_inputs(shape, dtype, device)
    limit = int(args.memory_limit_gb * 2**30)
    rows = []
    variants = [(b, False) for b in backends] + [(b, True) for b in backends]
    for backend in backends:
        rows.append(Row(shape, dtype_name, backend, bytes=bytes_moved(shape, dtype)))
    if _mamba_ssm_scan() is not None and device.type == "cuda":
        rows.append(Row(shape, dtype_name, "mamba_ssm (1D)", bytes=bytes_moved(shape, dtype)))
        variants.append(("mamba_ssm (1D)", True))
    by_backend = {row.backend: row for row in rows}
    for backend, one_d in variants:
        row = by_backend[backend]
        if time.monotonic() > deadline:
            timing = Timing(note="not measured: --max-seconds reached")
        elif backend == "torch" and not torch_backend_fits(shape, one_d, limit):
            timing = Timing(note=f"skipped: state maps over --memory-limit-gb {args.memory_limit_gb}")
        else:
            fn = mamba_ssm_call() if backend.startswith("mamba_ssm") else scan_call(backend, one_d, shape)
            timing = _guarded(lambda: measure(fn, inputs, device, args.warmup, args.repeats), device)
        if one_d:
            row.one_d = timing
        else:
            row.two_d = timing
    del inputs
    return rows


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------
def _num(value: Optional[float], digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _mark(ok: Optional[bool]) -> str:
    return "—" if ok is None else ("pass" if ok else "FAIL")


@dataclass
class Derived:
    """What a row's table cells and target marks are computed from."""

    fwd_gbs: Optional[float] = None
    copy_share: Optional[float] = None
    train_over_fwd: Optional[float] = None
    ratio_fwd: Optional[float] = None  # 2D throughput / 1D throughput = t_1D / t_2D
    ratio_train: Optional[float] = None
    memory_vs_1d: Optional[float] = None
    vs_mamba: Optional[float] = None  # mamba_ssm 1D forward time / our 2D forward time
    targets: dict = field(default_factory=dict)


def derive(row: Row, copy_bytes_per_s: float, mamba: Optional[Row]) -> Derived:
    out = Derived()
    t2, t1 = row.two_d, row.one_d
    if t2.fwd_ms:
        out.fwd_gbs = row.bytes / (t2.fwd_ms / 1e3) / 1e9
        out.copy_share = row.bytes / (t2.fwd_ms / 1e3) / copy_bytes_per_s
    if t2.fwd_ms and t2.train_ms:
        out.train_over_fwd = t2.train_ms / t2.fwd_ms
    if t2.fwd_ms and t1.fwd_ms:
        out.ratio_fwd = t1.fwd_ms / t2.fwd_ms
    if t2.train_ms and t1.train_ms:
        out.ratio_train = t1.train_ms / t2.train_ms
    if t2.peak_train is not None and t1.peak_train:
        out.memory_vs_1d = t2.peak_train / t1.peak_train
    if mamba is not None and mamba.one_d.fwd_ms and t2.fwd_ms:
        out.vs_mamba = mamba.one_d.fwd_ms / t2.fwd_ms
    if row.backend.startswith("mamba_ssm"):
        return out
    out.targets = {
        "T1": None if row.shape.family != "model" or out.copy_share is None else out.copy_share >= TARGET_COPY_SHARE,
        "T2": None if out.train_over_fwd is None else out.train_over_fwd <= TARGET_TRAIN_OVER_FWD,
        "T3": None if out.ratio_fwd is None or out.ratio_train is None
        else min(out.ratio_fwd, out.ratio_train) >= TARGET_2D_OVER_1D,
        "T4": None if out.memory_vs_1d is None else out.memory_vs_1d <= TARGET_MEMORY_VS_1D,
    }
    return out


TABLE_HEADER = (
    "| shape | dtype | backend | fwd ms | fwd+bwd ms | maps/s (fwd) | fwd GB/s | fwd % copy bw | fwd+bwd / fwd "
    "| peak extra MiB | 1D fwd ms | 1D fwd+bwd ms | 2D/1D fwd | 2D/1D fwd+bwd | peak vs 1D | vs mamba_ssm (fwd) "
    "| T1 fwd >= 70% copy | T2 fwd+bwd <= 3.5x | T3 2D/1D >= 0.9 | T4 mem <= 1.2x 1D | note |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|"
)


def format_table(rows: list[Row], copy_bytes_per_s: float) -> str:
    lines = [TABLE_HEADER]
    mambas = {(r.shape, r.dtype): r for r in rows if r.backend.startswith("mamba_ssm")}
    for row in rows:
        d = derive(row, copy_bytes_per_s, mambas.get((row.shape, row.dtype)))
        t2, t1 = row.two_d, row.one_d
        maps = None if not t2.fwd_ms else row.shape.batch * row.shape.dim / (t2.fwd_ms / 1e3)
        peak = None if t2.peak_train is None else t2.peak_train / 2**20
        notes = "; ".join(n for n in (t2.note, ("1D: " + t1.note) if t1.note else "") if n)
        cells = [
            row.shape.label, row.dtype, row.backend, _num(t2.fwd_ms), _num(t2.train_ms),
            "—" if maps is None else f"{maps:,.0f}", _num(d.fwd_gbs, 1),
            "—" if d.copy_share is None else f"{100 * d.copy_share:.0f}%", _num(d.train_over_fwd, 2),
            _num(peak, 1), _num(t1.fwd_ms), _num(t1.train_ms), _num(d.ratio_fwd, 2), _num(d.ratio_train, 2),
            _num(d.memory_vs_1d, 2), _num(d.vs_mamba, 2),
            *(_mark(d.targets.get(t)) for t in ("T1", "T2", "T3", "T4")), notes,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class DeviceLimits:
    """What the CUDA kernel's launch plan depends on: SMs, shared memory (bytes) per SM / per block
    and the compute capability x 10 the kernels running there were compiled for."""
    sm_count: int
    smem_per_sm: int
    smem_per_block: int
    arch: int


def device_limits(device: torch.device, cuda_module) -> Optional[DeviceLimits]:
    """The GPU's limits from torch's device properties and the extension's kernel image for it;
    None where this torch does not report them."""
    props = torch.cuda.get_device_properties(device)
    per_sm = getattr(props, "shared_memory_per_multiprocessor", None)
    per_block = getattr(props, "shared_memory_per_block_optin", None)
    if not per_sm or not per_block:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DeviceLimits(props.multi_processor_count, int(per_sm), int(per_block),
                        cuda_module.kernel_image_arch(index))


def _split_cells(p: dict) -> list[str]:
    """The nvcc build's plan (its ``_launch_plan`` dict) as the table's cells after shape and map."""
    fwd = (f"{p['fwd_channels']} x {p['fwd_warps_per_channel']}, {p['fwd_threads']}, "
           f"{p['fwd_smem_bytes'] / 1024:.1f} KiB, {p['fwd_resident_warps']}")
    bwd = (f"{p['bwd_channels']} x {p['bwd_warps_per_channel']}, {p['bwd_threads']}, "
           f"{p['bwd_smem_bytes'] / 1024:.1f} KiB, {p['bwd_resident_warps']}")
    return [fwd, str(p["fwd_tile_parallel"]), bwd, str(p["bwd_slices"]), str(p["bwd_tile_parallel"])]


def _shape_cells(shapes: dict) -> list[str]:
    """The NVRTC host driver's launch shapes (its ``launch_shapes`` dict) as the table's cells."""
    def one(launch) -> str:
        grid, threads, smem, variant = launch
        return f"{' x '.join(str(g) for g in grid)}, {threads}, {smem / 1024:.1f} KiB, {variant}"
    return [one(shapes["forward"]), one(shapes["backward"])]


SPLIT_HEADER = ("| shape | map | fwd block (channels x warps, threads, smem, warps/SM) | tile-parallel fwd "
                "| bwd block (channels x warps, threads, smem, warps/SM) | bwd slices | tile-parallel bwd |\n"
                "|---|---|---|---|---|---:|---|")
SHAPES_HEADER = ("| shape | map | fwd launch (grid, threads, smem, variant) "
                 "| bwd launch (grid, threads, smem, variant) |\n|---|---|---|---|")


def plan_table(shapes: list[Shape], limits: DeviceLimits, cuda_module, device_index: int = 0) -> str:
    """The CUDA kernel's work split for every shape (2D map and the 1D path's 1 x L map) on ``limits``:
    the nvcc build's ``_launch_plan`` (channels, warps, shared memory, residency), else the NVRTC
    path's ``launch_shapes`` (grid, threads, shared memory, variant on GPU ``device_index``, whose
    limits its host driver reads itself). A row the module cannot plan says why instead."""
    if hasattr(cuda_module, "_launch_plan"):
        header, columns = SPLIT_HEADER, 5

        def cells(shape: Shape, height: int, width: int) -> list[str]:
            return _split_cells(cuda_module._launch_plan(shape.batch, shape.dim, shape.groups, shape.nstate, height,
                                                         width, limits.sm_count, limits.smem_per_sm,
                                                         limits.smem_per_block, arch=limits.arch))
    else:
        header, columns = SHAPES_HEADER, 2

        def cells(shape: Shape, height: int, width: int) -> list[str]:
            if not hasattr(cuda_module, "launch_shapes"):
                raise AttributeError(f"{type(cuda_module).__name__} has neither _launch_plan (nvcc build) "
                                     "nor launch_shapes (NVRTC host driver)")
            return _shape_cells(cuda_module.launch_shapes(shape.batch, shape.dim, shape.groups, shape.nstate, height,
                                                          width, device_index))
    lines = header.splitlines()
    for shape in shapes:
        for label, (height, width) in (("2D", (shape.height, shape.width)), ("1D", (1, shape.length))):
            try:
                row = cells(shape, height, width)
            except Exception as err:  # one shape the planner refuses must not cost the table
                row = [f"no plan: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"]
                row += [""] * (columns - 1)
            lines.append(f"| {shape.label} | {label} {height}x{width} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "csrc", "vmamba2d/ops",
                                 "benchmarks/bench_scan.py", "dev/gpu/bench_scan_cuda.py"],
                               cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()
        return out + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _triton_version() -> str:
    try:
        import triton
    except Exception:
        return "not importable"
    return triton.__version__


def report_header(args, device: torch.device, copy_bytes_per_s: float, notes: list[str]) -> str:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device} (not a GPU run)"
    lines = [
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {_git_commit()}",
        f"- device: {gpu}; torch {torch.__version__} (CUDA {torch.version.cuda}); triton {_triton_version()}",
        f"- copy bandwidth (measured in this run, {args.copy_mb} MiB device-to-device copy, read + write): "
        f"{copy_bytes_per_s / 1e9:,.0f} GB/s",
        f"- {BYTES_FORMULA}",
        f"- time: {'CUDA events' if device.type == 'cuda' else 'host clock'}, median of {args.repeats} after "
        f"{args.warmup} warm-up calls; fwd under torch.no_grad, fwd+bwd = forward with every input requiring "
        "grad + backward of a fixed random dy",
        "- peak extra memory: torch.cuda.max_memory_allocated during one fwd+bwd step minus the memory "
        "allocated before it (y, gradients and workspaces; the inputs excluded)",
        "- 1D path: the same tensors as one 1 x L map through the same backend; 2D/1D = t_1D / t_2D "
        "(throughput ratio); vs mamba_ssm = mamba_ssm selective_scan_fn (1D) fwd time / ours (2D)",
        "- targets (marks, not assertions): T1 fwd >= 70% of copy bandwidth (model shapes); "
        "T2 fwd+bwd <= 3.5x fwd; T3 2D/1D >= 0.9 for fwd and fwd+bwd; T4 peak extra memory <= 1.2x 1D",
        f"- command: `python benchmarks/bench_scan.py {' '.join(sys.argv[1:])}`",
    ]
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda"])
    parser.add_argument("--families", nargs="+", default=["table3", "model"], choices=["table3", "model"])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--backends", nargs="+", help="default: every GPU backend available here")
    parser.add_argument("--table3-maps", type=int, nargs=3, default=[TABLE3_MAPS[s] for s in sorted(TABLE3_MAPS)],
                        metavar=("N14", "N56", "N200"), help="maps per call at 14x14, 56x56, 200x200")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--copy-mb", type=int, default=1024, help="size of the copy-bandwidth reference")
    parser.add_argument("--memory-limit-gb", type=float, default=None,
                        help="skip torch-backend cases above this (default: 40%% of the GPU's memory)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop starting new measurements after this many seconds (rest: 'not measured')")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, device: torch.device, shapes: list[Shape], backends: list[str],
        notes: list[str]) -> tuple[str, str]:
    """Measure everything; returns (header, table)."""
    start = time.monotonic()
    deadline = start + args.max_seconds if args.max_seconds else math.inf
    copy_bytes_per_s = copy_bandwidth(device, args.copy_mb * 2**20)
    header = report_header(args, device, copy_bytes_per_s, notes)
    print(header, flush=True)
    rows = []
    for shape in shapes:
        for dtype_name in args.dtypes:
            for row in run_shape(shape, dtype_name, backends, device, args, deadline):
                rows.append(row)
                print(f"  {shape.label} {dtype_name} {row.backend}: fwd {_num(row.two_d.fwd_ms)} ms, fwd+bwd "
                      f"{_num(row.two_d.train_ms)} ms, 1D fwd {_num(row.one_d.fwd_ms)} ms "
                      f"{row.two_d.note} {row.one_d.note}".rstrip(), flush=True)
    elapsed = time.monotonic() - start
    table = format_table(rows, copy_bytes_per_s)
    cuda_module = extensions.cuda_extension()
    usable = device.type == "cuda" and "cuda" in backends and cuda_module is not None
    limits = device_limits(device, cuda_module) if usable else None
    if limits is not None:
        source = ("warps/SM as modelled by the planner" if hasattr(cuda_module, "_launch_plan") else
                  "as the NVRTC host driver launches the v3 kernels; the v4 forwards' plans: dev/gpu/bench_v4.py")
        table += (f"\n\nCUDA kernel launch plans on this GPU ({limits.sm_count} SMs, "
                  f"{limits.smem_per_sm // 1024} KiB shared memory per SM, {limits.smem_per_block // 1024} KiB "
                  f"per block, kernels compiled for sm_{limits.arch}; {source}):\n\n"
                  + plan_table(shapes, limits, cuda_module, device.index or 0))
    return header + f"\n- benchmark wall time: {elapsed:.0f} s", table


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    device = torch.device("cuda", torch.cuda.current_device())
    if args.memory_limit_gb is None:
        args.memory_limit_gb = round(0.4 * torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    backends, notes = available_backends(device)
    if args.backends:
        backends = args.backends
    table3_maps = dict(zip(sorted(TABLE3_MAPS), args.table3_maps))
    header, table = run(args, device, default_shapes(args.families, table3_maps), backends, notes)
    print()
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("# 2D selective scan GPU benchmark\n\n" + header + "\n\n" + table + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
