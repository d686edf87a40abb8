"""The RS backward (csrc/cuda/scan2d_rows_backward.cuh) and its carry-saving forward on the host
emulation, route 0 and every other 2D route (either pass order, from any corner): warps and lanes in shuffled orders, every global access bounds-, alignment- and
race-checked, every output element written exactly once, each lane's band buffer private -- against
the fp64 reference's gradients (torch.autograd through vmamba2d.ops.selective_scan_2d_reference in
float64), and bit-equal across warp / lane orders and prefetch depths.
"""
from __future__ import annotations

import pytest
import torch

from support.cuda_emulation_build import rows_backward_emulation
from support.rows_cases import make_inputs, reference
from vmamba2d.ops import selective_scan_2d_reference
from vmamba2d.ops.compiled import rows_backward_launch as rbl
from vmamba2d.ops.compiled.rows_plan import alignment

NAMES = ("u", "delta", "A", "B", "C", "D", "delta_bias")
# Largest |grad - reference| / max |reference| per input type (du / ddelta are rounded to it).
TOLERANCE = {torch.float32: 5e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(scope="module")
def emu():
    return rows_backward_emulation()


def reference_grads(x, height, width, dy, softplus=True, route=0):
    """Gradients of sum(y * dy) by autograd through the looped reference in float64 (route 0), or
    through the route's fp64 reference (the inputs permuted into its order and y back)."""
    leaves = {k: None if x[k] is None else x[k].double().requires_grad_() for k in NAMES}
    if route == 0:
        y = selective_scan_2d_reference(*(leaves[k] for k in NAMES), softplus, height=height, width=width)
    else:
        y = reference(leaves, height, width, route, softplus)
    y.backward(dy.double())
    return {k: leaves[k].grad for k in NAMES if leaves[k] is not None}


def plan_for(x, dy, width, vec=None, load=None):
    if vec is not None:
        return vec, load
    plan = rbl.backward_plan(x["u"].element_size(), dy.element_size(), width,
                             alignment(x["u"], x["delta"], x["B"], x["C"], dy))
    return plan.vec, plan.load


def run(emu, x, height, width, dy, order=2, softplus=True, vec=None, load=None, route=0):
    """(grads by name, carries, y) of the emulated saving forward + backward, reduced by the launcher's
    reduce_partials."""
    vec, load = plan_for(x, dy, width, vec, load)
    args = [x[k] for k in NAMES]
    y, carries = emu.rows_forward_save(*args, softplus, height, width, False, order, vec, load, route)
    du, ddelta, dBC, dA, dD, ddb = emu.rows_backward(*args, softplus, height, width, dy, carries, order, vec, load,
                                                     route)
    grads = rbl.reduce_partials(du, ddelta, dBC, dA, dD if x["D"] is not None else None,
                                ddb if x["delta_bias"] is not None else None, x["B"].dtype)
    return {k: g for k, g in zip(NAMES, grads) if g is not None}, carries, y


def check(grads, expected, dtype):
    assert grads.keys() == expected.keys()
    for name, ref in expected.items():
        got = grads[name].double()
        assert got.shape == ref.shape, name
        assert torch.isfinite(got).all(), name
        err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        assert err <= TOLERANCE[dtype], f"{name}: relative error {err:.3g} > {TOLERANCE[dtype]}"


# (batch, dim, groups, height, width): the model's maps, 1x1, odd / non-square sizes, one band and a
# ragged last band, grouped B / C, channels that do not fill the last warp.
SHAPES = [
    (1, 2, 1, 56, 56),
    (2, 4, 1, 28, 28),
    (2, 5, 1, 14, 14),
    (2, 3, 1, 7, 7),
    (3, 2, 1, 1, 1),
    (2, 6, 2, 9, 13),
    (1, 3, 1, 17, 5),
    (2, 4, 2, 8, 30),
    (1, 9, 3, 24, 3),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp32_gradients_match_the_fp64_reference(emu, shape):
    batch, dim, groups, height, width = shape
    x = make_inputs(batch, dim, groups, height, width, torch.float32, seed=height * 31 + width)
    dy = torch.randn(batch, dim, height * width, generator=torch.Generator().manual_seed(1))
    grads, _, _ = run(emu, x, height, width, dy)
    check(grads, reference_grads(x, height, width, dy), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 4, 1, 28, 28), (2, 3, 1, 14, 14), (1, 5, 1, 11, 7)],
                         ids=lambda s: "x".join(map(str, s)))
def test_half_precision_gradients_match_the_fp64_reference(emu, shape, dtype):
    batch, dim, groups, height, width = shape
    x = make_inputs(batch, dim, groups, height, width, dtype, seed=5)
    dy = torch.randn(batch, dim, height * width, generator=torch.Generator().manual_seed(2)).to(dtype)
    grads, _, _ = run(emu, x, height, width, dy)
    check(grads, reference_grads(x, height, width, dy), dtype)


def test_fp32_dy_with_bf16_inputs(emu):
    x = make_inputs(2, 4, 1, 12, 14, torch.bfloat16, seed=7)
    dy = torch.randn(2, 4, 12 * 14, generator=torch.Generator().manual_seed(3))
    grads, _, _ = run(emu, x, 12, 14, dy)
    check(grads, reference_grads(x, 12, 14, dy), torch.bfloat16)


@pytest.mark.parametrize("vec,load", [(4, 1), (2, 1), (1, 1), (4, 4)])
def test_lane_widths_not_dividing_the_row_and_scalar_accesses(emu, vec, load):
    width = 16 if load > 1 else 13  # 13: a ragged last lane at V = 4 and 2
    x = make_inputs(2, 5, 1, 10, width, torch.float32, seed=vec)
    dy = torch.randn(2, 5, 10 * width, generator=torch.Generator().manual_seed(4))
    grads, _, _ = run(emu, x, 10, width, dy, vec=vec, load=load)
    check(grads, reference_grads(x, 10, width, dy), torch.float32)


@pytest.mark.parametrize("use_d,use_bias,softplus", [(False, False, True), (True, False, False), (False, True, False)])
def test_without_d_bias_or_softplus(emu, use_d, use_bias, softplus):
    x = make_inputs(2, 3, 1, 10, 14, torch.float32, seed=11, use_d=use_d, use_bias=use_bias, softplus=softplus)
    dy = torch.randn(2, 3, 140, generator=torch.Generator().manual_seed(5))
    grads, _, _ = run(emu, x, 10, 14, dy, softplus=softplus)
    check(grads, reference_grads(x, 10, 14, dy, softplus), torch.float32)


def test_carries_are_h_of_every_band_s_last_row(emu):
    # With C = 1 and no D, y = h: the carries are the reference's y at rows 7, 15, ...
    x = make_inputs(2, 3, 1, 25, 14, torch.float32, seed=13, use_d=False)
    x["C"] = torch.ones_like(x["C"])
    _, carries, y = run(emu, x, 25, 14, torch.zeros(2, 3, 25 * 14))
    h = selective_scan_2d_reference(*(None if x[k] is None else x[k].double() for k in NAMES), True,
                                    height=25, width=14).reshape(6, 25, 14)
    assert carries.shape == (6, rbl.carry_rows(25), 14) == (6, 3, 14)
    torch.testing.assert_close(carries.double(), h[:, 7::8][:, :3], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y.double().reshape(6, 25, 14), h, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_are_bit_equal_across_warp_and_lane_orders(emu, dtype):
    # Orders 0 (in order), 1 (reversed), 2, 3 (shuffled; odd orders run the saving forward at P = 2).
    x = make_inputs(2, 6, 2, 19, 14, dtype, seed=17)
    dy = torch.randn(2, 6, 19 * 14, generator=torch.Generator().manual_seed(6)).to(dtype)
    runs = [run(emu, x, 19, 14, dy, order=order) for order in (0, 1, 2, 3)]
    for grads, carries, y in runs[1:]:
        assert torch.equal(carries, runs[0][1]) and torch.equal(y, runs[0][2])
        for name in grads:
            assert torch.equal(grads[name], runs[0][0][name]), name


def test_non_finite_input_of_one_map_leaves_the_other_batch_entries_clean(emu):
    # dB / dC sum a batch entry's channels, so an inf poisons that entry's dB / dC; the other entry's
    # gradients stay bit-equal to the clean run's.
    x = make_inputs(2, 4, 1, 9, 14, torch.float32, seed=19)
    dy = torch.randn(2, 4, 126, generator=torch.Generator().manual_seed(7))
    clean, _, _ = run(emu, x, 9, 14, dy)
    x["u"][1, 2, 40] = float("inf")
    dirty, _, _ = run(emu, x, 9, 14, dy)
    for name in ("u", "delta", "B", "C"):
        assert torch.equal(dirty[name][0], clean[name][0]), name


@pytest.mark.parametrize("scenario,message", [
    ("own_slots", None),
    ("one_store_per_lane", None),
    ("other_lanes_slot", "band buffer write of lane"),
    ("read_before_write", "read before written"),
    ("band_outside_lane_phase", "outside a per-lane phase"),
    ("two_lanes_store_one_cell", "written twice"),
    ("store_twice", "written twice"),
    ("read_of_another_lanes_output", "global-memory race"),
    ("read_only_read_of_another_lanes_output", "global-memory race"),
    ("read_only_read_of_own_output", None),
    ("store_into_an_input", "none of the launch's outputs"),
])
def test_checker(emu, scenario, message):
    if message is None:
        emu.rows_backward_self_check(scenario)
    else:
        with pytest.raises(RuntimeError, match=message):
            emu.rows_backward_self_check(scenario)


def test_carries_of_other_inputs_are_refused(emu):
    x = make_inputs(1, 2, 1, 9, 14, torch.float32, seed=23)
    dy = torch.zeros(1, 2, 126)
    with pytest.raises(RuntimeError, match="carries"):
        emu.rows_backward(*(x[k] for k in NAMES), True, 9, 14, dy, torch.zeros(2, 2, 14), 0, 2, 2)


def test_misaligned_vector_accesses_are_caught(emu):
    # The GPU's 16-byte loads of u need 16-byte aligned rows; u one element off its allocation with
    # a forced 4-column vector plan must fail in the emulation as it would fault on the GPU.
    x = make_inputs(1, 2, 1, 9, 16, torch.float32, seed=29)
    dy = torch.randn(1, 2, 9 * 16, generator=torch.Generator().manual_seed(30))
    args = [x[k] for k in NAMES]
    _, carries = emu.rows_forward_save(*args, True, 9, 16, False, 0, 4, 4)
    storage = torch.zeros(x["u"].numel() + 1)
    storage[1:] = x["u"].flatten()
    args[0] = storage[1:].view_as(x["u"])
    with pytest.raises(RuntimeError, match="misaligned vector"):
        emu.rows_backward(*args, True, 9, 16, dy, carries, 0, 4, 4)


# Every 2D route code but 0 (tested above): 1 from the right, 2 from the bottom, 4 columns first.
OTHER_ROUTES = (1, 2, 3, 4, 5, 6, 7)


@pytest.mark.parametrize("route", OTHER_ROUTES)
@pytest.mark.parametrize("shape", [(2, 3, 1, 17, 12), (2, 6, 2, 9, 14), (1, 3, 1, 13, 7), (2, 2, 1, 1, 1),
                                   (1, 2, 1, 10, 56)], ids=lambda s: "x".join(map(str, s)))
def test_routes_fp32_gradients_match_the_fp64_reference(emu, shape, route):
    # 17 x 12: three bands (one ragged) at 4 columns a lane; 9 x 14: grouped B / C at 2 (the GPU
    # entry's compiled steps, maps and row direction: 7 lanes); 13 x 7: one column a lane, the bands cut
    # across the columns-first route's rows; 10 x 56: 4 columns a lane, compiled at 14 lanes.
    batch, dim, groups, height, width = shape
    x = make_inputs(batch, dim, groups, height, width, torch.float32, seed=route * 7 + height)
    dy = torch.randn(batch, dim, height * width, generator=torch.Generator().manual_seed(route))
    grads, _, _ = run(emu, x, height, width, dy, route=route)
    check(grads, reference_grads(x, height, width, dy, route=route), torch.float32)


@pytest.mark.parametrize("route", (3, 4, 7))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_routes_half_precision_gradients_match_the_fp64_reference(emu, route, dtype):
    x = make_inputs(2, 4, 1, 18, 28, dtype, seed=route)
    dy = torch.randn(2, 4, 18 * 28, generator=torch.Generator().manual_seed(route + 1)).to(dtype)
    grads, _, _ = run(emu, x, 18, 28, dy, route=route)
    check(grads, reference_grads(x, 18, 28, dy, route=route), dtype)


@pytest.mark.parametrize("route", (1, 5, 7))
@pytest.mark.parametrize("vec,load", [(4, 1), (2, 1)])
def test_routes_with_a_ragged_last_lane(emu, route, vec, load):
    # W = 13: the lane that holds the row's end in route order holds only 1 (V = 4) or 1 (V = 2) column.
    x = make_inputs(2, 3, 1, 10, 13, torch.float32, seed=vec * 10 + route)
    dy = torch.randn(2, 3, 130, generator=torch.Generator().manual_seed(route))
    grads, _, _ = run(emu, x, 10, 13, dy, vec=vec, load=load, route=route)
    check(grads, reference_grads(x, 10, 13, dy, route=route), torch.float32)


@pytest.mark.parametrize("route", (4, 6))
def test_columns_first_carries_are_v_of_every_band_s_last_row(emu, route):
    # With C = 1, no D, B = 1 and dt = 1 (no softplus, delta = 1, no bias): v[i, j] = sum of a^k u
    # down the column; its rows (in route order) 7, 15 are the carries. Checked against v computed
    # here by a plain loop over the route's rows.
    height, width = 17, 6
    x = make_inputs(1, 2, 1, height, width, torch.float32, seed=31, use_d=False, use_bias=False, softplus=False)
    x["delta"] = torch.ones_like(x["delta"])
    x["B"] = torch.ones_like(x["B"])
    _, carries, _ = run(emu, x, height, width, torch.zeros(1, 2, height * width), softplus=False, route=route)
    u = x["u"].double().reshape(2, height, width)
    if route & 2:
        u = u.flip(1)
    a = torch.exp(x["A"].double()).reshape(2, 1)
    v = torch.zeros(2, width, dtype=torch.float64)
    rows = []
    for i in range(height):
        v = a * v + u[:, i]
        rows.append(v)
    expected = torch.stack([rows[7], rows[15]], 1)
    assert carries.shape == (2, 2, width)
    torch.testing.assert_close(carries.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("route", OTHER_ROUTES)
@pytest.mark.parametrize("width", (14, 56))
def test_routes_gradients_are_bit_equal_across_warp_and_lane_orders(emu, route, width):
    # Even orders run the steps, maps and row direction compiled in (the GPU entry's instance at 7 and
    # 14 lanes), odd orders at run time: the two forms agree bit for bit.
    x = make_inputs(2, 6, 2, 19, width, torch.bfloat16, seed=37)
    dy = torch.randn(2, 6, 19 * width, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    runs = [run(emu, x, 19, width, dy, order=order, route=route) for order in (0, 1, 2, 3)]
    for grads, carries, y in runs[1:]:
        assert torch.equal(carries, runs[0][1]) and torch.equal(y, runs[0][2])
        for name in grads:
            assert torch.equal(grads[name], runs[0][0][name]), name


@pytest.mark.parametrize("route", (-1, 8, 12))
def test_route_codes_outside_the_2d_routes_are_refused(emu, route):
    x = make_inputs(1, 2, 1, 9, 14, torch.float32, seed=41)
    with pytest.raises(RuntimeError, match="route: expected a 2D route code"):
        emu.rows_forward_save(*(x[k] for k in NAMES), True, 9, 14, False, 0, 2, 2, route)


@pytest.mark.parametrize("route", (0, 7))
def test_saving_forward_without_y_stores_the_same_carries(emu, route):
    x = make_inputs(2, 3, 1, 17, 12, torch.bfloat16, seed=43)
    args = [x[k] for k in NAMES]
    vec, load = plan_for(x, x["u"], 12)
    y, carries = emu.rows_forward_save(*args, True, 17, 12, False, 2, vec, load, route)
    none, only = emu.rows_forward_save(*args, True, 17, 12, False, 2, vec, load, route, False)
    assert y.shape == x["u"].shape and none.numel() == 0
    assert torch.equal(only, carries)


@pytest.mark.parametrize("route", (3, 4, 7))
@pytest.mark.parametrize("width", (14, 56))
def test_routes_fp32_dy_with_bf16_inputs(emu, route, width):
    # The models' autocast path: y (so dy) in fp32 where the next op is an fp32 LayerNorm.
    x = make_inputs(2, 4, 1, 12, width, torch.bfloat16, seed=47 + route)
    dy = torch.randn(2, 4, 12 * width, generator=torch.Generator().manual_seed(route))
    grads, _, _ = run(emu, x, 12, width, dy, route=route)
    check(grads, reference_grads(x, 12, width, dy, route=route), torch.bfloat16)


@pytest.mark.parametrize("route", (4, 7, 2))
@pytest.mark.parametrize("use_d,use_bias,softplus", [(False, False, True), (True, False, False), (False, True, False)])
def test_routes_without_d_bias_or_softplus(emu, route, use_d, use_bias, softplus):
    x = make_inputs(2, 3, 1, 10, 14, torch.float32, seed=53, use_d=use_d, use_bias=use_bias, softplus=softplus)
    dy = torch.randn(2, 3, 140, generator=torch.Generator().manual_seed(9))
    grads, _, _ = run(emu, x, 10, 14, dy, softplus=softplus, route=route)
    check(grads, reference_grads(x, 10, 14, dy, softplus, route=route), torch.float32)


@pytest.mark.parametrize("route", (0, 7))
@pytest.mark.parametrize("width", (14, 56))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_du_adds_the_running_sum_and_rounds_once(emu, dtype, width, route):
    # A multi-route op's du: each route's pass adds its du to the fp32 sum of the routes before it, the
    # last one rounds the total to the inputs' type as it stores it.
    x = make_inputs(2, 3, 1, 10, width, dtype, seed=59 + route)
    args = [x[k] for k in NAMES]
    dy = torch.randn(2, 3, 10 * width, generator=torch.Generator().manual_seed(11)).to(dtype)
    vec, load = plan_for(x, dy, width)
    _, carries = emu.rows_forward_save(*args, True, 10, width, False, 2, vec, load, route, False)
    running = torch.randn(2, 3, 10 * width, generator=torch.Generator().manual_seed(12))

    def backward(du_sum, du_fp32):
        return emu.rows_backward(*args, True, 10, width, dy, carries, 2, vec, load, route, du_sum, du_fp32)

    alone = backward(None, True)
    assert alone[0].dtype == torch.float32
    check_types = [(running, True, alone[0] + running, torch.float32),
                   (running, False, (alone[0] + running).to(dtype), dtype),
                   (None, False, alone[0].to(dtype), dtype)]
    for du_sum, du_fp32, expected, du_type in check_types:
        outputs = backward(du_sum, du_fp32)
        assert outputs[0].dtype == du_type
        assert torch.equal(outputs[0], expected), (du_sum is not None, du_fp32)
        for got, want in zip(outputs[1:], alone[1:]):
            assert torch.equal(got, want)  # nothing else depends on du's form


def test_a_running_sum_of_the_wrong_shape_is_refused(emu):
    x = make_inputs(1, 2, 1, 9, 14, torch.float32, seed=61)
    args = [x[k] for k in NAMES]
    _, carries = emu.rows_forward_save(*args, True, 9, 14, False, 0, 2, 2, 0, False)
    with pytest.raises(RuntimeError, match="du_sum: expected a contiguous CPU tensor of Float"):
        emu.rows_backward(*args, True, 9, 14, x["u"], carries, 0, 2, 2, 0, torch.zeros(1, 2, 125), True)


@pytest.mark.parametrize("route,width,dtype", [(0, 56, torch.bfloat16), (7, 14, torch.bfloat16), (4, 9, torch.bfloat16),
                                               (3, 66, torch.float16), (5, 28, torch.float32)])
def test_a_route_s_planes_are_read_and_written_in_the_multi_route_layout(emu, route, width, dtype):
    # A multi-route op's pass reads its delta, B, C planes in place (batch stride: all routes' planes)
    # and writes its ddelta planes into the op's gradient, none of the other routes' (the emulator
    # fails a write outside them): bit-equal to the pass on contiguous copies of the planes.
    routes, index, groups = 3, 1, 2
    x = make_inputs(2, 4, groups, 9, width, dtype, seed=67 + route)
    g = torch.Generator().manual_seed(13)
    wide = {k: torch.randn(2, routes, *x[k].shape[1:], generator=g).to(x[k].dtype) for k in ("delta", "B", "C")}
    for k in wide:
        wide[k][:, index] = x[k]
    dy = torch.randn(2, 4, 9 * width, generator=g).to(dtype)
    vec, load = plan_for(x, dy, width)
    alone_args = [x[k] for k in NAMES]
    laid_args = [x["u"], wide["delta"].flatten(1, 2), x["A"], wide["B"].flatten(1, 2), wide["C"].flatten(1, 2),
                 x["D"], x["delta_bias"]]
    y1, carries = emu.rows_forward_save(*alone_args, True, 9, width, False, 2, vec, load, route)
    y2, laid_carries = emu.rows_forward_save(*laid_args, True, 9, width, False, 2, vec, load, route, True, routes,
                                             index)
    assert torch.equal(y1, y2) and torch.equal(carries, laid_carries)
    alone = emu.rows_backward(*alone_args, True, 9, width, dy, carries, 2, vec, load, route)
    laid = emu.rows_backward(*laid_args, True, 9, width, dy, carries, 2, vec, load, route, None, False, routes, index)
    ddelta = laid[1].view(2, routes, 4, -1)
    assert torch.equal(ddelta[:, index], alone[1])
    assert torch.isnan(ddelta[:, [0, 2]]).all()
    for a, b in zip(alone[2:], laid[2:]):
        assert torch.equal(a, b)
    assert torch.equal(alone[0], laid[0])


def test_a_route_index_outside_the_layout_is_refused(emu):
    x = make_inputs(1, 2, 1, 9, 14, torch.float32, seed=71)
    with pytest.raises(RuntimeError, match=r"route_index: expected \[0, 2\), got 2"):
        emu.rows_forward_save(x["u"], x["delta"].repeat(1, 2, 1), x["A"], x["B"].repeat(1, 2, 1, 1),
                              x["C"].repeat(1, 2, 1, 1), x["D"], x["delta_bias"], True, 9, 14, False, 0, 2, 2, 0,
                              False, 2, 2)


CROSS_CODES = (0, 4, 3, 7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,vec,load", [((2, 3, 1, 17, 12), 4, 4), ((1, 2, 1, 56, 56), 4, 4), ((2, 4, 2, 9, 14), 2, 2),
                                            ((2, 3, 1, 16, 7), 1, 1), ((1, 2, 1, 1, 1), 1, 1), ((2, 2, 1, 10, 8), 4, 1)],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_cross_carries_equal_each_route_s_own_saving_pass(emu, shape, vec, load, dtype):
    # One launch for VMamba's four cross routes (two sweeps, no C / y, no row scan of the columns-first
    # routes) stores, per route, bit for bit what that route's own saving forward stores; the scan
    # steps compiled in (even orders at 14 and 7 lanes, as the GPU entry) and taken at run time (odd)
    # store the same.
    batch, dim, groups, height, width = shape
    g = torch.Generator().manual_seed(height * width)
    L = height * width
    x = {"u": torch.randn(batch, dim, L, generator=g).to(dtype),
         "delta": (torch.randn(batch, 4 * dim, L, generator=g) * 0.5 - 1.0).to(dtype),
         "A": -(torch.rand(4 * dim, 1, generator=g) * 1.5 + 0.05),
         "B": torch.randn(batch, 4 * groups, 1, L, generator=g).to(dtype),
         "C": torch.randn(batch, 4 * groups, 1, L, generator=g).to(dtype),
         "D": torch.randn(4 * dim, generator=g), "delta_bias": torch.randn(4 * dim, generator=g) * 0.3}
    carries = emu.rows_cross_save(*(x[k] for k in NAMES), True, height, width, 3, vec, load)
    assert carries.shape == (4, batch * dim, (height - 1) // 8, width)
    assert torch.equal(emu.rows_cross_save(*(x[k] for k in NAMES), True, height, width, 2, vec, load), carries)
    for k, code in enumerate(CROSS_CODES):
        own = slice(k * dim, (k + 1) * dim)
        _, alone = emu.rows_forward_save(x["u"], x["delta"], x["A"][own], x["B"], x["C"], x["D"][own],
                                         x["delta_bias"][own], True, height, width, False, 2, vec, load, code, False,
                                         4, k)
        assert torch.equal(carries[k], alone), code


def test_cross_carries_refuse_a_lane_width_that_does_not_divide_the_row(emu):
    x = make_inputs(1, 2, 1, 9, 14, torch.float32, seed=73)
    four = {"u": x["u"], "delta": x["delta"].repeat(1, 4, 1), "A": x["A"].repeat(4, 1), "B": x["B"].repeat(1, 4, 1, 1),
            "C": x["C"].repeat(1, 4, 1, 1), "D": x["D"].repeat(4), "delta_bias": x["delta_bias"].repeat(4)}
    with pytest.raises(RuntimeError, match="vec 4: expected to divide W = 14"):
        emu.rows_cross_save(*(four[k] for k in NAMES), True, 9, 14, 0, 4, 4)



# (dtype, dy in fp32, width, groups, vec, load, route): vector lanes at the model's segments (14 and 7
# lanes: the compiled forms on even orders, du's type compiled in too), scalar accesses, a ragged last
# lane (W = 66), one column a lane, grouped B / C, fp32 dy with 2-byte inputs, fp32 inputs.
IN_PLACE_CASES = [
    (torch.bfloat16, False, 56, 1, None, None, 0),
    (torch.bfloat16, True, 28, 2, None, None, 3),
    (torch.float16, False, 14, 1, None, None, 7),
    (torch.float16, False, 7, 1, None, None, 0),
    (torch.bfloat16, False, 66, 1, None, None, 5),
    (torch.bfloat16, False, 24, 1, 4, 1, 4),
    (torch.float16, True, 10, 2, 2, 1, 6),
    (torch.float32, False, 56, 1, None, None, 0),
    (torch.float32, False, 13, 1, 1, 1, 2),
]


@pytest.mark.parametrize("dtype,dy_fp32,width,groups,vec,load,route", IN_PLACE_CASES,
                         ids=lambda v: str(v).removeprefix("torch."))
def test_du_added_in_place_to_the_running_sum_under_the_race_detector(emu, dtype, dy_fp32, width, groups, vec, load,
                                                                      route):
    # As the GPU launcher passes it: du is du_sum itself. Reads of the running sum are race-checked
    # like du's writes (each cell read, then written, by its own lane only); the result is bit-equal
    # to the route's fp32 du plus the sum, on every warp / lane order (even orders: compiled forms).
    x = make_inputs(2, 4, groups, 11, width, dtype, seed=width + route)
    args = [x[k] for k in NAMES]
    g = torch.Generator().manual_seed(route)
    dy = torch.randn(2, 4, 11 * width, generator=g)
    dy = dy if dy_fp32 else dy.to(dtype)
    vec, load = plan_for(x, dy, width, vec, load)
    _, carries = emu.rows_forward_save(*args, True, 11, width, False, 2, vec, load, route, False)
    running = torch.randn(2, 4, 11 * width, generator=g)
    alone = emu.rows_backward(*args, True, 11, width, dy, carries, 2, vec, load, route, None, True)
    for order in (0, 2, 3):
        total = running.clone()
        outputs = emu.rows_backward(*args, True, 11, width, dy, carries, order, vec, load, route, total, True, 1, 0,
                                    True)
        assert outputs[0].data_ptr() == total.data_ptr()
        assert torch.equal(total, alone[0] + running), order
        for got, want in zip(outputs[1:], alone[1:]):
            assert torch.equal(got, want), order


def test_in_place_du_needs_the_running_sum_and_an_fp32_du(emu):
    x = make_inputs(1, 2, 1, 9, 14, torch.bfloat16, seed=79)
    args = [x[k] for k in NAMES]
    _, carries = emu.rows_forward_save(*args, True, 9, 14, False, 0, 2, 2, 0, False)
    for du_sum, du_fp32 in ((None, True), (torch.zeros(1, 2, 126), False)):
        with pytest.raises(RuntimeError, match="du_in_place: needs du_sum and an fp32 du"):
            emu.rows_backward(*args, True, 9, 14, x["u"], carries, 0, 2, 2, 0, du_sum, du_fp32, 1, 0, True)
