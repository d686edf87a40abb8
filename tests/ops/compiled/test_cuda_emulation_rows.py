"""The v4 row-streaming forward (csrc/cuda/scan2d_rows.cuh) on the host emulation: warps and lanes in
shuffled orders, every global access bounds-, alignment- and race-checked, against the fp64
reference of the 2D selective scan (vmamba2d.ops.selective_scan_2d_reference on the route's order).
"""
from __future__ import annotations

from dataclasses import astuple

import pytest
import torch

from support.cuda_emulation_build import rows_emulation
from vmamba2d.ops.compiled.rows_plan import alignment, layout, rows_plan, scan_steps
from support.rows_cases import four_route_inputs, make_inputs, reference, route_part

SUPPORTED_ROUTES = [code for code in range(16) if not (code & 8 and code & 4)]
# Largest |y - reference| / max |reference| per (input type, y type).
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(scope="module")
def rows():
    return rows_emulation()






def run(rows, x, height, width, route=0, y_fp32=False, order=2, softplus=True, vec=None, load=None):
    """The emulated kernel under the plan rows_plan makes for these tensors (or vec / load given)."""
    u = x["u"]
    if vec is None:
        y_bytes = 4 if y_fp32 else u.element_size()
        plan = rows_plan(u.element_size(), y_bytes, width, route,
                         alignment(u, x["delta"], x["B"], x["C"]))  # y: freshly allocated, aligned
        if plan is None:
            raise ValueError(f"no RS plan for width {width}, route {route}")
        vec, load = plan.vec, plan.load
    return rows.rows_forward(u, x["delta"], x["A"], x["B"], x["C"], x["D"], x["delta_bias"], softplus, height,
                             width, route, y_fp32, order, vec, load)


def check(y, x, height, width, route=0, y_fp32=False, softplus=True):
    expected = reference(x, height, width, route, softplus)
    assert not torch.isnan(y).any()
    tol = TOLERANCE[torch.float32 if y_fp32 else x["u"].dtype]
    err = ((y.double() - expected).abs().max() / expected.abs().max()).item()
    assert err <= tol, f"relative error {err:.3g} > {tol}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("size", [56, 28, 14, 7, 1])
def test_model_maps(rows, dtype, size):
    # The model's map sizes (and 1 x 1); 6 channels in 2 groups over 2 batch entries, so warps hold
    # maps of both groups and of both batch entries.
    x = make_inputs(2, 6, 2, size, size, dtype, seed=size)
    check(run(rows, x, size, size, order=size + 2), x, size, size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("size", [56, 28, 14, 7])
def test_model_maps_with_the_shipped_and_the_deeper_prefetch(rows, dtype, size):
    # Even orders run the plan's P = 1 (what the GPU entry is compiled with), odd orders P = 2: both
    # match the reference, and to the bit each other (every V of the model widths: 4, 4, 2, 1)
    x = make_inputs(1, 4, 2, size, size, dtype, seed=40 + size)
    shipped, deeper = run(rows, x, size, size, order=0), run(rows, x, size, size, order=3)
    check(shipped, x, size, size)
    assert torch.equal(shipped, deeper)


@pytest.mark.parametrize("route", SUPPORTED_ROUTES)
@pytest.mark.parametrize("shape", [(9, 14), (5, 28), (6, 7)], ids=str)
def test_every_route(rows, route, shape):
    height, width = shape
    x = make_inputs(2, 4, 2, height, width, torch.float32, seed=route)
    check(run(rows, x, height, width, route=route, order=route + 5), x, height, width, route)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("route", [0, 5, 10], ids=lambda r: f"route{r}")
def test_half_types_on_routes_and_fp32_output(rows, dtype, route):
    height, width = 11, 24
    x = make_inputs(1, 4, 1, height, width, dtype, seed=7 + route)
    check(run(rows, x, height, width, route=route), x, height, width, route)
    y = run(rows, x, height, width, route=route, y_fp32=True)
    assert y.dtype == torch.float32
    check(y, x, height, width, route, y_fp32=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(5, 9), (9, 5), (3, 33), (4, 35), (2, 61), (13, 1), (1, 17)], ids=str)
def test_odd_widths_and_ragged_lanes(rows, dtype, shape):
    # Widths no vector divides (9, 5, 61: one column per lane, or two with a ragged last lane where
    # 32 lanes are too few: 33, 35, 61 in fp32) on every pass order.
    height, width = shape
    for route in (0, 6, 9):
        x = make_inputs(2, 3, 1, height, width, dtype, seed=width + route)
        check(run(rows, x, height, width, route=route, order=route + 3), x, height, width, route)


def test_plan_rule():
    assert rows_plan(4, 4, 56, 0) == layout(56, 4, 4)
    assert astuple(rows_plan(4, 4, 56, 0)) == (4, 4, 1, 14, 2, 4)
    assert astuple(rows_plan(2, 2, 56, 0)) == (8, 8, 1, 7, 4, 3)  # 2-byte types: 16-byte vectors where 8 divides W
    assert astuple(rows_plan(2, 2, 16, 0)) == (8, 8, 1, 2, 16, 1)
    assert astuple(rows_plan(2, 2, 14, 0)) == (2, 2, 1, 7, 4, 3)
    assert rows_plan(2, 2, 28, 0).vec == 4 and rows_plan(4, 4, 7, 0).vec == 1
    assert astuple(rows_plan(2, 2, 200, 0)) == (8, 8, 1, 25, 1, 5)  # 4 columns need 50 lanes
    # Ragged: 33 has no divisor that fits 32 lanes; scalar accesses.
    assert astuple(rows_plan(4, 4, 33, 0)) == (2, 1, 1, 17, 1, 5)
    # 8 columns only as 16-byte vectors (scalar, they spill): 8-byte alignment takes 4 columns, as
    # vectors where y is in the input type; an fp32 y of bf16 inputs needs 16 bytes for 4 columns.
    assert astuple(rows_plan(2, 4, 56, 0, 16))[:2] == (8, 8)
    assert astuple(rows_plan(2, 4, 56, 0, 8))[:2] == (4, 1) and astuple(rows_plan(2, 2, 56, 0, 8))[:2] == (4, 4)
    assert astuple(rows_plan(2, 2, 56, 0, 4))[:2] == (4, 1)
    assert rows_plan(4, 4, 129, 0) is None and rows_plan(2, 2, 257, 0) is None
    assert all(rows_plan(4, 4, 56, code) is None for code in (12, 13, 14, 15))
    assert [scan_steps(s) for s in (1, 2, 3, 7, 8, 14, 17, 32)] == [0, 1, 2, 3, 3, 4, 5, 5]
    plan = rows_plan(2, 2, 56, 7)
    assert plan.defines(torch.bfloat16, 7) == dict(VMAMBA2D_RS_DTYPE=2, VMAMBA2D_RS_VEC=8, VMAMBA2D_RS_LOAD=8,
                                                   VMAMBA2D_RS_ROUTE=5, VMAMBA2D_RS_PREFETCH=1, VMAMBA2D_RS_STEPS=3)
    assert plan.blocks(128, 384) == 128 * 384 // 4 // 4
    with pytest.raises(ValueError, match="vec"):
        layout(100, 2, 2)


def _offset_by(t, elements):
    flat = torch.empty(t.numel() + elements, dtype=t.dtype)
    flat[elements:] = t.reshape(-1)
    return flat[elements:].view(t.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_vector_accesses_exactly_where_aligned(rows, dtype):
    batch, dim, height, width = 2, 4, 6, 56
    x = make_inputs(batch, dim, 1, height, width, dtype, seed=3)
    plan = rows_plan(dtype.itemsize, dtype.itemsize, width, 0)
    vec = plan.vec  # 4 fp32 (two maps of 14 lanes a warp), 8 bf16 (four maps of 7 lanes)
    assert (vec, plan.load) == ((4, 4) if dtype == torch.float32 else (8, 8))
    check(run(rows, x, height, width), x, height, width)
    # Every lane of every warp loads u, delta, B, C as one vector a row (idle lanes too: vector plans
    # load unconditionally) and the last row once more (P = 1 at order 2: the refill past the map's
    # end reloads the row itself, so no load needs a predicate); every lane of a map stores y as one.
    warps = batch * dim // plan.maps_per_warp
    assert rows.rows_vector_accesses() == warps * 32 * (height + 1) * 4 + batch * dim * height * (width // vec)
    x["delta"] = _offset_by(x["delta"], 1)  # misaligned base: the plan falls back to scalar accesses
    check(run(rows, x, height, width), x, height, width)
    assert rows.rows_vector_accesses() == 0


@pytest.mark.parametrize("vec,load", [(1, 1), (2, 1), (2, 2), (4, 1), (8, 8), (8, 1)])
def test_every_lane_width(rows, vec, load):
    # bf16 at width 16: each compiled lane width with vector and scalar accesses (the emulation runs
    # 2 rows ahead at one column per lane, 1 elsewhere).
    height, width = 7, 16
    x = make_inputs(1, 5, 1, height, width, torch.bfloat16, seed=vec * 10 + load)
    for route in (0, 7, 8):
        check(run(rows, x, height, width, route=route, vec=vec, load=load), x, height, width, route)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_route_planes_of_the_four_route_layout(rows, dtype):
    # delta with 4 routes x dim planes and B / C with 4 routes x groups planes per batch entry (the
    # four-route op's layout): each launch reads its route's planes through the plane strides.
    batch, dim, groups, routes, height, width = 2, 4, 2, 4, 6, 12
    x = four_route_inputs(batch, dim, groups, height, width, dtype, seed=21)
    for index, code in enumerate((0, 4, 3, 7)):
        part = route_part(x, index, dim, groups)
        plan = rows_plan(dtype.itemsize, dtype.itemsize, width, code)
        y = rows.rows_forward(x["u"], x["delta"], part["A"], x["B"], x["C"], part["D"], part["delta_bias"], True,
                              height, width, code, False, index + 2, plan.vec, plan.load, routes, index)
        check(y, part, height, width, code)


def test_without_softplus_d_and_bias(rows):
    height, width = 10, 12
    x = make_inputs(1, 4, 2, height, width, torch.float32, seed=11, use_d=False, use_bias=False, softplus=False)
    for route in (0, 3, 4, 11):
        check(run(rows, x, height, width, route=route, softplus=False), x, height, width, route, softplus=False)


def test_warp_and_lane_order_do_not_change_a_bit(rows):
    x = make_inputs(2, 6, 3, 14, 14, torch.bfloat16, seed=5)
    first = run(rows, x, 14, 14, route=4, order=0)
    for order in (1, 2, 9):
        assert torch.equal(run(rows, x, 14, 14, route=4, order=order), first)


@pytest.mark.parametrize("route", [0, 9], ids=lambda r: f"route{r}")
def test_a_non_finite_map_never_changes_another_map_to_a_finite_wrong_value(rows, route):
    # The row scan runs as a plain warp scan whose segments start with the product 0 (0 * tb for
    # another map's tb): a NaN or an inf in one map may turn the maps sharing its warp to NaN, but
    # every other map is bit-equal to the clean run or NaN -- never a different finite value.
    height, width = 6, 14  # two lanes a map at V = 4 ... 7 lanes at V = 2: several maps a warp
    x = make_inputs(2, 6, 2, height, width, torch.float32, seed=31)
    clean = run(rows, x, height, width, route=route)
    for bad, value in ((1, float("nan")), (4, float("inf"))):
        spoiled = dict(x, u=x["u"].clone())
        spoiled["u"][bad // 6, bad % 6, 5] = value
        y = run(rows, spoiled, height, width, route=route, order=bad)
        for m in range(12):
            got, want = y[m // 6, m % 6], clean[m // 6, m % 6]
            if m != bad:
                assert ((got == want) | got.isnan()).all(), m
        assert not torch.equal(y, clean)


def test_rejects_what_it_cannot_run(rows):
    x = make_inputs(1, 2, 1, 4, 4, torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="not a row stream"):
        run(rows, x, 4, 4, route=12, vec=4, load=4)
    with pytest.raises(RuntimeError, match="height, width"):
        run(rows, x, 4, 5)
    with pytest.raises(RuntimeError, match="more than 32 lanes"):
        run(rows, make_inputs(1, 1, 1, 1, 40, torch.float32, seed=0), 1, 40, vec=1, load=1)


@pytest.mark.parametrize("scenario,message", [
    ("two_lanes_store_one_cell", "race"),
    ("store_twice", "written twice"),
    ("shuffle_inside_lane_phase", "inside a per-lane phase"),
    ("nested_lane_phase", "nested"),
    ("out_of_bounds_load", "out-of-bounds"),
    ("misaligned_vector_load", "misaligned"),
    ("store_outside_lane_phase", "outside a per-lane phase"),
])
def test_checker_catches(rows, scenario, message):
    with pytest.raises(RuntimeError, match=message):
        rows.rows_self_check(scenario)


def test_checker_passes_a_clean_warp(rows):
    rows.rows_self_check("one_store_per_lane")
