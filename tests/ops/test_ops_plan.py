"""The design rule of the GPU scans (vmamba2d.ops.plan): each row of the documented table, the
fall-through past a design without a kernel, the backends' width limits, and that the CUDA
single-route (PL / RS / v3) and four-route (RS / v3) forwards and the Triton single-route forward
dispatch by it."""
from __future__ import annotations

import itertools

import pytest
import torch

from vmamba2d.ops import plan
from vmamba2d.ops.compiled import cuda_launch, rows_launch, rows_plan
from vmamba2d.ops.triton import rows_plan as triton_rows_plan

ALL = ("pl", "rs", "v3")
# An H200's limits (cuda_launch.DeviceInfo): PL's plan reads its shared memory.
H200 = cuda_launch.DeviceInfo(index=0, arch=90, code_arch=90, sm_count=132, smem_per_block=232448,
                              smem_per_sm=233472, reserved_smem_per_block=1024)


def design(backend="cuda", built=ALL, **fields):
    call = dict(nstate=1, height=14, width=14, dtype=torch.float32)
    call.update(fields)
    return plan.choose_design(plan.ScanCall(**call), backend, built)


@pytest.mark.parametrize("backend", plan.BACKENDS)
def test_rows_that_name_v3_only(backend):
    assert design("triton", direction="backward").name == "v3"
    got = design(backend, grad=True)
    assert got.name == "v3" and "backward" in got.reason
    assert design(backend, nstate=16).name == "v3"
    assert design(backend, dtype=torch.float64).name == "v3"
    assert design(backend, dtype=None).reason.startswith("V3: inputs of mixed types")
    assert design(backend, routes=(0, 12)).name == "v3"  # a flat column-major route streams no rows


@pytest.mark.parametrize("backend", plan.BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_small_maps_take_pl_then_rs(backend, dtype):
    for h, w in ((7, 7), (8, 8), (1, 64), (64, 1), (1, 1)):
        assert design(backend, height=h, width=w, dtype=dtype).name == "pl"
        fallen = design(backend, ("rs", "v3"), height=h, width=w, dtype=dtype)
        assert fallen.name == "rs" and f"PL (L = {h * w} <= 64): not built for {backend}" in fallen.reason
        assert design(backend, ("v3",), height=h, width=w, dtype=dtype).name == "v3"
    for h, w in ((9, 8), (14, 14), (56, 56), (3, 65)):
        assert design(backend, height=h, width=w, dtype=dtype).name == "rs"


def test_rs_width_limits():
    # CUDA: 32 lanes of 16 bytes; Triton: one tile of 256 columns.
    for dtype, limit in ((torch.float32, 128), (torch.float16, 256), (torch.bfloat16, 256)):
        assert design("cuda", height=4, width=limit, dtype=dtype).name == "rs"
        wide = design("cuda", height=4, width=limit + 1, dtype=dtype)
        assert wide.name == "v3" and f"width {limit + 1} > {limit}" in wide.reason
        assert design("triton", height=4, width=256, dtype=dtype).name == "rs"
        assert design("triton", height=4, width=257, dtype=dtype).name == "v3"
    assert design("cuda", height=200, width=200).name == "v3"


def test_routes_each_backend_streams():
    for code in range(16):
        cuda_streams = not (code & 8 and code & 4)  # 2D codes and flat row-major ones
        assert design("cuda", routes=(code,)).name == ("rs" if cuda_streams else "v3"), code
        assert design("triton", routes=(code,)).name == ("rs" if code < 8 else "v3"), code


def test_cuda_four_routes_take_rs_for_the_cross_routes_only():
    cross = (0, 4, 3, 7)  # the four-route kernel's routes, in its order
    assert design("cuda", routes=cross, height=2, width=64).name == "rs"
    wide = design("cuda", routes=cross, height=2, width=65)
    assert wide.name == "v3" and "width 65 > 64" in wide.reason  # 32 lanes of 2 columns
    assert design("cuda", ("rs", "v3"), routes=cross, height=7, width=7).reason == (
        "PL (L = 49 <= 64): not built for cuda; RS: N = 1, width 7 <= 64")
    other = design("cuda", routes=(0, 1, 2, 3))
    assert other.name == "v3" and "runs the cross routes [0, 4, 3, 7] only" in other.reason
    assert design("cuda", routes=(4, 0, 3, 7)).name == "v3"  # another order sums differently
    assert design("triton", routes=(0, 1, 2, 3)).name == "rs"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="backend: expected one of cuda, triton"):
        design("rocm")
    with pytest.raises(ValueError, match="direction"):
        design(direction="sideways")
    with pytest.raises(ValueError, match="built: every backend has v3"):
        design(built=("rs",))


def test_debug_env_prints_each_decision_once(monkeypatch, capsys):
    monkeypatch.setenv(plan.DEBUG_ENV, "1")
    for _ in range(3):
        design(height=11, width=13, dtype=torch.bfloat16)
    err = capsys.readouterr().err.splitlines()
    assert err == ["vmamba2d plan: cuda forward N=1 11x13 bfloat16 routes=[0] -> rs (RS: N = 1, width 13 <= 256)"]
    monkeypatch.delenv(plan.DEBUG_ENV)
    design(height=11, width=15)
    assert capsys.readouterr().err == ""


def _inputs(batch, dim, height, width, dtype, nstate=1):
    g = torch.Generator().manual_seed(0)
    L = height * width
    u, delta = (torch.randn(batch, dim, L, generator=g).to(dtype) for _ in range(2))
    B, C = (torch.randn(batch, 1, nstate, L, generator=g).to(dtype) for _ in range(2))
    A = -torch.rand(dim, nstate, generator=g)
    return u, delta, A, B, C, torch.randn(dim, generator=g), torch.randn(dim, generator=g)


SHAPES = [(1, 7, 7), (1, 14, 14), (1, 56, 56), (4, 14, 14), (1, 3, 129), (1, 2, 300)]
DTYPES = [torch.float32, torch.bfloat16, torch.float64]


@pytest.mark.parametrize("nstate,height,width", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backends_dispatch_by_the_rule(nstate, height, width, dtype, monkeypatch):
    """rows_launch (CUDA) and triton rows_plan pick the design the rule does for their built designs."""
    monkeypatch.delenv(rows_launch.PLAN_ENV, raising=False)
    monkeypatch.delenv(triton_rows_plan.PLAN_ENV_VAR, raising=False)
    u, delta, A, B, C, D, bias = _inputs(2, 4, height, width, dtype, nstate)
    for grad in (False, True):
        call = plan.ScanCall(nstate, height, width, dtype, (0,), "forward", grad)
        cuda = plan.choose_design(call, "cuda", rows_launch.BUILT)
        got, v4_plan, why = rows_launch.forward_design(u, delta, A, B, C, D, bias, width, False, grad, H200)
        assert (got, why) == (cuda.name, cuda.reason)
        assert (v4_plan is not None) == (got != "v3")
        triton = plan.choose_design(call, "triton", triton_rows_plan.BUILT)
        expected = "rows" if triton.name == "rs" else "tiles"
        assert triton_rows_plan.forward_design(nstate, height, width, dtype, grad) == expected


def test_cuda_takes_pl_on_the_7x7_stage_and_rs_on_the_others():
    u, delta, A, B, C, D, bias = _inputs(2, 8, 7, 7, torch.bfloat16)
    assert rows_launch.forward_design(u, delta, A, B, C, D, bias, 7, False, False, H200)[0::2] == (
        "pl", "PL: L = 49 <= 64")
    for side in (56, 28, 14):
        u, delta, A, B, C, D, bias = _inputs(2, 8, side, side, torch.float32)
        assert rows_launch.forward_design(u, delta, A, B, C, D, bias, side, False, False, H200)[0] == "rs"


def test_backend_info_names_the_designs_each_path_has(monkeypatch):
    built = plan.describe()["built"]
    assert built == {"cuda single-route": ["pl", "rs", "v3"], "cuda four-route": ["rs", "v3"],
                     "triton single-route": ["rs", "v3"], "cuda four-route backward": ["rs", "v3"],
                     "cuda single-route backward": ["rs", "v3"]}
    monkeypatch.delenv(plan.BACKWARD_ENV, raising=False)
    assert plan.describe()["backward_pin"] is None
    monkeypatch.setenv(plan.BACKWARD_ENV, "auto")
    assert plan.describe()["backward_pin"] == "auto"


@pytest.mark.parametrize("fields,expected", [
    ({}, "rs"),
    ({"routes": (0, 4, 3, 7)}, "rs"),
    ({"routes": (0, 5, 2, 6), "width": 128, "dtype": torch.bfloat16}, "rs"),
    ({"width": 129}, "v3"),
    ({"nstate": 16}, "v3"),
    ({"dtype": torch.float64}, "v3"),
    ({"dtype": None}, "v3"),
    ({"routes": (0, 8)}, "v3"),
])
def test_cuda_backward_rule(fields, expected):
    got = design("cuda", direction="backward", **fields)
    assert got.name == expected, got.reason
    assert got.reason.startswith("RS: backward at N = 1" if expected == "rs" else "V3: backward")
    assert design("cuda", ("v3",), direction="backward", **fields).name == "v3"


def test_backward_pin(monkeypatch):
    monkeypatch.delenv(plan.BACKWARD_ENV, raising=False)
    assert plan.backward_pin() == "v3"
    monkeypatch.setenv(plan.BACKWARD_ENV, " Auto ")
    assert plan.backward_pin() == "auto"
    monkeypatch.setenv(plan.BACKWARD_ENV, "rs")
    with pytest.raises(ValueError, match="VMAMBA2D_SCAN_BACKWARD: expected one of v3, auto"):
        plan.backward_pin()


def test_rs_precondition_on_the_tensors_keeps_v3():
    u, delta, A, B, C, D, bias = _inputs(2, 8, 14, 14, torch.float32)
    got, _, why = rows_launch.forward_design(u, delta, A, B, C, D.double(), bias, 14, False, False)
    assert got == "v3" and "preconditions" in why


def test_rule_is_a_function_of_the_shape_only():
    """Every call of a grid gets one answer, whatever was asked before (no state, no timing)."""
    calls = [plan.ScanCall(n, h, w, t, (r,), d, g) for n, h, w, t, r, d, g in itertools.product(
        (1, 4), (1, 7, 30), (1, 8, 129, 257), (torch.float32, torch.bfloat16, None), (0, 5, 9, 13),
        ("forward", "backward"), (False, True))]
    first = [plan.choose_design(c, "cuda", ALL).name for c in calls]
    again = [plan.choose_design(c, "cuda", ALL).name for c in reversed(calls)][::-1]
    assert first == again and set(first) == set(ALL)
    assert rows_plan.route_streams_rows(9) and not rows_plan.route_streams_rows(13)
