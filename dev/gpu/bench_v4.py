#!/usr/bin/env python
"""The v4 forwards (PL, RS, the four-route RS kernel) against the v3 forward on a GPU, same tensors,
same process.

    python dev/gpu/bench_v4.py --out v4.md [--max-seconds 113]   # run by `make gpu-check` (step bench-v4)

For the model's scan shapes (batch 128; Di = 192 / 384 / 768 / 1536 at 56 / 28 / 14 / 7; one group;
N = 1) in fp32 and bf16, through the NVRTC path (median ms of CUDA-event-timed calls):
- the single-route forward by the design the rule picks (PL at 7 x 7, RS elsewhere), RS also at
  7 x 7 (launched with its plan directly), and v3 (VMAMBA2D_SCAN_PLAN=v3);
- the four-route op (VMamba's cross routes) by the four-route RS kernel and by v3's per-route kernels;
  where the rule takes 4 columns a lane (fp16 / bf16) at a side in PAIR_SIDES, also the kernel at 2
  columns (its plan pinned, compiled for 8 blocks per SM), and where it holds more than one row ahead
  at a side in DEEP_PAIR_SIDES, the kernel one row ahead (P = 1 pinned, compiled for its own blocks per SM): the trades
  rows_plan.cross_plan estimates;
- the four-route op with the model's step-size projection (rank 6 at 56 x 56, as vmamba2d_tiny's first
  stage): projected first (project_delta, then the kernel: what the fold rule picks) against the
  folding kernel launched with its plan directly -- the measurement the rule's estimate waits for;
each as a share of a device-to-device copy's bandwidth measured here (bytes: u, delta, B, C read, y
written once), with the largest |v4 - v3| difference. Rows run in CASES' order (the four-route rows
first, then the fold, then the single-route ones: what the next GPU run must see first) while the time
lasts. Then vmamba2d_tiny inference at batch 128, fp32 and bf16 autocast, img/s (its four-route op
now runs the four-route RS kernel where the rule picks it). Each part runs under its own share of
--max-seconds and is reported as skipped when its time is gone; the table is written after every row.
Everything runs through the NVRTC path (the nvcc build has v3 only), the model too. Exit 2 without a
GPU or NVRTC.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SHAPES = ((192, 56), (384, 28), (768, 14), (1536, 7))  # (Di, H = W) of vmamba2d_tiny's four stages
# (op, Di, side), most wanted first: the four-route kernel (the model's op) at every stage, 56 x 56 first
# and 14 x 14 (the largest share of the model's bytes after it) next, then the step-size fold at 56 x 56,
# then the single-route forwards (PL at 7 x 7 first). The 2026-11-29 run timed only its first row.
CASES = (("cross", 192, 56), ("cross", 768, 14), ("cross", 384, 28), ("cross", 1536, 7), ("fold", 192, 56),
         ("single", 1536, 7), ("single", 192, 56), ("single", 384, 28), ("single", 768, 14))
FOLD_RANK = 6  # vmamba2d_tiny's dt_rank: ceil(96 / 16)
# Sides whose four-route row also times V = 2 beside the rule's V = 4 (PAIR_SIDES) and P = 1 beside the
# rule's P = 2 (DEEP_PAIR_SIDES: 56 at V = 4, 14 at V = 2, the stage with the model's largest share of
# bytes) -- more kernels, compiled at first use: the precompiled table holds the rule's instances only.
PAIR_SIDES = (56,)
DEEP_PAIR_SIDES = (56, 14)
CROSS_CODES = [0, 4, 3, 7]
BATCH = 128
MODEL_SHARE = 0.35  # of the time budget kept for the model's two precisions


def _events_ms(fn, repeats: int) -> float:
    import torch

    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


COPY_BYTES = 1 << 30  # the reference copy's source (and destination) size


def copy_bandwidth(repeats: int) -> float:
    """Bytes per ms (not per second) of a 1 GiB device-to-device copy, read + write counted (2 GiB moved)."""
    import torch

    src = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = _events_ms(lambda: dst.copy_(src), repeats)
    return 2 * COPY_BYTES / ms


def copy_label(bytes_per_ms: float) -> str:
    """The copy row's text: GB/s (bytes per ms x 1e3 / 1e9) and the copy's time."""
    return f"{bytes_per_ms / 1e6:.0f} GB/s (1 GiB read + 1 GiB written in {2 * COPY_BYTES / bytes_per_ms:.3f} ms)"


def percent_of_copy(bytes_moved: int, ms: float, bytes_per_ms: float) -> float:
    """A call's bandwidth (bytes_moved in ms) as a percentage of the copy's (both in bytes per ms)."""
    return 100 * bytes_moved / ms / bytes_per_ms


def scan_inputs(dim: int, side: int, dtype, routes: int = 0):
    """Single-route inputs (routes = 0: u, delta (batch, dim, L), B, C (batch, 1, 1, L)) or the four-route
    op's (u (batch, dim, H, W), delta (batch, routes, dim, H, W), B, C (batch, routes, 1, H, W))."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    L = side * side
    k = max(routes, 1)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    if routes == 0:
        u, delta = randn(BATCH, dim, L), randn(BATCH, dim, L, scale=0.5)
        B, C = randn(BATCH, 1, 1, L), randn(BATCH, 1, 1, L)
    else:
        u, delta = randn(BATCH, dim, side, side), randn(BATCH, routes, dim, side, side, scale=0.5)
        B, C = randn(BATCH, routes, 1, side, side), randn(BATCH, routes, 1, side, side)
    return dict(u=u, delta=delta, A=-torch.rand(k * dim, 1, generator=g, device="cuda") - 0.1, B=B, C=C,
                D=torch.randn(k * dim, generator=g, device="cuda"),
                delta_bias=torch.randn(k * dim, generator=g, device="cuda") * 0.1)


def _time_designs(calls: dict, bytes_moved: int, bandwidth: float, repeats: int, row: dict) -> dict:
    """Times each call (name -> fn returning y) into the row; returns name -> y."""
    import torch

    outputs = {}
    for name, fn in calls.items():
        outputs[name] = fn()  # compiles and warms up
        fn()
        ms = _events_ms(fn, repeats)
        row[f"{name} ms"] = f"{ms:.3f}"
        row[f"{name} % copy"] = f"{percent_of_copy(bytes_moved, ms, bandwidth):.0f}"
    torch.cuda.synchronize()
    return outputs


def _pinned(name: str, fn):
    """fn run with VMAMBA2D_SCAN_PLAN=v3 for the v3 design, the rule otherwise."""
    from vmamba2d.ops.compiled import rows_launch

    def call():
        os.environ[rows_launch.PLAN_ENV] = "v3" if name == "v3" else "auto"
        try:
            return fn()
        finally:
            os.environ[rows_launch.PLAN_ENV] = "auto"
    return call


def _compare(row: dict, outputs: dict) -> None:
    v4 = [n for n in outputs if n != "v3"]
    for name in v4:
        diff = (outputs[name].float() - outputs["v3"].float()).abs().max().item()
        row[f"max |{name} - v3|"] = f"{diff:.2e}"
        row[f"v3 / {name}"] = f"{float(row['v3 ms']) / float(row[f'{name} ms']):.2f}"


def scan_row(kernels, dim: int, side: int, dtype, bandwidth: float, repeats: int) -> dict:
    """The single-route forward by the rule's v4 design, RS (at 7 x 7, beside PL) and v3."""
    from vmamba2d.ops.compiled import rows_launch, rows_plan

    a = scan_inputs(dim, side, dtype)
    inputs = (a["u"], a["delta"], a["A"], a["B"], a["C"], a["D"], a["delta_bias"])
    device = kernels.launcher.device_info(a["u"].device.index)
    design, plan, why = rows_launch.forward_design(*inputs, side, False, False, device)
    row = {"op": "single-route", "shape": f"{BATCH}x{dim}x{side}x{side}", "dtype": str(dtype).replace("torch.", ""),
           "plan": why}
    bytes_moved = sum(a[k].numel() * a[k].element_size() for k in ("u", "delta", "B", "C", "u"))
    args = (*inputs, True, side, side, False, False)
    calls = {}
    if design != "v3":
        calls[design] = _pinned(design, lambda: kernels.forward(*args)[0])
    if design == "pl":
        rs = rows_plan.rows_plan(a["u"].element_size(), a["u"].element_size(), side, rows_launch.OP_ROUTE,
                                 rows_plan.alignment(a["u"], a["delta"], a["B"], a["C"]))
        calls["rs"] = lambda: rows_launch.launch_rows_forward(kernels.launcher, *inputs, True, side, side, False, rs)
    calls["v3"] = _pinned("v3", lambda: kernels.forward(*args)[0])
    outputs = _time_designs(calls, bytes_moved, bandwidth, repeats, row)
    if design == "pl":
        row["pl plan"] = f"chunk={plan.chunk} copy={plan.copy_bytes} B smem={plan.smem} B CTAs/SM={plan.ctas_per_sm}"
        plan = rs
    if plan is not None:
        row["rs plan"] = f"V={plan.vec} load={plan.load} S={plan.seg_lanes} M={plan.maps_per_warp}"
    _compare(row, outputs)
    return row


def cross_row(kernels, dim: int, side: int, dtype, bandwidth: float, repeats: int) -> dict:
    """The four-route op (cross routes) by the four-route RS kernel and by v3's per-route kernels."""
    import dataclasses

    from vmamba2d.ops.compiled import cross_rows_launch, rows_plan

    a = scan_inputs(dim, side, dtype, routes=len(CROSS_CODES))
    inputs = (a["u"], a["delta"], a["A"], a["B"], a["C"], a["D"], a["delta_bias"])
    design, plan, why = cross_rows_launch.cross_forward_design(*inputs, CROSS_CODES, False)
    row = {"op": "four-route", "shape": f"{BATCH}x{dim}x{side}x{side}", "dtype": str(dtype).replace("torch.", ""),
           "plan": why}
    bytes_moved = sum(a[k].numel() * a[k].element_size() for k in ("u", "delta", "B", "C", "u"))
    args = (*inputs, True, CROSS_CODES, False)
    calls = {"rs": _pinned("rs", lambda: kernels.cross_forward(*args))} if design == "rs" else {}
    narrow = None
    shallow = None
    if design == "rs" and plan.vec == 4 and side in PAIR_SIDES:
        narrow = rows_plan.CrossPlan(**rows_plan.layout(side, 2, 2 if plan.load > 1 else 1).__dict__)
        calls["rs V=2"] = lambda: cross_rows_launch.launch_cross_forward(kernels.launcher, *inputs, True, False,
                                                                         narrow)
    if design == "rs" and plan.prefetch > 1 and side in DEEP_PAIR_SIDES:
        shallow = dataclasses.replace(plan, prefetch=1,
                                      min_blocks=rows_plan.cross_min_blocks(a["u"].element_size(), plan.vec, 1))
        calls["rs P=1"] = lambda: cross_rows_launch.launch_cross_forward(kernels.launcher, *inputs, True, False,
                                                                         shallow)
    calls["v3"] = _pinned("v3", lambda: kernels.cross_forward(*args))
    outputs = _time_designs(calls, bytes_moved, bandwidth, repeats, row)
    if plan is not None:
        row["rs plan"] = (f"V={plan.vec} load={plan.load} P={plan.prefetch} S={plan.seg_lanes} "
                          f"M={plan.maps_per_warp} blocks/SM={plan.min_blocks}")
    if narrow is not None:
        row["rs V=2 / rs"] = f"{float(row['rs V=2 ms']) / float(row['rs ms']):.2f}"
    if shallow is not None:
        row["rs P=1 / rs"] = f"{float(row['rs P=1 ms']) / float(row['rs ms']):.2f}"
    _compare(row, outputs)
    return row


def fold_row(kernels, dim: int, side: int, dtype, bandwidth: float, repeats: int) -> dict:
    """The four-route op with a rank-FOLD_RANK step-size projection: projected first, then the
    kernel (the rule's choice at this rank) against the folding kernel forced by its plan."""
    import torch

    from vmamba2d.ops.compiled import cross_rows_launch
    from vmamba2d.ops.delta_proj import project_delta

    a = scan_inputs(dim, side, dtype, routes=len(CROSS_CODES))
    g = torch.Generator(device="cuda").manual_seed(1)
    low = (torch.randn(BATCH, len(CROSS_CODES), FOLD_RANK, side, side, generator=g, device="cuda") * 0.5).to(dtype)
    weight = torch.randn(len(CROSS_CODES), dim, FOLD_RANK, generator=g, device="cuda") * FOLD_RANK ** -0.5
    inputs = (a["u"], low, a["A"], a["B"], a["C"], a["D"], a["delta_bias"])
    design, plan, why = cross_rows_launch.cross_forward_design(*inputs, CROSS_CODES, False, weight)
    row = {"op": f"four-route, rank-{FOLD_RANK} step sizes", "shape": f"{BATCH}x{dim}x{side}x{side}",
           "dtype": str(dtype).replace("torch.", ""), "plan": why}
    # the bytes the folded call must move: u, the low-rank delta, B, C read, y written
    bytes_moved = sum(t.numel() * t.element_size() for t in (a["u"], low, a["B"], a["C"], a["u"]))
    full_args = (a["u"], a["A"], a["B"], a["C"], a["D"], a["delta_bias"])

    def projected():
        u, A, B, C, D, bias = full_args
        return kernels.cross_forward(u, project_delta(low, weight), A, B, C, D, bias, True, CROSS_CODES, False)

    calls = {"projected": projected}
    if design == "rs":
        folding = plan.folding(a["u"].element_size())  # one row ahead, its own blocks per SM
        calls["folded"] = lambda: cross_rows_launch.launch_cross_forward(
            kernels.launcher, *inputs, True, False, folding, delta_proj_weight=weight)
    outputs = _time_designs(calls, bytes_moved, bandwidth, repeats, row)
    if "folded" in outputs:
        diff = (outputs["folded"].float() - outputs["projected"].float()).abs().max().item()
        row["max |folded - projected|"] = f"{diff:.2e}"
        row["projected / folded"] = f"{float(row['projected ms']) / float(row['folded ms']):.2f}"
    return row


def model_img_s(precision: str, iters: int) -> float:
    import timm
    import torch

    import vmamba2d.models  # noqa: F401  (registers the models with timm)

    model = timm.create_model("vmamba2d_tiny").cuda().eval()
    x = torch.randn(BATCH, 3, 224, 224, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
        for _ in range(2):
            model(x)
        ms = _events_ms(lambda: model(x), iters)
    return BATCH / ms * 1e3


def format_table(rows: list[dict]) -> str:
    columns = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="markdown table written after every row")
    parser.add_argument("--max-seconds", type=float, default=300, help="time budget of the whole run")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    start = time.monotonic()
    import torch

    from vmamba2d.ops.compiled import nvrtc

    if not torch.cuda.is_available():
        print("bench_v4: needs a GPU")
        return 2
    try:
        from vmamba2d.ops.compiled import nvrtc_backend

        kernels = nvrtc_backend.nvrtc_kernels()
    except nvrtc.NvrtcUnavailable as err:
        print(f"bench_v4: no NVRTC path: {err}")
        return 2
    rows: list[dict] = []

    def save() -> None:
        text = format_table(rows)
        print(text, flush=True)
        if args.out:
            args.out.write_text(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}\n\n{text}\n")

    bandwidth = copy_bandwidth(args.repeats)
    rows.append({"op": "d2d copy 1 GiB", "plan": copy_label(bandwidth)})
    scan_deadline = start + args.max_seconds * (1 - MODEL_SHARE)
    for op, dim, side in CASES:
        for dtype in (torch.bfloat16, torch.float32):
            if time.monotonic() > scan_deadline:
                rows.append({"op": op, "shape": f"{BATCH}x{dim}x{side}x{side}", "dtype": str(dtype),
                             "plan": "skipped (time)"})
                continue
            row_of = {"single": scan_row, "cross": cross_row, "fold": fold_row}[op]
            try:
                rows.append(row_of(kernels, dim, side, dtype, bandwidth, args.repeats))
            except Exception as err:  # one failing row must not cost the rows after it
                rows.append({"op": op, "shape": f"{BATCH}x{dim}x{side}x{side}", "dtype": str(dtype),
                             "plan": f"error: {type(err).__name__}: {str(err)[:300]}"})
            save()
    model_deadline = start + args.max_seconds
    # The model through the NVRTC path (where the v4 kernels are), also where the nvcc build exists.
    from vmamba2d.ops.compiled import extensions

    extensions.cuda_extension = lambda: kernels
    extensions._sources["cuda"] = "nvrtc"
    for precision, pin in (("bf16", "auto"), ("fp32", "auto"), ("bf16", "v3"), ("fp32", "v3")):
        label = f"vmamba2d_tiny b{BATCH} {precision} NVRTC" + (" VMAMBA2D_SCAN_PLAN=v3" if pin == "v3" else "")
        if time.monotonic() > model_deadline - args.max_seconds * MODEL_SHARE / 2:
            rows.append({"op": label, "plan": "skipped (time)"})
            continue
        img_s = _pinned(pin, lambda: model_img_s(precision, 5))()
        rows.append({"op": label, "dtype": precision, "plan": f"{img_s:.0f} img/s"})
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
