"""The four-route backward as RS route passes (vmamba2d/ops/compiled/cross_rows_backward.py) on the host
emulation of the saving forward and the RS backward: every gradient against autograd through the
four-route fp64 reference (VMamba's cross routes and the corner routes; channels-last u; fp32 and
bf16; without D / delta_bias), the argument checks, and the design the NVRTC path's backward takes
(the VMAMBA2D_SCAN_BACKWARD pin, the rule, the tensors)."""
from __future__ import annotations

import pytest
import torch

from support.cuda_emulation_build import rows_backward_emulation
from support.rows_cases import cross_op_inputs
from vmamba2d.ops import cross_selective_scan_2d_reference
from vmamba2d.ops.compiled import rows_backward_launch as rbl
from vmamba2d.ops import plan as scan_plan
from vmamba2d.ops.compiled.cross_rows_backward import backward_design, cross_rows_backward, launch_backward
from vmamba2d.ops.routes import CORNER_ROUTES, CROSS_ROUTES

NAMES = ("u", "delta", "A", "B", "C", "D", "delta_bias")
TOLERANCE = {torch.float32: 5e-5, torch.bfloat16: 1.6e-2}


@pytest.fixture(scope="module")
def emu():
    return rows_backward_emulation()


def emulated_passes(emu, order=2):
    """The route passes on the emulation, each at the lane layout backward_plan picks."""

    def layout(u, width):
        plan = rbl.backward_plan(u.element_size(), u.element_size(), width)
        return plan.vec, plan.load

    def save_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, route, routes, route_index):
        y, carries = emu.rows_forward_save(u, delta, A, B, C, D, delta_bias, softplus, height, width, False, order,
                                           *layout(u, width), route, False, routes, route_index)
        assert y.numel() == 0  # the carries only
        return carries

    def backward_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, dy, carries, route, ddelta_out,
                      du_sum, du_fp32, routes, route_index):
        parts = emu.rows_backward(u, delta, A, B, C, D, delta_bias, softplus, height, width, dy, carries, order,
                                  *layout(u, width), route, du_sum, du_fp32, routes, route_index)
        du, ddelta, dBC, dA, dD, ddb = parts
        # The emulation allocates its outputs (NaN-filled, every element checked; ddelta in the routes'
        # layout, the route's planes written and no other).
        mine = lambda t: t.view(t.shape[0], routes, -1)[:, route_index]  # noqa: E731
        assert torch.isnan(ddelta.view(ddelta.shape[0], routes, -1)).sum() == ddelta.numel() // routes * (routes - 1)
        mine(ddelta_out).copy_(mine(ddelta))
        return rbl.reduce_partials(du, ddelta, dBC, dA, dD if D is not None else None,
                                   ddb if delta_bias is not None else None, B.dtype)

    return save_pass, backward_pass


def emulated_cross_save(emu, order=2, calls=None):
    """The cross routes' carries from one emulated launch at the backward plan's lane layout (None where
    its V does not divide W, as on the GPU)."""

    def cross_save(u, delta, A, B, C, D, delta_bias, softplus, height, width):
        plan = rbl.backward_plan(u.element_size(), u.element_size(), width)
        if width % plan.vec:
            return None
        if calls is not None:
            calls.append(width)
        return emu.rows_cross_save(u, delta, A, B, C, D, delta_bias, softplus, height, width, order, plan.vec,
                                   plan.load)

    return cross_save


def reference_grads(x, routes, dy):
    leaves = {k: None if x[k] is None else x[k].double().requires_grad_() for k in NAMES}
    y = cross_selective_scan_2d_reference(*(leaves[k] for k in NAMES), True, routes=routes)
    y.backward(dy.double())
    return {k: leaves[k].grad for k in NAMES if leaves[k] is not None}


def check(grads, x, expected, dtype):
    got = dict(zip(NAMES, grads))
    for name in NAMES:
        if x[name] is None:
            assert got[name] is None, name
            continue
        g = got[name]
        assert g.shape == x[name].shape and g.dtype == x[name].dtype, name
        ref = expected[name]
        err = ((g.double() - ref).abs().max() / ref.abs().max()).item()
        assert err <= TOLERANCE[dtype], f"{name}: relative error {err:.3g} > {TOLERANCE[dtype]}"


@pytest.mark.parametrize("routes", [CROSS_ROUTES, CORNER_ROUTES], ids=["cross", "corners"])
@pytest.mark.parametrize("shape", [(2, 3, 17, 12), (1, 4, 9, 14), (2, 2, 7, 7)], ids=lambda s: "x".join(map(str, s)))
def test_fp32_gradients_match_the_four_route_reference(emu, shape, routes):
    batch, dim, height, width = shape
    x = cross_op_inputs(batch, dim, height, width, torch.float32, seed=height + width)
    dy = torch.randn(batch, dim, height, width, generator=torch.Generator().manual_seed(3))
    codes = [r.code for r in routes]
    grads = cross_rows_backward(*emulated_passes(emu), *(x[k] for k in NAMES), True, codes, dy)
    check(grads, x, reference_grads(x, routes, dy), torch.float32)
    assert grads[1].is_contiguous()  # each pass wrote its route's planes of one buffer


def test_bf16_channels_last_gradients_match_the_reference(emu):
    x = cross_op_inputs(2, 4, 16, 28, torch.bfloat16, seed=5)
    x["u"] = x["u"].contiguous(memory_format=torch.channels_last)
    dy = torch.randn(2, 4, 16, 28, generator=torch.Generator().manual_seed(6)).bfloat16()
    grads = cross_rows_backward(*emulated_passes(emu), *(x[k] for k in NAMES), True,
                                [r.code for r in CROSS_ROUTES], dy)
    assert grads[0].is_contiguous(memory_format=torch.channels_last)
    check(grads, x, reference_grads(x, CROSS_ROUTES, dy.float()), torch.bfloat16)


def test_without_d_and_delta_bias(emu):
    x = cross_op_inputs(1, 3, 10, 14, torch.float32, seed=7, use_d=False, use_bias=False)
    dy = torch.randn(1, 3, 10, 14, generator=torch.Generator().manual_seed(8))
    grads = cross_rows_backward(*emulated_passes(emu), *(x[k] for k in NAMES), True,
                                [r.code for r in CROSS_ROUTES], dy)
    check(grads, x, reference_grads(x, CROSS_ROUTES, dy), torch.float32)


def test_gradients_are_bit_equal_across_warp_and_lane_orders(emu):
    x = cross_op_inputs(2, 3, 11, 14, torch.bfloat16, seed=9)
    dy = torch.randn(2, 3, 11, 14, generator=torch.Generator().manual_seed(10)).bfloat16()
    codes = [r.code for r in CROSS_ROUTES]
    runs = [cross_rows_backward(*emulated_passes(emu, order), *(x[k] for k in NAMES), True, codes, dy)
            for order in (0, 1, 3)]
    for grads in runs[1:]:
        for name, a, b in zip(NAMES, grads, runs[0]):
            assert torch.equal(a, b), name


def test_du_is_the_routes_fp32_sum_rounded_once(emu):
    # Against the routes' own passes: each route's du in fp32 (no running sum), summed in route order by
    # torch and rounded once -- not a sum of rounded route gradients.
    x = cross_op_inputs(2, 3, 10, 14, torch.bfloat16, seed=13)
    dy = torch.randn(2, 3, 10, 14, generator=torch.Generator().manual_seed(14)).bfloat16()
    codes = [r.code for r in CORNER_ROUTES]
    du = cross_rows_backward(*emulated_passes(emu), *(x[k] for k in NAMES), True, codes, dy)[0]
    save_pass, backward_pass = emulated_passes(emu)
    flat = lambda t: t.contiguous().view(2, -1, 140)  # noqa: E731
    total = torch.zeros(2, 3, 140)
    for k, route in enumerate(codes):
        part = (flat(x["u"]), flat(x["delta"][:, k]), x["A"][3 * k:3 * k + 3], flat(x["B"][:, k:k + 1]).unsqueeze(2),
                flat(x["C"][:, k:k + 1]).unsqueeze(2), x["D"][3 * k:3 * k + 3], x["delta_bias"][3 * k:3 * k + 3])
        carries = save_pass(*part, True, 10, 14, route, 1, 0)
        alone = backward_pass(*part, True, 10, 14, flat(dy), carries, route, torch.empty(2, 3, 140).bfloat16(),
                              None, True, 1, 0)[0]
        assert alone.dtype == torch.float32
        total = total + alone
    assert torch.equal(du, total.bfloat16().view(2, 3, 10, 14))


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (2, 3, 17, 12)), (torch.bfloat16, (2, 4, 16, 28)),
                                         (torch.bfloat16, (1, 3, 9, 66))])
def test_cross_routes_take_their_carries_from_one_launch(emu, dtype, shape):
    # VMamba's cross routes in their order: one carries launch instead of four save passes, and the same
    # gradients bit for bit (W = 66: V = 4 does not divide the row, so the save passes run).
    x = cross_op_inputs(*shape, dtype, seed=15)
    dy = torch.randn(*shape, generator=torch.Generator().manual_seed(16)).to(dtype)
    codes = [r.code for r in CROSS_ROUTES]
    save_pass, backward_pass = emulated_passes(emu)
    saves, launches = [], []

    def counted_save(*args):
        saves.append(args[-3])
        return save_pass(*args)

    one = cross_rows_backward(counted_save, backward_pass, *(x[k] for k in NAMES), True, codes, dy,
                              cross_save=emulated_cross_save(emu, calls=launches))
    passes = cross_rows_backward(save_pass, backward_pass, *(x[k] for k in NAMES), True, codes, dy)
    assert (launches, saves) == (([], codes) if shape[3] == 66 else ([shape[3]], []))
    for name, a, b in zip(NAMES, one, passes):
        assert (a is None and b is None) or torch.equal(a, b), name


def test_other_route_orders_run_the_save_passes(emu):
    x = cross_op_inputs(1, 2, 9, 12, torch.float32, seed=17)
    dy = torch.randn(1, 2, 9, 12, generator=torch.Generator().manual_seed(18))
    launches = []
    grads = cross_rows_backward(*emulated_passes(emu), *(x[k] for k in NAMES), True, [r.code for r in CORNER_ROUTES],
                                dy, cross_save=emulated_cross_save(emu, calls=launches))
    assert launches == []
    check(grads, x, reference_grads(x, CORNER_ROUTES, dy), torch.float32)


def _never(*args):
    raise AssertionError("no pass may run on refused arguments")


@pytest.mark.parametrize("change,message", [
    (lambda x: x.update(delta=x["delta"][:, :3]), "delta: expected"),
    (lambda x: x.update(B=x["B"].expand(-1, -1, 2, -1, -1)), "B: expected"),
    (lambda x: x.update(A=x["A"][:4]), "A: expected"),
    (lambda x: x.update(D=x["D"][:4]), "D: expected"),
    (lambda x: x.update(u=x["u"][0]), "u: expected"),
])
def test_bad_shapes_are_refused_before_any_pass(change, message):
    x = cross_op_inputs(1, 2, 5, 6, torch.float32, seed=11)
    dy = torch.zeros(1, 2, 5, 6)
    change(x)
    with pytest.raises(ValueError, match=message):
        cross_rows_backward(_never, _never, *(x[k] for k in NAMES), True, [0, 4, 3, 7], dy)


@pytest.mark.parametrize("routes", [[0, 4, 3, 8], [0, 4, 3, 15]])
def test_flat_routes_are_refused(routes):
    x = cross_op_inputs(1, 2, 5, 6, torch.float32, seed=12)
    with pytest.raises(ValueError, match="route: expected a 2D route code"):
        cross_rows_backward(_never, _never, *(x[k] for k in NAMES), True, routes, torch.zeros(1, 2, 5, 6))


def _design_args(x, dy, routes=(0, 4, 3, 7)):
    return (*(x[k] for k in NAMES), list(routes), dy)


def test_backward_design_is_v3_unless_opted_in(monkeypatch):
    x = cross_op_inputs(1, 2, 14, 14, torch.bfloat16, seed=13)
    dy = torch.zeros(1, 2, 14, 14, dtype=torch.bfloat16)
    monkeypatch.delenv(scan_plan.BACKWARD_ENV, raising=False)
    design, why = backward_design(*_design_args(x, dy))
    assert design == "v3" and "VMAMBA2D_SCAN_BACKWARD unset or v3" in why
    # No pass, no device: the v3 answer comes before anything touches a GPU.
    assert launch_backward(None, x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["delta_bias"], True,
                           [0, 4, 3, 7], dy) is None
    monkeypatch.setenv(scan_plan.BACKWARD_ENV, "auto")
    assert backward_design(*_design_args(x, dy)) == (
        "rs", "RS: backward at N = 1, 2D routes, width 14 <= 128")
    assert backward_design(*_design_args(x, dy.float()))[0] == "rs"


@pytest.mark.parametrize("change,reason", [
    (lambda x: x.update(u=torch.zeros(1, 2, 3, 130), delta=torch.zeros(1, 4, 2, 3, 130),
                        B=torch.zeros(1, 4, 1, 3, 130), C=torch.zeros(1, 4, 1, 3, 130)), "width 130 > 128"),
    (lambda x: x.update(B=x["B"].expand(-1, -1, 2, -1, -1), C=x["C"].expand(-1, -1, 2, -1, -1)), "N = 2"),
    (lambda x: x.update(u=x["u"].double()), "mixed types"),
    (lambda x: x.update(D=x["D"].double()), "not what the RS passes take"),
])
def test_backward_design_falls_to_v3_with_the_reason(monkeypatch, change, reason):
    monkeypatch.setenv(scan_plan.BACKWARD_ENV, "auto")
    x = cross_op_inputs(1, 2, 6, 10, torch.float32, seed=14)
    change(x)
    dy = torch.zeros(x["u"].shape, dtype=x["u"].dtype)
    design, why = backward_design(*_design_args(x, dy))
    assert design == "v3" and reason in why, why


def test_backward_design_refuses_flat_routes_by_the_rule(monkeypatch):
    monkeypatch.setenv(scan_plan.BACKWARD_ENV, "auto")
    x = cross_op_inputs(1, 2, 6, 10, torch.float32, seed=15)
    design, why = backward_design(*_design_args(x, torch.zeros(1, 2, 6, 10), routes=(8, 12, 11, 15)))
    assert design == "v3" and "route 8" in why
