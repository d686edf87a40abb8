"""The four-route v4 row-streaming forward (CrossRowsForward in csrc/cuda/scan2d_rows.cuh: VMamba's
cross scan, a top-down and a bottom-up sweep of two routes each, y written by the first sweep and
read back and rewritten by the same lane in the second) on the host emulation, with warps and lanes
in shuffled orders and every global access bounds-, alignment- and race-checked, against the fp64
four-route reference (vmamba2d.ops.cross_selective_scan_2d_reference).
"""
from __future__ import annotations

import pytest
import torch

from support.cuda_emulation_build import rows_emulation
from support.rows_cases import assert_wide_lanes_agree, cross_op_inputs
from vmamba2d.ops import CROSS_ROUTES, cross_selective_scan_2d_reference, selective_scan_2d_reference
from vmamba2d.ops.compiled.rows_plan import cross_plan
from vmamba2d.ops.routes import from_route_order, to_route_order

# Largest |y - reference| / max |reference| per y type (a 2-byte y is rounded once more between the
# two sweeps than the reference's single cast).
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2.4e-2}


@pytest.fixture(scope="module")
def rows():
    return rows_emulation()


def cross_vec(width: int, elem_bytes: int) -> int:
    """Columns per lane of the plan the CUDA four-route op launches (rows_plan.cross_plan): the widest
    of 4 (fp16 / bf16 only), 2, 1 that divides W with W / V <= 32."""
    plan = cross_plan(elem_bytes, elem_bytes, width)
    if plan is None:
        raise ValueError(f"width {width}: no lane width divides it within 32 lanes")
    return plan.vec


def run(rows, x, y_fp32=False, order=2, vec=None, load=None, softplus=True, prefetch=None):
    """y of the emulated kernel at ``vec`` columns a lane and ``prefetch`` rows ahead (the plan's V and
    P unless given; P = 1 where only V is given)."""
    batch, dim, height, width = x["u"].shape
    if prefetch is None:
        plan = cross_plan(x["u"].element_size(), x["u"].element_size(), width)
        prefetch = plan.prefetch if plan is not None and (vec is None or vec == plan.vec) else 1
    vec = cross_vec(width, x["u"].element_size()) if vec is None else vec
    load = vec if load is None else load
    length = height * width
    groups = x["B"].shape[2]
    y = rows.rows_cross_forward(
        x["u"].reshape(batch, dim, length), x["delta"].reshape(batch, 4 * dim, length), x["A"],
        x["B"].reshape(batch, 4 * groups, 1, length), x["C"].reshape(batch, 4 * groups, 1, length), x["D"],
        x["delta_bias"], softplus, height, width, y_fp32, order, vec, load, prefetch=prefetch)
    return y.reshape(batch, dim, height, width)


def reference(x, softplus=True):
    d = {k: (None if v is None else v.double()) for k, v in x.items()}
    return cross_selective_scan_2d_reference(d["u"], d["delta"], d["A"], d["B"], d["C"], d["D"], d["delta_bias"],
                                             softplus, routes="cross")


def check(y, expected, y_type):
    assert not torch.isnan(y).any()
    err = ((y.double() - expected).abs().max() / expected.abs().max()).item()
    assert err <= TOLERANCE[y_type], f"relative error {err:.3g} > {TOLERANCE[y_type]}"


def test_routes_are_the_kernels_sweeps():
    # Sweep 1: routes 0 and 1 start top-left; sweep 2: their reverses (codes 3 and 7) bottom-right.
    assert [r.code for r in CROSS_ROUTES] == [0, 4, 3, 7]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(56, 56), (14, 14), (7, 7), (1, 1), (9, 13), (5, 28), (31, 3)])
def test_four_routes_against_the_reference(rows, dtype, shape):
    batch, dim = (1, 2) if shape[0] * shape[1] > 1000 else (2, 3)
    x = cross_op_inputs(batch, dim, *shape, dtype, seed=shape[0] * 97 + shape[1])
    check(run(rows, x), reference(x), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_output_of_half_inputs(rows, dtype):
    x = cross_op_inputs(2, 3, 14, 28, dtype, seed=5)
    y = run(rows, x, y_fp32=True)
    assert y.dtype == torch.float32
    # The reference takes the same rounded inputs: an fp32 y is as close as the fp32 kernel's.
    check(y, reference(x), torch.float32)


@pytest.mark.parametrize("vec,load", [(1, 1), (2, 1), (2, 2), (4, 1), (4, 4)])
def test_every_lane_width(rows, vec, load):
    x = cross_op_inputs(2, 5, 6, 12, torch.float32, seed=11)
    check(run(rows, x, vec=vec, load=load), reference(x), torch.float32)


# Widths 4 divides: the model's 56 and 28, one lane (4), 8 and 12 (a few lanes, maps packed 8 / 10
# to a warp), odd multiples of 4 (20, 28, 60: 5, 7, 15 lanes), 124 and 128 (31 and 32 lanes).
FOUR_COLUMN_WIDTHS = (56, 28, 4, 8, 12, 20, 60, 124, 128)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("width", FOUR_COLUMN_WIDTHS)
def test_four_columns_a_lane(rows, dtype, width):
    # V = 4 (the plan of fp16 / bf16 wherever 4 divides W; fp32 is run at 4 too, the static report's
    # pinned pair), y in the input type and in fp32, vector and scalar accesses, against the fp64
    # reference; bit-equal across warp and lane orders.
    height = 3 if width > 28 else 5
    x = cross_op_inputs(2, 3, height, width, dtype, seed=width + dtype.itemsize)
    expected = reference(x)
    if dtype != torch.float32:
        assert cross_plan(2, 2, width).vec == 4
    assert_wide_lanes_agree(run, check, rows, x, expected, dtype, vec=4)


# Two rows of u and delta ahead (the plan's ring for fp16 / bf16 at every V and fp32 at V = 1) against one:
# bit-equal in every input type, y type and lane width the model's maps take (W = 56, 28, 14, 7 at
# the plan's V; fp32 at 56 / 28 at V = 2 and 4), vector and scalar accesses, heights below the ring
# (H = 1 < P), at it (2), just past it (3) and odd ones (5, 7): the refills past the map's end and the
# unrolled row pair's early exit; both against the fp64 reference.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("width", [56, 28, 14, 7])
def test_two_rows_ahead_is_bit_equal_to_one(rows, dtype, width):
    vecs = [cross_vec(width, dtype.itemsize)] + ([4] if dtype == torch.float32 and width % 4 == 0 else [])
    for height in (1, 2, 3, 5, 7):
        x = cross_op_inputs(2, 3, height, width, dtype, seed=height * 131 + width)
        expected = reference(x)
        for vec in vecs:
            for y_fp32 in ((False, True) if dtype != torch.float32 else (False,)):
                y_type = torch.float32 if y_fp32 else dtype
                for load in dict.fromkeys((vec, 1)):
                    one = run(rows, x, y_fp32=y_fp32, vec=vec, load=load, order=height, prefetch=1)
                    two = run(rows, x, y_fp32=y_fp32, vec=vec, load=load, order=height + 1, prefetch=2)
                    assert torch.equal(one, two), (height, vec, load, y_fp32)
                    check(two, expected, y_type)



# The instances the test above leaves out, so the bottom-up sweep's y ring (held P rows ahead, or one)
# runs in every one a launch or bench_v4's pins can take: fp16 / bf16 one row ahead at two columns a
# lane with 5 and 4 scan steps compiled in (W = 56, 28: bench_v4's pinned V = 2) and every type at
# run-time step counts (W = 8 at V = 2, 16 at V = 4, 9 at V = 1); P = 1 bit-equal to P = 2 and both
# against the fp64 reference, both y types, vector and scalar accesses, heights below the ring and past it.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("width,vec", [(56, 2), (28, 2), (8, 2), (16, 4), (9, 1)])
def test_rows_ahead_at_pinned_and_run_time_step_instances(rows, dtype, width, vec):
    for height in (1, 2, 5):
        x = cross_op_inputs(2, 3, height, width, dtype, seed=height * 17 + width)
        expected = reference(x)
        for y_fp32 in ((False, True) if dtype != torch.float32 else (False,)):
            y_type = torch.float32 if y_fp32 else dtype
            for load in dict.fromkeys((vec, 1)):
                one = run(rows, x, y_fp32=y_fp32, vec=vec, load=load, order=height, prefetch=1)
                two = run(rows, x, y_fp32=y_fp32, vec=vec, load=load, order=height + 1, prefetch=2)
                assert torch.equal(one, two), (height, load, y_fp32)
                check(one, expected, y_type)
                check(two, expected, y_type)

def test_plan_holds_two_rows_ahead_where_the_estimate_takes_it(rows):
    # The launch's plans at the model widths: what run() passes by default (cross_plan's P): fp16 / bf16
    # at every V (4, 4, 2, 1), fp32 at one column a lane (W = 7) alone.
    assert [cross_plan(2, 2, w).prefetch for w in (56, 28, 14, 7)] == [2, 2, 2, 2]
    assert [cross_plan(4, 4, w).prefetch for w in (56, 28, 14, 7)] == [1, 1, 1, 2]


def test_without_d_and_bias_and_softplus(rows):
    x = cross_op_inputs(1, 4, 8, 8, torch.float32, seed=3, use_d=False, use_bias=False)
    x["delta"] = x["delta"].abs() * 0.2 + 0.02
    check(run(rows, x, softplus=False), reference(x, softplus=False), torch.float32)


def test_groups_read_their_own_planes(rows):
    # The cross op has one B / C plane per route; the kernel also takes groups (channel d reads
    # plane d / (dim / groups) of its route): against the single-route reference per route, summed.
    x = cross_op_inputs(2, 4, 6, 8, torch.float32, seed=21, groups=2)
    expected = torch.zeros(2, 4, 6, 8, dtype=torch.float64)
    for k, route in enumerate(CROSS_ROUTES):
        rows_, cols = route.grid(6, 8)
        ch = slice(k * 4, (k + 1) * 4)
        order = lambda t: to_route_order(t.double(), route)  # noqa: E731
        y = selective_scan_2d_reference(order(x["u"]), order(x["delta"][:, k]), x["A"][ch].double(),
                                        order(x["B"][:, k]).unsqueeze(2), order(x["C"][:, k]).unsqueeze(2),
                                        x["D"][ch].double(), x["delta_bias"][ch].double(), True,
                                        height=rows_, width=cols)
        expected += from_route_order(y, route, 6, 8)
    check(run(rows, x), expected, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_warp_and_lane_order_do_not_change_a_bit(rows, dtype):
    x = cross_op_inputs(3, 5, 14, 14, dtype, seed=8)
    first = run(rows, x, order=0)
    for order in (1, 2, 3, 17):
        assert torch.equal(run(rows, x, order=order), first)


@pytest.mark.parametrize("vec,load", [(1, 1), (2, 1)])
def test_a_non_finite_map_never_changes_another_map_to_a_finite_wrong_value(rows, vec, load):
    # Both sweeps' row scans are plain warp scans (up the lanes top-down, down the lanes bottom-up)
    # whose segments start with the product 0: a NaN or inf in one map may turn the maps of its warp
    # to NaN, never to another finite value (and idle lanes of a scalar plan hold zeros, not garbage).
    x = cross_op_inputs(2, 5, 6, 12, torch.float32, seed=13)
    clean = run(rows, x, vec=vec, load=load)
    for bad, value in ((3, float("nan")), (6, float("-inf"))):
        spoiled = dict(x, u=x["u"].clone())
        spoiled["u"][bad // 5, bad % 5, 2, 7] = value
        y = run(rows, spoiled, vec=vec, load=load, order=bad)
        for m in range(10):
            got, want = y[m // 5, m % 5], clean[m // 5, m % 5]
            if m != bad:
                assert ((got == want) | got.isnan()).all(), m
        assert not torch.equal(y, clean)


def test_misaligned_vector_access_is_caught(rows):
    # A base off the 16-byte boundary with a vector plan: the emulation's alignment check objects.
    x = cross_op_inputs(1, 2, 4, 8, torch.float32, seed=1)
    u = torch.empty(2 * 32 + 1)[1:].reshape(1, 2, 4, 8)
    u.copy_(x["u"])
    x["u"] = u
    with pytest.raises(RuntimeError, match="misaligned"):
        run(rows, x, vec=4, load=4)
    check(run(rows, x, vec=4, load=1), reference(x), torch.float32)


def test_rejects_widths_the_lanes_do_not_divide(rows):
    x = cross_op_inputs(1, 2, 3, 6, torch.float32, seed=2)
    with pytest.raises(RuntimeError, match="must divide"):
        run(rows, x, vec=4)
