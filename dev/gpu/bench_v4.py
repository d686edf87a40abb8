#!/usr/bin/env python
"""The v4 row-streaming forward (RS) against the v3 forward on a GPU, same tensors, same process.

    python dev/gpu/bench_v4.py --out v4.md [--max-seconds 45]    # run by `make gpu-check` (step bench-v4)

For the model's scan shapes (batch 128; Di = 192 / 384 / 768 / 1536 at 56 / 28 / 14 / 7; one group;
N = 1) in fp32 and bf16: the single-route forward through the NVRTC path with the RS plan and with
VMAMBA2D_SCAN_PLAN=v3 (median ms of CUDA-event-timed calls), each as a share of a device-to-device
copy's bandwidth measured here (bytes: u, delta, B, C read, y written once), the bf16 / fp32 time
ratio and the largest |RS - v3| difference. Then vmamba2d_tiny inference at batch 128, fp32 and bf16
autocast, img/s (the model runs the four-route op, so this is the v3 path's figure for now). Each
part runs under its own share of --max-seconds and is reported as skipped when its time is gone;
the table is written after every row. Exit 2 without a GPU or NVRTC.
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


def copy_bandwidth(repeats: int) -> float:
    """Bytes per ms of a 1 GiB device-to-device copy (read + write counted)."""
    import torch

    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = _events_ms(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() * 4 / ms


def scan_inputs(dim: int, side: int, dtype):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    L = side * side

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    return dict(u=randn(BATCH, dim, L), delta=randn(BATCH, dim, L, scale=0.5),
                A=-torch.rand(dim, 1, generator=g, device="cuda") - 0.1,
                B=randn(BATCH, 1, 1, L), C=randn(BATCH, 1, 1, L),
                D=torch.randn(dim, generator=g, device="cuda"),
                delta_bias=torch.randn(dim, generator=g, device="cuda") * 0.1)


def scan_row(kernels, dim: int, side: int, dtype, bandwidth: float, repeats: int) -> dict:
    """RS and v3 forward times of one shape and dtype (both through the NVRTC path)."""
    import torch

    from vmamba2d.ops.compiled import rows_launch

    a = scan_inputs(dim, side, dtype)
    args = (a["u"], a["delta"], a["A"], a["B"], a["C"], a["D"], a["delta_bias"], True, side, side, False, False)
    design, plan, why = rows_launch.forward_design(*args[:7], side, False, False)
    row = {"shape": f"{BATCH}x{dim}x{side}x{side}", "dtype": str(dtype).replace("torch.", ""), "plan": why}
    bytes_moved = sum(a[k].numel() * a[k].element_size() for k in ("u", "delta", "B", "C")) + a["u"].numel() * a["u"].element_size()
    results = {}
    for name in ("rs", "v3"):
        os.environ[rows_launch.PLAN_ENV] = "v3" if name == "v3" else "auto"
        if name == "rs" and design != "rs":
            continue
        y = kernels.forward(*args)[0]  # compiles and warms up
        kernels.forward(*args)
        ms = _events_ms(lambda: kernels.forward(*args), repeats)
        results[name] = (ms, y)
        row[f"{name} ms"] = f"{ms:.3f}"
        row[f"{name} % copy"] = f"{100 * bytes_moved / ms / bandwidth:.0f}"
    os.environ[rows_launch.PLAN_ENV] = "auto"
    if "rs" in results:
        row["rs plan"] = f"V={plan.vec} load={plan.load} S={plan.seg_lanes} M={plan.maps_per_warp}"
        row["max |rs - v3|"] = f"{(results['rs'][1].float() - results['v3'][1].float()).abs().max().item():.2e}"
        row["v3 / rs"] = f"{results['v3'][0] / results['rs'][0]:.2f}"
    torch.cuda.synchronize()
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
    rows.append({"shape": "d2d copy 1 GiB", "rs ms": f"{2 * (1 << 30) / bandwidth:.3f}",
                 "plan": f"{bandwidth / 1e9:.0f} GB/s (read + write)"})
    scan_deadline = start + args.max_seconds * (1 - MODEL_SHARE)
    for dtype in (torch.float32, torch.bfloat16):
        for dim, side in SHAPES:
            if time.monotonic() > scan_deadline:
                rows.append({"shape": f"{BATCH}x{dim}x{side}x{side}", "dtype": str(dtype), "plan": "skipped (time)"})
                continue
            rows.append(scan_row(kernels, dim, side, dtype, bandwidth, args.repeats))
            save()
    model_deadline = start + args.max_seconds
    for precision in ("fp32", "bf16"):
        if time.monotonic() > model_deadline - args.max_seconds * MODEL_SHARE / 2:
            rows.append({"shape": f"vmamba2d_tiny {precision}", "plan": "skipped (time)"})
            continue
        rows.append({"shape": f"vmamba2d_tiny b{BATCH} {precision}", "dtype": precision,
                     "plan": f"{model_img_s(precision, 5):.0f} img/s"})
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
