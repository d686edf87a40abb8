"""The RS (row-streaming) kernels' test inputs and fp64 reference, shared by the RS and PL emulation tests."""
from __future__ import annotations
import torch
from vmamba2d.ops import Route, selective_scan_2d_reference
from vmamba2d.ops.routes import from_route_order, to_route_order


def make_inputs(batch, dim, groups, height, width, dtype, seed, use_d=True, use_bias=True, softplus=True):
    """Random inputs of the N = 1 scan: A < 0, delta around the softplus knee (or a positive step size
    without softplus)."""
    g = torch.Generator().manual_seed(seed)
    length = height * width
    rand = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    delta = rand(batch, dim, length) * 0.5 - 1.0 if softplus else rand(batch, dim, length).abs() * 0.2 + 0.02
    return {
        "u": rand(batch, dim, length).to(dtype),
        "delta": delta.to(dtype),
        "A": -(torch.rand(dim, 1, generator=g) * 1.5 + 0.05),
        "B": rand(batch, groups, 1, length).to(dtype),
        "C": rand(batch, groups, 1, length).to(dtype),
        "D": rand(dim) if use_d else None,
        "delta_bias": rand(dim) * 0.3 if use_bias else None,
    }


def reference(x, height, width, route_code, softplus=True):
    """fp64 reference of one route: the inputs moved into the route's order, the 2D recurrence on the
    route's grid, y moved back to map order."""
    route = Route.from_code(route_code)
    rows_, cols = route.grid(height, width)

    def order(t):
        return to_route_order(t.double().unflatten(-1, (height, width)), route)

    d = x["D"].double() if x["D"] is not None else None
    bias = x["delta_bias"].double() if x["delta_bias"] is not None else None
    y = selective_scan_2d_reference(order(x["u"]), order(x["delta"]), x["A"].double(), order(x["B"]), order(x["C"]),
                                    d, bias, softplus, height=rows_, width=cols)
    return from_route_order(y, route, height, width).flatten(-2)


def four_route_inputs(batch, dim, groups, height, width, dtype, seed):
    """Inputs in the four-route op's layout at N = 1: u (batch, dim, L); delta (batch, 4 * dim, L) and
    B, C (batch, 4 * groups, 1, L), route k's planes from k * dim / k * groups; A (4 * dim, 1); D and
    delta_bias (4 * dim,)."""
    x = make_inputs(batch, 4 * dim, 4 * groups, height, width, dtype, seed)
    x["u"] = x["u"][:, :dim].contiguous()
    return x


def cross_op_inputs(batch, dim, height, width, dtype, seed, groups=1, use_d=True, use_bias=True):
    """Random four-route inputs at N = 1 in the cross op's layout: u (batch, dim, H, W); delta (batch, 4,
    dim, H, W) around the softplus knee; B, C (batch, 4, groups, H, W) (groups planes a route, N = 1
    each); A (4 * dim, 1) < 0, D, delta_bias (4 * dim,) fp32 or None."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {
        "u": rand(batch, dim, height, width).to(dtype),
        "delta": (rand(batch, 4, dim, height, width) * 0.5 - 1.0).to(dtype),
        "A": -(torch.rand(4 * dim, 1, generator=g) * 1.5 + 0.05),
        "B": rand(batch, 4, groups, height, width).to(dtype),
        "C": rand(batch, 4, groups, height, width).to(dtype),
        "D": rand(4 * dim) if use_d else None,
        "delta_bias": rand(4 * dim) * 0.3 if use_bias else None,
    }


def route_part(x, index, dim, groups):
    """Route ``index``'s single-route inputs out of four_route_inputs': its delta, B, C planes, A and
    delta_bias, and D of the first dim channels (each launch adds its own D term); A, D, delta_bias
    contiguous."""
    channels, planes = slice(index * dim, (index + 1) * dim), slice(index * groups, (index + 1) * groups)
    return dict(x, delta=x["delta"][:, channels], A=x["A"][channels].contiguous(), B=x["B"][:, planes],
                C=x["C"][:, planes], D=x["D"][:dim].contiguous(), delta_bias=x["delta_bias"][channels].contiguous())


def cross_fold_inputs(batch, dim, height, width, rank, dtype, seed, use_d=True, use_bias=True, softplus=True):
    """Inputs of the four-route op with folded step sizes at N = 1, in the op's layout: u (batch, dim,
    H, W); the low-rank delta (batch, 4, R, H, W), B, C (batch, 4, 1, H, W) in ``dtype``; the
    projection weight (4, dim, R), A (4 * dim, 1), D, delta_bias (4 * dim,) in fp32. The projected
    step sizes lie around the softplus knee (or are positive without softplus: |low| and |weight|)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    low = rand(batch, 4, rank, height, width) * 0.6
    weight = rand(4, dim, rank) * rank ** -0.5
    if not softplus:
        low, weight = low.abs() * 0.2 + 0.01, weight.abs()
    return {
        "u": rand(batch, dim, height, width).to(dtype),
        "delta": low.to(dtype),
        "delta_proj_weight": weight,
        "A": -(torch.rand(4 * dim, 1, generator=g) * 1.5 + 0.05),
        "B": rand(batch, 4, 1, height, width).to(dtype),
        "C": rand(batch, 4, 1, height, width).to(dtype),
        "D": rand(4 * dim) if use_d else None,
        "delta_bias": rand(4 * dim) * 0.3 - 0.8 if use_bias else None,
    }


def assert_cross_params(p, plan, inputs, batch, dim, side, delta_planes, y):
    """The RowsParams ``p`` a four-route launch passed for plan ``plan``: the pointers of ``inputs``
    (delta, B, C, A, D, delta_bias), ``delta_planes`` planes of delta a sample, the four routes' B / C
    planes of one group, a side x side map, the plan's lane layout, softplus on, y_fp32 from y's type,
    rows streamed from the top."""
    assert (p.delta, p.B, p.C, p.A, p.D, p.delta_bias) == tuple(t.data_ptr() for t in inputs)
    assert (p.delta_planes, p.bc_planes, p.batch, p.dim, p.groups, p.height, p.width) == (
        delta_planes, 4, batch, dim, 1, side, side)
    assert (p.seg_lanes, p.maps_per_warp, p.softplus, p.y_fp32, p.from_bottom) == (
        plan.seg_lanes, plan.maps_per_warp, 1, int(y.dtype == torch.float32), 0)


def assert_wide_lanes_agree(run, check, rows, x, expected, dtype, vec):
    """A four-route emulation at ``vec`` columns a lane: y in the input type (and in fp32 for 2-byte
    inputs) within ``check``'s tolerance of ``expected``, bit-equal across warp and lane orders, and the
    scalar-access form within tolerance too. ``run(rows, x, y_fp32=, vec=, order=, load=None)`` runs
    the kernel; ``check(y, expected, y_type)`` asserts the tolerance."""
    for y_fp32 in ((False, True) if dtype != torch.float32 else (False,)):
        y_type = torch.float32 if y_fp32 else dtype
        first = run(rows, x, y_fp32=y_fp32, vec=vec, order=0)
        check(first, expected, y_type)
        for order in (1, 3, 17):
            assert torch.equal(run(rows, x, y_fp32=y_fp32, vec=vec, order=order), first), (y_fp32, order)
        check(run(rows, x, y_fp32=y_fp32, vec=vec, load=1, order=2), expected, y_type)
