"""The Triton backend of the 2D scan, and the dispatch rules around it.

Four layers:
  * interpreter (CPU, no GPU): ``test_kernels_in_the_interpreter`` runs
    tests/ops/triton/triton_interpreted_cases.py (the single-route op) and
    tests/ops/triton/triton_interpreted_cross_cases.py (the four-route op; both run the same kernels) in a
    fresh Python with ``TRITON_INTERPRET=1`` set before triton is imported: the Triton kernels' own
    code against independent fp64 loop references (forward, every gradient, gradcheck, dtypes, bad
    inputs, torch.compile);
  * dispatch and errors (no Triton kernel runs): what ``auto`` picks and warns on CUDA devices,
    ``backend="cuda"`` without a kernel image, CPU tensors without the interpreter,
    ``backend_info``, the custom ops' fake implementations;
  * static targets (no GPU): the kernels compiled for sm_80 / sm_90 as each op launches them;
    registers, spills, resident warps and exps per cell and state held to issue 19's targets;
  * GPU (``-m cuda``, skipped without a GPU): the compiled kernels against the same reference.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from support.scan_cases import grads, make_inputs
from vmamba2d.ops import backend_info, resolve_backend, selective_scan_2d
from vmamba2d.ops.compiled import extensions
from vmamba2d.ops.triton import cross_ops as triton_cross
from vmamba2d.ops.triton import launch as triton_launch
from vmamba2d.ops.triton import ops as triton_ops

dispatch = importlib.import_module("vmamba2d.ops.interface")
HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_GPU = torch.cuda.is_available()
KERNELS = triton_launch.KERNELS_MODULE
REPO_ROOT = Path(__file__).resolve().parents[3]
# Run together in one child process (one interpreter start-up).
INTERPRETED_CASES = [Path(__file__).resolve().parent / name
                     for name in ("triton_interpreted_cases.py", "triton_interpreted_cross_cases.py")]


def triton_scan(**kwargs):
    return selective_scan_2d(**kwargs, backend="triton")


# --------------------------------------------------------------------------------------------
# Clear errors
# --------------------------------------------------------------------------------------------
def test_cpu_tensors_without_the_interpreter_raise(monkeypatch):
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    previous = sys.modules.pop(KERNELS, None)
    try:
        inputs = make_inputs(1, 2, 1, 2, 2, 2, dtype=torch.float32)
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            triton_scan(**inputs, height=2, width=2)
        importlib.import_module(KERNELS)  # compiled-mode kernels (importing needs no GPU)
        with pytest.raises(ValueError, match="kernels were built for the GPU"):
            triton_scan(**inputs, height=2, width=2)
        # This process imported triton without the variable: setting it now is too late.
        sys.modules.pop(KERNELS, None)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        with pytest.raises(ValueError, match="triton was imported before TRITON_INTERPRET=1"):
            triton_scan(**inputs, height=2, width=2)
    finally:
        sys.modules.pop(KERNELS, None)
        if previous is not None:
            sys.modules[KERNELS] = previous


def test_missing_triton_raises(monkeypatch):
    monkeypatch.setattr(triton_launch, "triton_unavailable_reason", lambda: "the 'triton' package is not installed")
    with pytest.raises(RuntimeError, match="needs Triton: the 'triton' package is not installed"):
        triton_scan(**make_inputs(1, 2, 1, 2, 2, 2, dtype=torch.float32), height=2, width=2)


# --------------------------------------------------------------------------------------------
# The kernels in Triton's interpreter (a subprocess: the variable must precede triton's import)
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_kernels_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    for name in (dispatch.BACKEND_ENV_VAR, triton_launch.TILE_ENV_VAR):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *map(str, INTERPRETED_CASES), "-q", "-p", "no:cacheprovider",
         "--durations=5"],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0 and " passed" in summary and "skipped" not in summary, (
        result.stdout[-6000:] + result.stderr[-3000:])


def test_fake_op_traces_on_the_meta_device():
    """The fake implementations alone (no kernel, no Triton) give shapes and dtypes; carries only
    when saved."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        u = torch.empty(2, 4, 12, dtype=torch.bfloat16)
        B = torch.empty(2, 2, 3, 12, dtype=torch.bfloat16)
        A, D = torch.empty(4, 3), torch.empty(4)
        y, vcarry, hcarry = triton_ops.selective_scan_2d_triton_fwd(u, u, A, B, B, D, None, True, 3, 4, True, True)
        _, no_v, no_h = triton_ops.selective_scan_2d_triton_fwd(u, u, A, B, B, D, None, True, 3, 4, True)
        grads = triton_ops.selective_scan_2d_triton_bwd(u, u, A, B, B, D, None, True, 3, 4, y, vcarry, hcarry)
    assert y.shape == (2, 4, 12) and y.dtype == torch.float32
    assert vcarry.numel() > 0 and hcarry.numel() > 0 and vcarry.dtype == torch.float32
    assert no_v.numel() == 0 and no_h.numel() == 0
    assert [tuple(g.shape) for g in grads] == [(2, 4, 12), (2, 4, 12), (4, 3), (2, 2, 3, 12),
                                              (2, 2, 3, 12), (4,), (0,)]


def test_four_route_fake_ops_trace_on_the_meta_device():
    """The four-route ops' fake implementations: y, and carries only when saved."""
    from torch._subclasses.fake_tensor import FakeTensorMode


    codes = [0, 4, 3, 7]
    with FakeTensorMode():
        u = torch.empty(2, 4, 5, 6, dtype=torch.bfloat16)
        delta = torch.empty(2, 4, 4, 5, 6, dtype=torch.bfloat16)
        B = torch.empty(2, 4, 3, 5, 6, dtype=torch.bfloat16)
        A, D = torch.empty(16, 3), torch.empty(16)
        y, vcarry, hcarry = triton_cross.cross_selective_scan_2d_triton_fwd(u, delta, A, B, B, D, None, True, codes,
                                                                      True, True)
        _, no_v, no_h = triton_cross.cross_selective_scan_2d_triton_fwd(u, delta, A, B, B, D, None, True, codes,
                                                                  True, False)
        grads = triton_cross.cross_selective_scan_2d_triton_bwd(u, delta, A, B, B, D, None, True, codes, vcarry, hcarry, y)
    assert y.shape == (2, 4, 5, 6) and y.dtype == torch.float32
    assert vcarry.numel() > 0 and hcarry.numel() > 0 and vcarry.dtype == torch.float32
    assert no_v.numel() == 0 and no_h.numel() == 0
    assert [tuple(g.shape) for g in grads] == [(2, 4, 5, 6), (2, 4, 4, 5, 6), (16, 3), (2, 4, 3, 5, 6),
                                              (2, 4, 3, 5, 6), (16,), (0,)]


# --------------------------------------------------------------------------------------------
# Dispatch on CUDA devices (no GPU needed: the probes are replaced)
# --------------------------------------------------------------------------------------------
CUDA0 = torch.device("cuda", 0)


@pytest.fixture
def gpu_probes(monkeypatch):
    """Fresh warn-once state; set ``cuda_ok`` / ``triton_missing`` on the returned namespace."""
    class Probes:
        cuda_ok = False
        triton_missing = None

    probes = Probes()
    monkeypatch.setattr(dispatch, "_warned_fallbacks", set())
    monkeypatch.setattr(extensions, "cuda_kernel_usable", lambda device: probes.cuda_ok)
    monkeypatch.setattr(extensions, "failure_reason",
                        lambda kind: "vmamba2d._C_cuda has no kernel image for TestGPU (sm_75)")
    monkeypatch.setattr(triton_launch, "triton_unavailable_reason", lambda: probes.triton_missing)
    monkeypatch.delenv(dispatch.BACKEND_ENV_VAR, raising=False)
    return probes


def _resolve_twice(backend="auto", dtype=torch.float32):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        picks = [resolve_backend(backend, CUDA0, dtype) for _ in range(2)]
    assert picks[0] == picks[1]
    return picks[0], [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_auto_picks_the_cuda_kernel_when_it_runs_on_the_gpu(gpu_probes):
    gpu_probes.cuda_ok = True
    assert _resolve_twice() == ("cuda", [])


def test_auto_falls_back_to_triton_warning_once_why(gpu_probes):
    name, caught = _resolve_twice()
    assert name == "triton"
    assert len(caught) == 1, caught
    message = str(caught[0].message)
    assert "no kernel image for TestGPU" in message and "Triton" in message


def test_auto_falls_back_to_torch_naming_both_reasons(gpu_probes):
    gpu_probes.triton_missing = "the 'triton' package is not installed"
    name, caught = _resolve_twice()
    assert name == "torch"
    assert len(caught) == 1, caught
    message = str(caught[0].message)
    assert "no kernel image for TestGPU" in message and "'triton' package is not installed" in message


def test_auto_keeps_fp64_on_torch_silently(gpu_probes):
    assert _resolve_twice(dtype=torch.float64) == ("torch", [])


def test_cuda_backend_without_a_kernel_image_raises(gpu_probes):
    with pytest.raises(RuntimeError, match="backend='cuda'.*no kernel image for TestGPU"):
        resolve_backend("cuda", CUDA0)


def test_explicit_triton_on_a_gpu_resolves(gpu_probes):
    assert _resolve_twice("triton") == ("triton", [])


def test_backend_info_reports_triton(monkeypatch):
    info = backend_info()
    assert info["triton"] is HAS_TRITON
    assert (info["triton_version"] is not None) is HAS_TRITON
    if not HAS_GPU:
        expected = "cuda" if info["cuda_extension"] else "triton" if HAS_TRITON else "torch"
        assert info["auto_cuda"] == expected
        assert not torch.cuda.is_initialized()
    monkeypatch.setattr(triton_launch, "triton_version", lambda: None)
    monkeypatch.setattr(dispatch, "_kernel_available", lambda name: name == "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = backend_info()
    assert info["triton"] is False and info["triton_version"] is None and info["auto_cuda"] == "torch"


# --------------------------------------------------------------------------------------------
# Real GPU
# --------------------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not (HAS_GPU and HAS_TRITON), reason="needs a GPU and triton")


def _gpu_inputs(inputs, dtype):
    return {k: (v.to("cuda", dtype if k in ("u", "delta", "B", "C") else torch.float32)
                if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("shape", [(1, 1, 2, 4, 2, 4), (1, 300, 1, 4, 1, 16), (300, 1, 1, 2, 2, 4),
                                   (33, 65, 2, 8, 2, 16), (56, 56, 2, 16, 1, 1), (14, 14, 1, 4, 1, 64)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_matches_reference(shape, dtype):
    height, width, batch, dim, groups, nstate = shape
    inputs = make_inputs(batch, dim, groups, nstate, height, width, seed=71)
    exact = {k: (v.to(dtype).double() if k in ("u", "delta", "B", "C") else v) if isinstance(v, torch.Tensor)
             else v for k, v in inputs.items()}
    dy = torch.randn(batch, dim, height * width, generator=torch.Generator().manual_seed(72),
                     dtype=torch.float64).to(dtype)
    expected = grads(exact, height, width, dy.double(), lambda **kw: selective_scan_2d(**kw, backend="torch"))
    gpu = _gpu_inputs(inputs, dtype)
    got = grads(gpu, height, width, dy.cuda(), triton_scan)
    y = triton_scan(**gpu, height=height, width=width, out_dtype=torch.float32)
    y_ref = selective_scan_2d(**exact, height=height, width=width, backend="torch")
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.double().cpu(), y_ref, rtol=tol, atol=tol * y_ref.abs().max().item())
    for name in expected:
        scale = expected[name].abs().max().item() + 1e-12
        err = (got[name].double().cpu() - expected[name]).abs().max().item() / scale
        assert err <= tol, f"{name}: relative error {err:.2e}"


@pytest.mark.cuda
@needs_gpu
def test_gpu_backward_is_deterministic():
    inputs = _gpu_inputs(make_inputs(2, 16, 2, 16, 40, 40, seed=73), torch.float32)
    dy = torch.randn(2, 16, 1600, device="cuda")
    runs = [grads(inputs, 40, 40, dy, triton_scan) for _ in range(3)]
    for name in runs[0]:
        assert all(torch.equal(runs[0][name], run[name]) for run in runs[1:]), name


# --------------------------------------------------------------------------------------------
# Static targets of the Triton kernels (issue 19), from compiles for sm_80 / sm_90 without a GPU
# (method in vmamba2d/ops/_triton_static.py), for the four-route op and the single-route op (the
# same kernels with one route and its groups of B / C as maps): the backward keeps >= 12 warps
# resident per SM, the forward >= 16, both evaluate exp(dt * A) once per cell and state (counted in
# the TTIR), ptxas reports no spills up to N = 16 (the bf16 forward on sm_90 spilled 4 bytes while
# it held the C tile across channel sets). benchmarks/scan_triton_static.md records the full table.
# --------------------------------------------------------------------------------------------
SPILL_BUDGET_BYTES = {"fwd": 0, "bwd": 0}
# N >= 32: programs of 8 / 16 warps at 128 registers (16 warps per SM) spill a few bytes in the
# backward (N = 64, 14 x 14, fp32: 20 B four-route on sm_80, 8 B single-route on sm_90; 4 warps
# at 168 registers spilled 276 B / 52 B, 8 warps at 168 none but only 8 warps per SM).
LARGE_N_BWD_SPILL_BUDGET_BYTES = 20
MIN_WARPS_PER_SM = {"fwd": 16, "bwd": 12}
# One route's backward fits 128 registers (without spills up to N = 16): 16 warps per SM, held.
SINGLE_ROUTE_MIN_WARPS_PER_SM = {"fwd": 16, "bwd": 16}


@pytest.fixture
def static_figures(monkeypatch):
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    previous = sys.modules.pop(KERNELS, None)
    try:
        static = importlib.import_module("vmamba2d.ops.triton.static")
        if not static._cuobjdump().exists():
            pytest.skip("triton's cuobjdump is missing")
        yield static
    finally:
        sys.modules.pop(KERNELS, None)
        if previous is not None:
            sys.modules[KERNELS] = previous


def _assert_meets_the_targets(fig, direction, nstate, min_warps_per_sm=MIN_WARPS_PER_SM):
    budget = LARGE_N_BWD_SPILL_BUDGET_BYTES if direction == "bwd" and nstate >= 32 else SPILL_BUDGET_BYTES[direction]
    assert fig.exps_per_cell_state == 1, fig
    assert fig.spill_bytes <= budget, fig
    assert fig.warps_per_sm >= min_warps_per_sm[direction], fig


def test_resident_warps_follow_the_occupancy_rule():
    from vmamba2d.ops.triton.static import resident_warps

    assert resident_warps(255, 8, 4096, 90) == 8  # 64 K registers hold one 8-warp block
    assert resident_warps(168, 4, 3072, 90) == 12
    assert resident_warps(170, 4, 3072, 90) == 8  # 176 after rounding: two blocks
    assert resident_warps(128, 8, 4096, 80) == 16
    assert resident_warps(32, 4, 100 * 1024, 80) == 4  # shared memory bound: one block
    assert resident_warps(16, 1, 0, 90) == 32  # block-count bound


def test_the_exp_count_sees_only_exps_on_register_blocks():
    """exps on the (channel, state, cell) block count, per-cell ones (softplus) do not; TTIR syntax."""
    from vmamba2d.ops.triton.static import _block_exps

    ttir = """
    %41 = math.exp %40 : tensor<1x1x16x16xf32> loc(#loc12)
    %42 = math.exp %39 : tensor<1x16x16xf32> loc(#loc13)
    %43 = math.exp %40 : tensor<1x1x16x16xf32> loc(#loc14)
    %44 = math.exp %38 : tensor<1x1x1x256xf32> loc(#loc15)
    """
    assert _block_exps(ttir, [(1, 1, 16, 16)]) == 2
    assert _block_exps(ttir, [(1, 1, 16, 16), (1, 1, 1, 256)]) == 3


def test_programs_pack_channel_blocks_only_on_large_grids():

    assert triton_launch.program_sets(192, 128) == 8  # stage 1: 3072 programs
    assert triton_launch.program_sets(24, 128) == 3  # 1024 programs; 4 per program would leave 768
    assert triton_launch.program_sets(128, 1) == 1  # one slide's scan (2DMambaMIL): a block per program
    assert triton_launch.program_sets(7, 1024) == 7
    assert triton_launch.program_sets(0, 4) == 1


def test_launch_warps_and_register_caps():
    """Two block elements per thread (more warps for large N); the backward's 168-register cap only
    for several routes on 4 warps (3 programs per SM), 128 otherwise (4 programs of 4 warps, or 2 / 1
    of 8 / 16)."""

    n1, n16, n32, n64 = (triton_launch.cross_tiling(64, n, 56, 56) for n in (1, 16, 32, 64))
    assert triton_launch.launch_config(n1, "bwd", 4) == (4, 168)
    assert triton_launch.launch_config(n1, "bwd", 1) == (4, 128)
    assert triton_launch.launch_config(n16, "fwd", 4) == (4, 128)
    assert triton_launch.launch_config(n32, "bwd", 4) == (8, 128)
    assert triton_launch.launch_config(n64, "bwd", 1) == (16, 128)


@pytest.mark.slow
@pytest.mark.parametrize("direction, routes, dtype, shape, arch", [
    ("bwd", "2d", torch.float32, (128, 192, 1, 56, 56), 90),
    ("bwd", "flat", torch.bfloat16, (128, 192, 1, 56, 56), 90),
    ("bwd", "2d", torch.bfloat16, (8, 64, 16, 28, 28), 80),
    ("fwd", "2d", torch.float32, (128, 192, 1, 56, 56), 80),
    ("fwd", "2d", torch.bfloat16, (128, 192, 1, 56, 56), 90),
    ("fwd", "2d", torch.bfloat16, (8, 64, 16, 28, 28), 90),
    ("fwd", "flat", torch.float16, (128, 768, 1, 14, 14), 80),
    ("bwd", "2d", torch.float32, (8, 64, 64, 14, 14), 80),
], ids=lambda v: str(v).replace("torch.", ""))
def test_four_route_kernels_meet_the_static_targets(static_figures, direction, routes, dtype, shape, arch):
    codes = static_figures.CROSS_2D if routes == "2d" else static_figures.CROSS_FLAT
    fig = static_figures.cross_kernel_figures(direction, dtype, *shape, codes, arch)
    _assert_meets_the_targets(fig, direction, shape[2])


@pytest.mark.parametrize("direction, dtype, shape, groups, arch", [
    ("bwd", torch.float32, (128, 192, 1, 56, 56), 1, 90),
    ("bwd", torch.bfloat16, (128, 192, 1, 56, 56), 4, 90),
    ("bwd", torch.float32, (8, 64, 16, 28, 28), 1, 80),
    ("fwd", torch.bfloat16, (128, 192, 1, 56, 56), 1, 90),
    ("bwd", torch.float32, (8, 64, 64, 14, 14), 4, 90),
], ids=lambda v: str(v).replace("torch.", ""))
def test_single_route_kernels_meet_the_static_targets(static_figures, direction, dtype, shape, groups, arch):
    batch, dim, nstate, height, width = shape
    fig = static_figures.single_route_kernel_figures(direction, dtype, batch, dim, groups, nstate, height, width, arch)
    _assert_meets_the_targets(fig, direction, nstate, SINGLE_ROUTE_MIN_WARPS_PER_SM)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("height, width", [(1, 1), (1, 7), (5, 1)])
def test_kernels_compile_for_maps_of_one_row_or_column(static_figures, direction, height, width):
    """Integer arguments equal to 1 reach the kernel as compile-time constants (a launch specialises
    them; the static compile does the same): a 1 x 1 map failed to compile on a GPU with Triton 3.6
    (tl.multiple_of of a constant), which the interpreter never sees."""
    fig = static_figures.cross_kernel_figures(direction, torch.float32, 2, 4, 4, height, width,
                                              static_figures.CROSS_2D, 90)
    assert fig.registers > 0 and fig.spill_bytes == 0, fig


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("routes", ["cross 2d", "corners 2d", "cross 1d", "corners 1d"])
@pytest.mark.parametrize("shape", [(1, 8, 1, 56, 56), (2, 6, 4, 13, 29), (1, 4, 16, 1, 40)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_four_route_kernels_match_the_per_route_reference(routes, shape, dtype):
    from vmamba2d.ops import cross_selective_scan_2d, route_set
    from vmamba2d.ops.interface import cross_scan_per_route

    batch, dim, nstate, height, width = shape
    route_tuple = route_set(*routes.split())
    k = len(route_tuple)
    gen = torch.Generator().manual_seed(81)
    exact = dict(
        u=torch.randn(batch, dim, height, width, generator=gen, dtype=torch.float64),
        delta=torch.randn(batch, k, dim, height, width, generator=gen, dtype=torch.float64),
        A=-(0.2 + torch.rand(k * dim, nstate, generator=gen, dtype=torch.float64)),
        B=torch.randn(batch, k, nstate, height, width, generator=gen, dtype=torch.float64),
        C=torch.randn(batch, k, nstate, height, width, generator=gen, dtype=torch.float64),
        D=torch.randn(k * dim, generator=gen, dtype=torch.float64),
        delta_bias=0.5 * torch.randn(k * dim, generator=gen, dtype=torch.float64),
    )
    for name in ("u", "delta", "B", "C"):
        exact[name] = exact[name].to(dtype).double()
    dy = torch.randn(batch, dim, height, width, generator=gen, dtype=torch.float64).to(dtype)
    names = list(exact)

    def run(fn, tensors, grad):
        leaves = {n: t.clone().requires_grad_() for n, t in tensors.items()}
        y = fn(**leaves)
        return y.detach(), dict(zip(names, torch.autograd.grad(y, [leaves[n] for n in names], grad)))

    y_ref, expected = run(lambda **kw: cross_scan_per_route(**kw, delta_softplus=True, routes=route_tuple,
                                                            backend="torch", out_dtype=torch.float64),
                          exact, dy.double())
    gpu = {n: t.to("cuda", dtype if n in ("u", "delta", "B", "C") else torch.float32) for n, t in exact.items()}
    y, got = run(lambda **kw: cross_selective_scan_2d(**kw, routes=route_tuple, backend="triton",
                                                      out_dtype=torch.float32), gpu, dy.cuda())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.double().cpu(), y_ref, rtol=tol, atol=tol * y_ref.abs().max().item())
    for name in expected:
        scale = expected[name].abs().max().item() + 1e-12
        err = (got[name].double().cpu() - expected[name]).abs().max().item() / scale
        assert err <= tol, f"{name}: relative error {err:.2e}"
    _, again = run(lambda **kw: cross_selective_scan_2d(**kw, routes=route_tuple, backend="triton",
                                                        out_dtype=torch.float32), gpu, dy.cuda())
    assert all(torch.equal(got[n], again[n]) for n in names)  # bitwise-repeatable gradients
