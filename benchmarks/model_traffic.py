#!/usr/bin/env python
"""Byte account of one inference forward: bytes every op reads and writes, per stage and op kind.

Traces the model as on a CUDA device, on fake tensors (no GPU, no arithmetic), and counts each
aten op's input and output tensor bytes (views free), the scan ops by their traffic formula, the
share of dtype casts, and a roofline estimate at a bandwidth and GEMM peak rates (defaults: the
H200's measured 4.2 TB/s copy; the datasheet's GEMM peaks, estimates). Rules:
``vmamba2d.analysis.traffic`` and docs/benchmarks.md ("Byte account").

    python benchmarks/model_traffic.py --model vmamba2d_tiny --dtype autocast-bf16
    python benchmarks/model_traffic.py --model convnext_tiny --dtype bf16 --img-size 224 --batch 128
    python benchmarks/model_traffic.py --model vmamba2d_tiny --dtype fp32 --bandwidth-tbs 3.0 --out out/traffic.md
    python benchmarks/model_traffic.py --model vmamba2d_tiny --dtype bf16 --scan-traffic cuda

``--dtype``: fp32 / bf16 / fp16 (weights and inputs in that dtype) or autocast-bf16 /
autocast-fp16 (fp32 weights and inputs under CUDA autocast). A model is a timm name, optionally
with ``:key=value,...`` model arguments (``vmamba2d_tiny:cross_scan=per_route``). ``--scan-traffic cuda`` counts the four-route scan op by the
passes its CUDA path runs today (layout copies, the step-size projection, the kernel's re-reads of y;
``vmamba2d.analysis.scan_passes``) instead of what a fused kernel must move.
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
from typing import Any, Dict, List, Optional, Tuple


def parse_model_spec(spec: str) -> Tuple[str, Dict[str, Any]]:
    """``name[:key=value,...]`` -> (name, kwargs); values parsed as Python literals when they are."""
    name, _, rest = spec.partition(":")
    kwargs: Dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--model: expected NAME[:key=value,...], got {spec!r}")
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return name, kwargs


def parse_peaks(text: Optional[str]) -> Optional[Dict[str, float]]:
    """``bf16=989,tf32=494,...`` (TFLOP/s) -> {class: FLOP/s} over the defaults; None: defaults."""
    from vmamba2d.analysis.traffic import H200_PEAK_FLOPS

    if not text:
        return None
    peaks = dict(H200_PEAK_FLOPS)
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or key not in peaks:
            raise ValueError(f"--peak-tflops: expected CLASS=TFLOPS with CLASS in {sorted(peaks)}, got {item!r}")
        peaks[key] = float(value) * 1e12
    return peaks


def main(argv: Optional[List[str]] = None) -> int:
    from vmamba2d.analysis.traffic import H200_COPY_BYTES_PER_S, MODES, SCAN_TRAFFIC, account_timm_model, format_account

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="timm model name[:key=value,...]")
    parser.add_argument("--dtype", choices=MODES, default="fp32")
    parser.add_argument("--scan-traffic", choices=SCAN_TRAFFIC, default="fused",
                        help="the scan op as a fused kernel moves it (default), or the passes its CUDA path runs today")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128, help="default 128, the H200 benchmark's batch")
    parser.add_argument("--bandwidth-tbs", type=float, default=H200_COPY_BYTES_PER_S / 1e12,
                        help="memory bandwidth for the roofline, TB/s read + write (default: H200's measured copy)")
    parser.add_argument("--peak-tflops", help="GEMM peaks for the roofline, e.g. bf16=989,tf32=494,fp32=67")
    parser.add_argument("--top", type=int, default=20, help="op kinds listed")
    parser.add_argument("--out", help="also write the markdown here")
    args = parser.parse_args(argv)
    if args.img_size < 1 or args.batch < 1:
        parser.error(f"--img-size and --batch must be >= 1, got {args.img_size} and {args.batch}")
    if args.bandwidth_tbs <= 0:
        parser.error(f"--bandwidth-tbs must be > 0, got {args.bandwidth_tbs}")
    try:
        name, kwargs = parse_model_spec(args.model)
        peaks = parse_peaks(args.peak_tflops)
    except ValueError as error:
        parser.error(str(error))
    account = account_timm_model(name, args.dtype, args.img_size, args.batch, args.scan_traffic, **kwargs)
    title = f"{args.model}, {args.dtype}, {args.img_size}x{args.img_size}, batch {args.batch}, scan {args.scan_traffic}"
    text = format_account(account, title, args.bandwidth_tbs * 1e12, peaks, args.top)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
