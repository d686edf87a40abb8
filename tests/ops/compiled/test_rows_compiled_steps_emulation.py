"""The RS kernels' compiled-in scan steps on the host emulation. The GPU entry
(csrc/cuda/entries/scan2d_rows_entry.cu) compiles the segmented scan's step count in
(VMAMBA2D_RS_STEPS = RowsPlan.scan_steps); the emulation runs those instances for every plan the
model and the benchmark widths produce (single route: MODEL_ROWS_PLANS; four routes: cross_plan's),
each against the fp64 reference and bit-equal to the run-time step count, and Python's
scan_steps is held against the kernel's rule (rows_scan_steps) at every width and lane width.
"""
from __future__ import annotations

import pytest
import torch

from support.cuda_emulation_build import rows_emulation
from support.rows_cases import make_inputs, reference
from vmamba2d.ops import cross_selective_scan_2d_reference
from vmamba2d.ops.compiled.cuda_kernels import MODEL_ROWS_PLANS
from vmamba2d.ops.compiled.rows_plan import WARP_LANES, cross_plan, layout, rows_plan, tuning_candidates

MODEL_WIDTHS = (56, 28, 14, 7)  # vmamba2d_tiny's stages, the benchmark shapes (dev/gpu/bench_v4.py)
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
CROSS_TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2.4e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# One route code of each compiled-in pass order and direction: rows first, columns first from the
# right, flat from the bottom right (from_bottom is a run-time parameter).
ROUTES = [0, 5, 11]


@pytest.fixture(scope="module")
def rows():
    return rows_emulation()


def relative_error(y, expected) -> float:
    return ((y.double() - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize("vec", [1, 2, 4, 8])
def test_plan_scan_steps_are_the_kernels_rule(rows, vec):
    # Every width 1 .. 256 that V columns per lane fit into 32 lanes: the plan's steps are the C++
    # rows_scan_steps of its segment (what the entry's guard and the run-time form use), and the
    # fewest shuffle doublings that span the segment.
    widths = [w for w in range(1, 257) if -(-w // vec) <= WARP_LANES]
    assert widths
    for width in widths:
        plan = layout(width, vec, 1)
        assert plan.scan_steps == rows.rows_scan_steps(plan.seg_lanes), (width, vec)
        assert 2 ** plan.scan_steps >= plan.seg_lanes > (2 ** (plan.scan_steps - 1) if plan.scan_steps else 0)


@pytest.mark.parametrize("elem_bytes", [2, 4])
def test_rows_plan_scan_steps_are_the_kernels_rule(rows, elem_bytes):
    # The single-route plan and the four-route one, wherever they apply.
    for width in range(1, 257):
        for plan in (rows_plan(elem_bytes, elem_bytes, width, 0), cross_plan(elem_bytes, elem_bytes, width)):
            if plan is not None:
                assert plan.scan_steps == rows.rows_scan_steps(plan.seg_lanes), (width, elem_bytes, plan)


def model_instances() -> set[tuple[int, int, int, int]]:
    """(vec, load, prefetch, steps) of the RS instances the model widths run on a GPU: rows_plan's
    plan in every input type with aligned tensors, at each prefetch depth the tuner may pick."""
    found = set()
    for width in MODEL_WIDTHS:
        for elem_bytes in (2, 4):
            plan = rows_plan(elem_bytes, elem_bytes, width, 0)
            found |= {(plan.vec, plan.load, c["prefetch"], plan.scan_steps) for c in tuning_candidates(plan)}
    return found


def test_model_and_benchmark_plans_are_compiled_in(rows):
    single, cross = rows.rows_compiled_steps_plans()
    assert set(MODEL_ROWS_PLANS) <= model_instances()  # the precompiled table (P = 1) is among them
    assert set(single) == model_instances()  # every one, and nothing else (each instance is build time)
    cross_instances = set()
    for width in MODEL_WIDTHS:
        for elem_bytes in (2, 4):
            plan = cross_plan(elem_bytes, elem_bytes, width)
            # the plan's prefetch depth, and P = 1 beside it (the benchmark's pinned one-row-ahead kernel)
            cross_instances |= {(plan.vec, plan.load, plan.prefetch, plan.scan_steps),
                                (plan.vec, plan.load, 1, plan.scan_steps)}
    # two rows ahead: fp16 / bf16 at 56 / 28 (V = 4), 14 (V = 2) and 7 (V = 1, fp32 too)
    assert {(4, 4, 2, 4), (4, 4, 2, 3), (2, 2, 2, 3), (1, 1, 2, 3)} <= cross_instances
    assert set(cross) == cross_instances


def run(rows, x, width, route, order, steps=None, y_fp32=False):
    plan = rows_plan(x["u"].element_size(), 4 if y_fp32 else x["u"].element_size(), width, route)
    height = x["u"].shape[-1] // width
    kwargs = {} if steps is None else {"steps": steps}
    y = rows.rows_forward(x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["delta_bias"], True, height, width,
                          route, y_fp32, order, plan.vec, plan.load, **kwargs)
    return y, plan


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", MODEL_WIDTHS)
def test_single_route_compiled_steps(rows, dtype, width):
    # Each route variant at each prefetch depth the tuner may pick (the emulation runs P = 1 at even
    # orders, P = 2 at odd ones): the instance compiled for the plan's steps matches the reference
    # and the run-time step count to the bit. With no steps given the emulation runs the compiled
    # instance, as the other RS tests do at these widths.
    height = 3 if width > 14 else 5
    plan = rows_plan(dtype.itemsize, dtype.itemsize, width, 0)
    for candidate in tuning_candidates(plan):
        order = 2 if candidate["prefetch"] == 1 else 5
        for route in ROUTES:
            x = make_inputs(2, 3, 1, height, width, dtype, seed=width + route)
            compiled, _ = run(rows, x, width, route, order)
            assert rows.rows_last_steps() == plan.scan_steps
            fixed, _ = run(rows, x, width, route, order, steps=plan.scan_steps)
            assert rows.rows_last_steps() == plan.scan_steps
            runtime, _ = run(rows, x, width, route, order, steps=-1)
            assert rows.rows_last_steps() == -1
            assert torch.equal(compiled, runtime) and torch.equal(fixed, runtime), (route, order)
            err = relative_error(compiled, reference(x, height, width, route))
            assert err <= TOLERANCE[dtype], (route, order, err)


def test_fp32_y_of_half_inputs_compiled_steps(rows):
    x = make_inputs(1, 4, 2, 4, 28, torch.bfloat16, seed=3)
    compiled, plan = run(rows, x, 28, 0, 2, steps=None, y_fp32=True)
    assert rows.rows_last_steps() == plan.scan_steps == 3
    runtime, _ = run(rows, x, 28, 0, 2, steps=-1, y_fp32=True)
    assert torch.equal(compiled, runtime)
    assert relative_error(compiled, reference(x, 4, 28, 0)) <= TOLERANCE[torch.float32]


def test_too_few_compiled_steps_trap(rows):
    # 56 columns at V = 4: 14 lanes a map need 4 steps; the 3-step instance (the 28-wide plan's)
    # traps on the GPU and fails here; a step count with no instance is refused.
    x = make_inputs(1, 2, 1, 2, 56, torch.float32, seed=1)
    with pytest.raises(RuntimeError, match="compiled for 3 scan steps launched with 14 lanes"):
        run(rows, x, 56, 0, 0, steps=3)
    with pytest.raises(RuntimeError, match="no instance compiled for vec 4, load 4, prefetch 1, 5 scan steps"):
        run(rows, x, 56, 0, 0, steps=5)
    with pytest.raises(RuntimeError, match="no instance compiled for vec 4, load 4, prefetch 2, 4 scan steps"):
        run(rows, x, 56, 0, 1, steps=4)  # odd order: P = 2, which the tuner does not offer at V = 4


def cross_run(rows, x, order, steps=None, y_fp32=False, aligned=16, prefetch=None):
    """y of the emulated four-route kernel on the plan the launch takes for tensors ``aligned`` bytes
    apart (at ``prefetch`` rows ahead if given, else the plan's); with x["delta_proj_weight"] the
    folding instance (its plan: CrossPlan.folding), delta then low-rank (batch, 4, R, H, W)."""
    batch, dim, height, width = x["u"].shape
    plan = cross_plan(x["u"].element_size(), 4 if y_fp32 else x["u"].element_size(), width, aligned)
    length = height * width
    planes = x["delta"].shape[2]
    kwargs = {} if steps is None else {"steps": steps}
    if x.get("delta_proj_weight") is not None:
        kwargs["delta_proj_weight"] = x["delta_proj_weight"]
        plan = plan.folding(x["u"].element_size())
    kwargs["prefetch"] = plan.prefetch if prefetch is None else prefetch
    y = rows.rows_cross_forward(
        x["u"].reshape(batch, dim, length), x["delta"].reshape(batch, 4 * planes, length), x["A"],
        x["B"].reshape(batch, 4, 1, length), x["C"].reshape(batch, 4, 1, length), x["D"], x["delta_bias"], True,
        height, width, y_fp32, order, plan.vec, plan.load, **kwargs)
    return y.reshape(batch, dim, height, width), plan.scan_steps


def cross_inputs(dim, height, width, dtype, seed, rank=None):
    """One sample of the four-route op; with ``rank`` the low-rank delta and its fp32 projection."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    planes = dim if rank is None else rank
    return {
        "u": rand(1, dim, height, width).to(dtype),
        "delta": (rand(1, 4, planes, height, width) * 0.5 - 1.0).to(dtype),
        "A": -(torch.rand(4 * dim, 1, generator=g) * 1.5 + 0.05),
        "B": rand(1, 4, 1, height, width).to(dtype),
        "C": rand(1, 4, 1, height, width).to(dtype),
        "D": rand(4 * dim),
        "delta_bias": rand(4 * dim) * 0.3,
        "delta_proj_weight": None if rank is None else rand(4, dim, rank) * rank ** -0.5,
    }


# Every four-route instance a GPU launches at the model widths: each input type, y in that type or
# fp32 (fp32 inputs always write an fp32 y, the launchers set y_fp32 from y's type), unfolded and
# folded (R = 3: the kernel's two-plane loop once and its odd plane).
Y_TYPES = [(torch.float32, True), (torch.float16, False), (torch.float16, True), (torch.bfloat16, False),
           (torch.bfloat16, True)]


@pytest.mark.parametrize("folded", [False, True], ids=["full-rank", "folded"])
@pytest.mark.parametrize("dtype,y_fp32", Y_TYPES, ids=lambda v: str(v))
@pytest.mark.parametrize("width", MODEL_WIDTHS)
def test_four_route_compiled_steps(rows, dtype, width, y_fp32, folded):
    x = cross_inputs(3, 4, width, dtype, seed=width, rank=3 if folded else None)
    d = {k: None if v is None else v.double() for k, v in x.items()}
    expected = cross_selective_scan_2d_reference(d["u"], d["delta"], d["A"], d["B"], d["C"], d["D"],
                                                 d["delta_bias"], True, routes="cross",
                                                 delta_proj_weight=d["delta_proj_weight"])
    compiled, steps = cross_run(rows, x, order=3, y_fp32=y_fp32)
    assert rows.rows_last_steps() == steps
    assert compiled.dtype == (torch.float32 if y_fp32 else dtype)
    fixed, _ = cross_run(rows, x, order=3, steps=steps, y_fp32=y_fp32)
    runtime, _ = cross_run(rows, x, order=3, steps=-1, y_fp32=y_fp32)
    assert rows.rows_last_steps() == -1
    assert torch.equal(compiled, runtime) and torch.equal(fixed, runtime)
    assert relative_error(compiled, expected) <= CROSS_TOLERANCE[torch.float32 if y_fp32 else dtype]
    if not folded:
        # The compiled-in one-row-ahead instance beside the plan's depth: bit-equal.
        one, _ = cross_run(rows, x, order=2, y_fp32=y_fp32, prefetch=1)
        assert rows.rows_last_steps() == steps
        assert torch.equal(one, compiled)


# The scalar-access instances a launch takes for 2-byte inputs whose addresses hold no 2-column
# vector (rows_plan.alignment below 4 bytes: a tensor sliced one element in), at widths with no
# compiled-in steps: 10 (V = 2) and 12 (V = 4).
@pytest.mark.parametrize("folded", [False, True], ids=["full-rank", "folded"])
@pytest.mark.parametrize("dtype,y_fp32", Y_TYPES[1:], ids=lambda v: str(v))
@pytest.mark.parametrize("width,vec", [(10, 2), (12, 4)])
def test_four_route_scalar_access_instances(rows, dtype, y_fp32, folded, width, vec):
    x = cross_inputs(3, 5, width, dtype, seed=7, rank=3 if folded else None)
    d = {k: None if v is None else v.double() for k, v in x.items()}
    expected = cross_selective_scan_2d_reference(d["u"], d["delta"], d["A"], d["B"], d["C"], d["D"],
                                                 d["delta_bias"], True, routes="cross",
                                                 delta_proj_weight=d["delta_proj_weight"])
    plan = cross_plan(dtype.itemsize, 4 if y_fp32 else dtype.itemsize, width, 2)
    assert (plan.vec, plan.load) == (vec, 1)
    y, _ = cross_run(rows, x, order=1, y_fp32=y_fp32, aligned=2)
    assert rows.rows_last_steps() == -1
    assert relative_error(y, expected) <= CROSS_TOLERANCE[torch.float32 if y_fp32 else dtype]


def test_four_route_too_few_compiled_steps_trap(rows):
    # 56 columns at V = 2: 28 lanes need 5 steps; the 4-step instance (28 wide) fails.
    x = cross_inputs(1, 2, 56, torch.float32, seed=2)
    with pytest.raises(RuntimeError, match="compiled for 4 scan steps launched with 28 lanes"):
        cross_run(rows, x, order=0, steps=4)


def test_four_route_four_columns_too_few_compiled_steps_trap(rows):
    # 56 bf16 columns at V = 4: 14 lanes need 4 steps; the 3-step instance (28 wide) fails.
    x = cross_inputs(1, 2, 56, torch.bfloat16, seed=2)
    assert cross_plan(2, 2, 56).vec == 4
    with pytest.raises(RuntimeError, match="compiled for 3 scan steps launched with 14 lanes"):
        cross_run(rows, x, order=0, steps=3)


def test_four_route_step_count_without_an_instance_is_refused(rows):
    # The V = 2 four-route instances have 5 / 4 / 3 steps (W = 56 / 28 / 14); 2 is within the kernel's
    # range but has none, so it is refused before anything runs.
    x = cross_inputs(1, 2, 14, torch.float32, seed=3)
    with pytest.raises(RuntimeError, match="no four-route instance compiled for vec 2, load 2, prefetch 1, 2 scan steps"):
        cross_run(rows, x, order=0, steps=2)


def test_four_route_prefetch_without_an_instance_is_refused(rows):
    # fp32 at 56 runs V = 2 one row ahead: no two-rows-ahead instance is compiled in for its 5 steps;
    # the folding instance takes one row ahead only.
    x = cross_inputs(1, 2, 56, torch.float32, seed=4)
    with pytest.raises(RuntimeError, match="vec 2, load 2, prefetch 2, 5 scan steps"):
        cross_run(rows, x, order=0, steps=5, y_fp32=True, prefetch=2)
    folded = cross_inputs(1, 2, 56, torch.bfloat16, seed=4, rank=2)
    with pytest.raises(RuntimeError, match="prefetch: expected 1 or 2 \\(1 with delta_proj_weight\\), got 2"):
        cross_run(rows, folded, order=0, prefetch=2)
