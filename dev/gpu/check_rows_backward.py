#!/usr/bin/env python
"""GPU check of the RS backward (N = 1; vmamba2d/ops/compiled/rows_backward_launch.py), which CI runs
only on the host emulation: on a CUDA GPU, per model map (56, 28, 14, 7) and input type (fp32, bf16),
at route 0:

* the gradients of the saving forward + backward against autograd through the fp64 reference on a
  small batch (relative error per gradient), and bit-equality of two runs;
* the time of the RS saving forward + backward, of the RS forward alone (no carries) and of the v3
  forward + backward (the op's path today) at the model's batch, by CUDA events (median of 5 after a
  warm-up).

With --cross, the four-route backward as RS route passes (vmamba2d/ops/compiled/cross_rows_backward.py,
VMamba's cross routes 0, 4, 3, 7) instead: its gradients against the op's v3 backward
(vmamba2d::cross_selective_scan_2d_bwd on the same tensors, relative error per gradient) and
bit-equality of two runs on a small batch, and the times of both at the model's batch.

    python dev/gpu/check_rows_backward.py [--batch 128] [--cross] [--out results.md]

Prints a markdown table (and writes it with --out). Exit 1 when a gradient misses its tolerance or
two runs differ.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from vmamba2d.ops import selective_scan_2d_reference  # noqa: E402
from vmamba2d.ops.compiled import nvrtc, rows_launch, rows_plan  # noqa: E402
from vmamba2d.ops.compiled import rows_backward_launch as rbl  # noqa: E402
from vmamba2d.ops.compiled.cuda_launch import KernelLauncher  # noqa: E402

# (H = W, channels) of the single-route checks (route 0 alone).
MODEL_MAPS = ((56, 192), (28, 384), (14, 768), (7, 1536))
# (H = W, channels) of vmamba2d_tiny's SS2D calls at 224 (ssm_ratio 1: Di = the stage's width).
CROSS_MAPS = ((56, 96), (28, 192), (14, 384), (7, 768))
TOLERANCE = {torch.float32: 5e-5, torch.bfloat16: 1.6e-2}
NAMES = ("u", "delta", "A", "B", "C", "D", "delta_bias")


def inputs(batch, dim, side, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    L = side * side
    x = {"u": torch.randn(batch, dim, L, generator=g), "delta": torch.randn(batch, dim, L, generator=g) * 0.5 - 1,
         "A": -(torch.rand(dim, 1, generator=g) * 1.5 + 0.05), "B": torch.randn(batch, 1, 1, L, generator=g),
         "C": torch.randn(batch, 1, 1, L, generator=g), "D": torch.randn(dim, generator=g),
         "delta_bias": torch.randn(dim, generator=g) * 0.3}
    dy = torch.randn(batch, dim, L, generator=g)
    for k in ("u", "delta", "B", "C"):
        x[k] = x[k].to(dtype)
    return x, dy.to(dtype)


def rs_grads(launcher, x, dy, side):
    plan = rbl.backward_plan(x["u"].element_size(), dy.element_size(), side,
                             rows_plan.alignment(x["u"], x["delta"], x["B"], x["C"], dy))
    args = [x[k] for k in NAMES]
    _, carries = rbl.launch_forward_save(launcher, *args, True, side, side, False, plan)
    return rbl.launch_rows_backward(launcher, *args, True, side, side, dy, carries, plan)


def check(launcher, side, dtype) -> tuple[float, bool]:
    x, dy = inputs(2, 8, side, dtype)
    leaves = {k: x[k].double().requires_grad_() for k in NAMES}
    y = selective_scan_2d_reference(*(leaves[k] for k in NAMES), True, height=side, width=side)
    y.backward(dy.double())
    cuda = {k: v.cuda() for k, v in x.items()}
    first = rs_grads(launcher, cuda, dy.cuda(), side)
    second = rs_grads(launcher, cuda, dy.cuda(), side)
    same = all(torch.equal(a, b) for a, b in zip(first, second))
    worst = 0.0
    for name, got in zip(NAMES, first):
        ref = leaves[name].grad
        worst = max(worst, ((got.double().cpu().reshape(ref.shape) - ref).abs().max() / ref.abs().max()).item())
    return worst, same


def timed(fn, repeats=5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def timings(launcher, batch, dim, side, dtype) -> tuple[float, float, float]:
    from vmamba2d.ops import selective_scan_2d

    x, dy = inputs(batch, dim, side, dtype)
    x = {k: v.cuda() for k, v in x.items()}
    dy = dy.cuda()
    args = [x[k] for k in NAMES]
    plan = rbl.backward_plan(x["u"].element_size(), dy.element_size(), side)
    fwd_plan = rows_plan.rows_plan(x["u"].element_size(), x["u"].element_size(), side, 0)

    def rs_both():
        _, carries = rbl.launch_forward_save(launcher, *args, True, side, side, False, plan)
        rbl.launch_rows_backward(launcher, *args, True, side, side, dy, carries, plan)

    def rs_forward():
        rows_launch.launch_rows_forward(launcher, *args, True, side, side, False, fwd_plan)

    leaves = {k: v.detach().requires_grad_() for k, v in x.items()}

    def v3_both():
        y = selective_scan_2d(*(leaves[k] for k in NAMES), True, height=side, width=side, backend="cuda")
        y.backward(dy)

    return timed(rs_forward), timed(rs_both), timed(v3_both)


def cross_inputs(batch, dim, side, dtype, seed=0, device="cuda"):
    """The four-route op's N = 1 tensors on ``device``, u and dy channels-last as in the models."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x = {"u": rand(batch, dim, side, side).to(dtype).contiguous(memory_format=torch.channels_last),
         "delta": (rand(batch, 4, dim, side, side) * 0.5 - 1).to(dtype),
         "A": -(torch.rand(4 * dim, 1, generator=g) * 1.5 + 0.05), "B": rand(batch, 4, 1, side, side).to(dtype),
         "C": rand(batch, 4, 1, side, side).to(dtype), "D": rand(4 * dim), "delta_bias": rand(4 * dim) * 0.3}
    dy = rand(batch, dim, side, side).to(dtype).contiguous(memory_format=torch.channels_last)
    return {k: v.to(device) for k, v in x.items()}, dy.to(device)


def cross_rows(passes, v3_backward, batch: int, maps=CROSS_MAPS, device: str = "cuda", timer=None,
               title: str = "", cross_save=None) -> tuple[list[str], bool]:
    """The --cross table: per (side, channels) of ``maps`` and fp32 / bf16, the four-route RS backward
    (cross_rows_backward over ``passes``, the carries from ``cross_save`` where it applies) against ``v3_backward`` (the op's backward, same arguments as
    vmamba2d::cross_selective_scan_2d_bwd): the largest relative error over the gradients and
    bit-equality of two runs at batch 2 x 8 channels, then both timed by ``timer`` (default
    :func:`timed`) at ``batch`` x channels. Returns (markdown lines, every row within 4x the
    tolerance and bit-equal)."""
    from vmamba2d.ops.compiled.cross_rows_backward import cross_rows_backward

    timer = timer or timed
    routes = [0, 4, 3, 7]

    def rs(x, dy):
        return cross_rows_backward(*passes, *(x[k] for k in NAMES), True, routes, dy, cross_save=cross_save)

    def v3(x, dy):
        return v3_backward(*(x[k] for k in NAMES), True, routes, dy)[:7]

    lines = [f"Four-route RS backward (route passes, one carries launch){title} (batch {batch} for the timings; errors relative "
             "to the op's v3 backward)", "",
             "| map | dtype | max rel. error vs v3 | bit-equal runs | RS passes ms | v3 backward op ms |",
             "|---|---|---|---|---|---|"]
    ok = True
    for side, dim in maps:
        for dtype in (torch.float32, torch.bfloat16):
            x, dy = cross_inputs(2, 8, side, dtype, device=device)
            first, second, ref = rs(x, dy), rs(x, dy), v3(x, dy)
            same = all(torch.equal(a, b) for a, b in zip(first, second) if a is not None)
            err = max(((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
                      for a, b in zip(first, ref) if a is not None)
            ok &= err <= TOLERANCE[dtype] * 4 and same
            x, dy = cross_inputs(batch, dim, side, dtype, device=device)
            rs_ms, v3_ms = timer(lambda: rs(x, dy)), timer(lambda: v3(x, dy))
            lines.append(f"| {side}x{side} x {dim} | {str(dtype)[6:]} | {err:.2e} | {same} | {rs_ms:.3f} | "
                         f"{v3_ms:.3f} |")
            print(lines[-1], flush=True)
    return lines, ok


def cross_main(launcher, batch: int) -> tuple[list[str], bool]:
    from vmamba2d.ops.compiled.cross_ops import cross_selective_scan_2d_bwd
    from vmamba2d.ops.compiled.cross_rows_backward import nvrtc_cross_save, nvrtc_passes

    return cross_rows(nvrtc_passes(launcher), cross_selective_scan_2d_bwd, batch,
                      title=f" on {torch.cuda.get_device_name()}", cross_save=nvrtc_cross_save(launcher))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--cross", action="store_true", help="the four-route backward as RS route passes")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU", file=sys.stderr)
        return 2
    launcher = KernelLauncher(toolchain=nvrtc.find_toolchain())
    if args.cross:
        lines, ok = cross_main(launcher, args.batch)
        text = "\n".join(lines) + "\n"
        if args.out:
            args.out.write_text(text)
        print(text)
        return 0 if ok else 1
    lines = [f"RS backward on {torch.cuda.get_device_name()} (batch {args.batch} for the timings)", "",
             "| map | dtype | max rel. error vs fp64 | bit-equal runs | RS fwd ms | RS save-fwd + bwd ms | "
             "v3 fwd + bwd (op, autograd) ms |", "|---|---|---|---|---|---|---|"]
    ok = True
    for side, dim in MODEL_MAPS:
        for dtype in (torch.float32, torch.bfloat16):
            err, same = check(launcher, side, dtype)
            ok &= err <= TOLERANCE[dtype] and same
            fwd, both, v3 = timings(launcher, args.batch, dim, side, dtype)
            lines.append(f"| {side}x{side} x {dim} | {str(dtype)[6:]} | {err:.2e} | {same} | {fwd:.3f} | {both:.3f} | "
                         f"{v3:.3f} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
