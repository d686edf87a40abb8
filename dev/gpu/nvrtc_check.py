#!/usr/bin/env python
"""The NVRTC path of the CUDA scan on a GPU, against the nvcc build of the same sources.

    python dev/gpu/nvrtc_check.py            # make gpu-nvrtc, after `make gpu-check GPU_CHECK_ARGS=--nvcc-build`

Prints, for the current GPU:

- first use: a fresh process with an empty kernel cache runs the model-shape single-route and
  four-route forward + backward (fp32 and bf16) through the NVRTC path; wall seconds of that
  first round (it compiles the kernels it needs) and of the same round in a second fresh process
  with the filled cache (warm start);
- equality: the same inputs through the nvcc extension (vmamba2d._C_cuda) and the NVRTC path with
  VMAMBA2D_SCAN_PLAN=v3 (the v3 kernels both compile; the NVRTC path's v4 forwards, which the nvcc
  build does not have, are compared with v3 by dev/gpu/bench_v4.py); outputs and gradients must be
  bitwise equal (exit 1 otherwise);
- launch overhead: vmamba2d_tiny inference at batch 1, median milliseconds with each (NVRTC: with
  the v3 pin, and with the design rule, which runs the v4 four-route kernel).

Needs a GPU, NVRTC (torch's CUDA wheels bring it) and, for the comparisons, the built _C_cuda.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MODEL_SHAPE = (2, 192, 1, 1, 28, 28)  # batch, dim, groups, N, height, width (a vmamba2d_tiny stage)


def _inputs(dtype, seed: int = 0):
    import torch

    batch, dim, groups, nstate, height, width = MODEL_SHAPE
    g = torch.Generator(device="cuda").manual_seed(seed)
    length = height * width

    def randn(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dt)

    single = dict(u=randn(batch, dim, length), delta=randn(batch, dim, length, scale=0.5),
                  A=-torch.rand(dim, nstate, generator=g, device="cuda") - 0.1,
                  B=randn(batch, groups, nstate, length), C=randn(batch, groups, nstate, length),
                  D=randn(dim, dt=torch.float32), delta_bias=randn(dim, scale=0.1, dt=torch.float32))
    routes = 4
    cross = dict(u=randn(batch, dim, height, width), delta=randn(batch, routes, dim, height, width, scale=0.5),
                 A=-torch.rand(routes * dim, nstate, generator=g, device="cuda") - 0.1,
                 B=randn(batch, routes, nstate, height, width), C=randn(batch, routes, nstate, height, width),
                 D=randn(routes * dim, dt=torch.float32), delta_bias=randn(routes * dim, scale=0.1, dt=torch.float32))
    return single, cross


def _round(dtype) -> list:
    """Forward + backward of both ops on the CUDA backend; outputs and gradients."""
    import torch

    from vmamba2d.ops import cross_selective_scan_2d, selective_scan_2d

    results = []
    single, cross = _inputs(dtype)
    for args, run in ((single, lambda a: selective_scan_2d(**a, height=MODEL_SHAPE[4], width=MODEL_SHAPE[5],
                                                           backend="cuda")),
                      (cross, lambda a: cross_selective_scan_2d(**a, backend="cuda"))):
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in args.items()}
        y = run(leaves)
        y.float().square().sum().backward()
        results += [y.detach()] + [leaves[k].grad for k in sorted(leaves)]
    torch.cuda.synchronize()
    return results


def use_nvrtc() -> None:
    """Route the CUDA backend through the NVRTC path in this process (even with _C_cuda built)."""
    from vmamba2d.ops.compiled import extensions, nvrtc_backend

    kernels = nvrtc_backend.nvrtc_kernels()
    extensions.cuda_extension = lambda: kernels
    extensions._sources["cuda"] = "nvrtc"


def _child_round() -> None:
    import torch

    use_nvrtc()
    start = time.perf_counter()
    for dtype in (torch.float32, torch.bfloat16):
        _round(dtype)
    print(f"ROUND_SECONDS {time.perf_counter() - start:.2f}")


def _timed_child(cache: Path) -> float:
    env = {**os.environ, "VMAMBA2D_CACHE_DIR": str(cache)}
    run = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, env=env, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"first-use child failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    return float(run.stdout.split("ROUND_SECONDS")[1].split()[0])


def _model_ms(repeats: int = 50) -> float:
    import timm
    import torch

    import vmamba2d.models  # noqa: F401  (registers the models with timm)

    model = timm.create_model("vmamba2d_tiny").cuda().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda")
    times = []
    with torch.no_grad():
        for i in range(repeats + 5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model(x)
            torch.cuda.synchronize()
            if i >= 5:
                times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child_round()
        return 0
    import torch

    from vmamba2d.ops.compiled import extensions, nvrtc

    if not torch.cuda.is_available():
        print("nvrtc_check: needs a GPU")
        return 2
    toolchain = nvrtc.find_toolchain()
    major, minor = torch.cuda.get_device_capability()
    print(f"GPU {torch.cuda.get_device_name()} (sm_{major}{minor}), NVRTC {toolchain.version_text}")
    with tempfile.TemporaryDirectory() as cache:
        first = _timed_child(Path(cache))
        warm = _timed_child(Path(cache))
    print(f"first use (compiles the kernels of 2 ops x 2 dtypes, fwd + bwd): {first:.1f} s; warm start: {warm:.2f} s")
    status = 0
    nvcc = extensions.cuda_extension() if extensions.extension_source("cuda") == "built" else None
    if nvcc is None:
        print("no nvcc-built vmamba2d._C_cuda: equality and overhead comparisons skipped")
        return 0
    reference = {dtype: _round(dtype) for dtype in (torch.float32, torch.bfloat16)}
    nvcc_ms = _model_ms()
    use_nvrtc()
    os.environ["VMAMBA2D_SCAN_PLAN"] = "v3"
    for dtype, expected in reference.items():
        got = _round(dtype)
        unequal = [i for i, (a, b) in enumerate(zip(expected, got)) if not torch.equal(a, b)]
        print(f"{dtype}: NVRTC outputs / gradients bitwise equal to nvcc's: "
              f"{'yes' if not unequal else f'NO (tensors {unequal} of {len(got)})'}")
        status |= bool(unequal)
    nvrtc_ms = _model_ms()
    os.environ["VMAMBA2D_SCAN_PLAN"] = "auto"
    rule_ms = _model_ms()
    print(f"vmamba2d_tiny batch 1 inference: nvcc {nvcc_ms:.2f} ms, NVRTC {nvrtc_ms:.2f} ms (v3 pinned), "
          f"{rule_ms:.2f} ms (the design rule's v4 kernels) (medians of 50)")
    return status


if __name__ == "__main__":
    sys.exit(main())
