"""The four-route op: route definitions, the public op on every backend, validation, FLOPs.

The independent reference here is the recurrence of each route written as loops over the map's
own (i, j) coordinates in the route's visiting order — no permutation helpers involved.
"""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from vmamba2d.ops import CORNER_ROUTES, CROSS_ROUTES, Route, cross_selective_scan_2d, route_set
from vmamba2d.ops.interface import cross_scan_per_route
from vmamba2d.ops.routes import from_route_order, resolve_routes, to_route_order

ALL_ROUTES = [Route.from_code(code) for code in range(16)]


def _route_loops(u, delta, A, B, C, D, delta_bias, softplus, route):
    """One route's output (batch, dim, H, W) by loops in map coordinates (fp64)."""
    batch, dim, height, width = u.shape
    dt = delta + (0 if delta_bias is None else delta_bias[None, :, None, None])
    dt = F.softplus(dt) if softplus else dt
    decay = torch.exp(dt[:, :, None] * A[None, :, :, None, None])  # (batch, dim, N, H, W)
    x = (dt * u)[:, :, None] * B[:, None]  # (batch, dim, N, H, W)
    rows = list(range(height))[:: -1 if route.from_bottom else 1]
    cols = list(range(width))[:: -1 if route.from_right else 1]
    h = {}  # (i, j) -> state (batch, dim, N); a dict, not in-place writes, so autograd can follow
    if route.flat:
        order = [(i, j) for j in cols for i in rows] if route.columns_first else [(i, j) for i in rows for j in cols]
        state = torch.zeros_like(x[..., 0, 0])
        for i, j in order:
            state = decay[..., i, j] * state + x[..., i, j]
            h[i, j] = state
    else:
        outer, inner = (cols, rows) if route.columns_first else (rows, cols)
        previous_outer = None
        for o in outer:
            run = torch.zeros_like(x[..., 0, 0])
            for n in inner:
                i, j = (n, o) if route.columns_first else (o, n)
                run = decay[..., i, j] * run + x[..., i, j]
                before = 0.0
                if previous_outer is not None:
                    before = h[(i, previous_outer) if route.columns_first else (previous_outer, j)]
                h[i, j] = decay[..., i, j] * before + run
            previous_outer = o
    h = torch.stack([torch.stack([h[i, j] for j in range(width)], -1) for i in range(height)], -2)
    y = (h * C[:, None]).sum(2)
    return y if D is None else y + D[None, :, None, None] * u


def _loops_reference(u, delta, A, B, C, D, delta_bias, softplus, routes):
    dim = u.shape[1]
    total = torch.zeros_like(u)
    for k, route in enumerate(routes):
        part = slice(k * dim, (k + 1) * dim)
        total = total + _route_loops(
            u, delta[:, k], A[part], B[:, k], C[:, k], None if D is None else D[part],
            None if delta_bias is None else delta_bias[part], softplus, route,
        )
    return total


def _inputs(batch=2, dim=3, height=4, width=5, nstate=2, routes=4, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    return dict(
        u=rand(batch, dim, height, width),
        delta=rand(batch, routes, dim, height, width) * 0.5,
        A=-torch.rand(routes * dim, nstate, generator=gen, dtype=dtype) - 0.3,
        B=rand(batch, routes, nstate, height, width),
        C=rand(batch, routes, nstate, height, width),
        D=rand(routes * dim),
        delta_bias=rand(routes * dim) * 0.3,
    )


def test_route_codes_round_trip_and_sets():
    assert [Route.from_code(r.code) for r in ALL_ROUTES] == ALL_ROUTES
    assert len({r.code for r in ALL_ROUTES}) == 16
    assert [r.code for r in CROSS_ROUTES] == [0, 4, 3, 7]
    origins = {(r.from_bottom, r.from_right) for r in CORNER_ROUTES}
    assert origins == {(False, False), (False, True), (True, False), (True, True)}
    assert all(r.flat for r in route_set("cross", scan="1d"))
    assert resolve_routes([0, 4]) == (Route(), Route(columns_first=True))
    with pytest.raises(ValueError, match="routes must be one of"):
        route_set("diagonal")
    with pytest.raises(ValueError, match="route code"):
        Route.from_code(16)


@pytest.mark.parametrize("route", ALL_ROUTES, ids=lambda r: f"code{r.code}")
def test_route_order_is_a_permutation_and_inverts(route):
    x = torch.arange(12.0).view(1, 3, 4)
    seq = to_route_order(x, route)
    assert sorted(seq.flatten().tolist()) == list(range(12))
    torch.testing.assert_close(from_route_order(seq, route, 3, 4), x)
    # The sequence starts at the route's origin corner.
    first_row = 2 if route.from_bottom else 0
    first_col = 3 if route.from_right else 0
    assert seq[0, 0].item() == x[0, first_row, first_col].item()


def test_cross_routes_are_vmamba_sequences():
    """k0..k3 visit the map as VMamba's cross-scan builds its four sequences."""
    x = torch.arange(6.0).view(1, 1, 2, 3)
    rows, cols = x.flatten(2), x.transpose(2, 3).flatten(2)
    expected = [rows, cols, rows.flip(-1), cols.flip(-1)]
    for route, seq in zip(CROSS_ROUTES, expected):
        torch.testing.assert_close(to_route_order(x, route), seq)


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("height,width", [(4, 5), (1, 6), (5, 1), (1, 1)])
def test_every_route_matches_the_map_coordinate_loops(backend, height, width):
    inputs = _inputs(height=height, width=width, routes=16)
    expected = _loops_reference(**inputs, softplus=True, routes=ALL_ROUTES)
    got = cross_selective_scan_2d(**inputs, routes=ALL_ROUTES, backend=backend)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("routes", ["cross", "corners", route_set("cross", "1d")], ids=["cross", "corners", "flat"])
def test_route_sets_without_optional_inputs(routes):
    inputs = _inputs(height=3, width=4, nstate=1)
    inputs.update(D=None, delta_bias=None)
    resolved = resolve_routes(routes)
    expected = _loops_reference(**inputs, softplus=False, routes=resolved)
    got = cross_selective_scan_2d(**inputs, delta_softplus=False, routes=routes, backend="cpu")
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("routes", ["cross", route_set("corners", "1d")], ids=["cross", "corners-flat"])
def test_cpu_backend_matches_loops_with_gradients(routes):
    inputs = {k: v.requires_grad_() for k, v in _inputs(height=5, width=3).items()}
    resolved = resolve_routes(routes)
    grad_out = torch.randn(2, 3, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = _loops_reference(**inputs, softplus=True, routes=resolved)
    expected_grads = torch.autograd.grad(expected, list(inputs.values()), grad_out)
    got = cross_selective_scan_2d(**inputs, routes=routes, backend="cpu")
    got_grads = torch.autograd.grad(got, list(inputs.values()), grad_out)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    for name, g, e in zip(inputs, got_grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9, msg=f"d{name}")


def test_per_route_path_sums_in_fp32_and_casts_to_out_dtype():
    inputs = {k: v.float() for k, v in _inputs().items()}
    y = cross_scan_per_route(
        **inputs, delta_softplus=True, routes=CROSS_ROUTES, backend="torch", out_dtype=torch.bfloat16
    )
    assert y.dtype == torch.bfloat16
    expected = _loops_reference(**{k: v.double() for k, v in inputs.items()}, softplus=True, routes=CROSS_ROUTES)
    torch.testing.assert_close(y.double(), expected, rtol=2e-2, atol=2e-2)


def test_empty_batch():
    inputs = _inputs(batch=0)
    for backend in ("torch", "cpu"):
        y = cross_selective_scan_2d(**inputs, backend=backend)
        assert y.shape == (0, 3, 4, 5)


@pytest.mark.parametrize("height, width", [(0, 5), (4, 0)])
@pytest.mark.parametrize("backend", ["cpu", "torch", "reference"])
def test_an_empty_map_is_the_same_value_error_on_every_backend(backend, height, width):
    inputs = _inputs(batch=1)
    inputs = {name: t[..., :height, :width] if t.dim() >= 4 else t for name, t in inputs.items()}
    with pytest.raises(ValueError, match=rf"u's map must not be empty \(H >= 1 and W >= 1\), got shape \(1, 3, {height}, {width}\)"):
        cross_selective_scan_2d(**inputs, backend=backend)


@pytest.mark.parametrize(
    "change,error,match",
    [
        (dict(u=torch.zeros(2, 3, 20)), ValueError, r"u must be 4-D \(batch, dim, H, W\)"),
        (dict(delta=torch.zeros(2, 3, 3, 4, 5, dtype=torch.float64)), ValueError, r"delta must have shape \(batch, K, dim, H, W\)"),
        (dict(A=torch.zeros(3, 2, dtype=torch.float64)), ValueError, r"A must have shape \(K \* dim, N\)"),
        (dict(B=torch.zeros(2, 4, 2, 5, 4, dtype=torch.float64)), ValueError, r"B must have shape \(batch, K, N, H, W\)"),
        (dict(C=torch.zeros(2, 4, 1, 4, 5, dtype=torch.float64)), ValueError, r"C must have shape"),
        (dict(D=torch.zeros(3, dtype=torch.float64)), ValueError, r"D must have shape \(K \* dim,\)"),
        (dict(delta_bias=torch.zeros(4, 3, dtype=torch.float64)), ValueError, r"delta_bias must have shape"),
        (dict(B=torch.zeros(2, 4, 2, 4, 5, dtype=torch.bfloat16)), TypeError, r"B has dtype torch.bfloat16 but u has torch.float64"),
        (dict(u=torch.zeros(2, 3, 4, 5, dtype=torch.int64)), TypeError, r"u must be a floating-point tensor"),
        (dict(routes="diagonal"), ValueError, r"routes must be one of"),
        (dict(routes=[0, 4, 3]), ValueError, r"delta must have shape \(batch, K, dim, H, W\) = \(2, 3, 3, 4, 5\)"),
        (dict(backend="gpu"), ValueError, r"backend must be one of"),
    ],
)
def test_bad_arguments_name_the_argument(change, error, match):
    kwargs = dict(_inputs(), routes="cross", backend="torch")
    kwargs.update(change)
    with pytest.raises(error, match=match):
        cross_selective_scan_2d(**kwargs)


def test_mixed_data_dtypes_raise_in_the_single_route_op_too():
    from vmamba2d.ops import selective_scan_2d

    u = torch.randn(1, 2, 6, dtype=torch.float64)
    with pytest.raises(TypeError, match="B has dtype torch.bfloat16 but u has torch.float64"):
        selective_scan_2d(u, u.clone(), -torch.ones(2, 1), torch.ones(1, 1, 1, 6, dtype=torch.bfloat16),
                          torch.ones(1, 1, 1, 6, dtype=torch.float64), height=2, width=3)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_fp32_parameters_with_fp64_data_are_accepted(backend):
    inputs = _inputs()
    inputs.update(A=inputs["A"].float(), D=inputs["D"].float(), delta_bias=inputs["delta_bias"].float())
    y = cross_selective_scan_2d(**inputs, backend=backend)
    assert y.dtype == torch.float64


def test_fvcore_counts_the_four_route_op_like_its_routes():
    from vmamba2d.ops.flops import FVCORE_OP_HANDLES, scan_1d_flops, scan_2d_flops

    fvcore = pytest.importorskip("fvcore.nn")

    class Mixer(torch.nn.Module):
        def __init__(self, routes):
            super().__init__()
            self.routes = routes

        def forward(self, u, delta, A, B, C, D):
            return cross_selective_scan_2d(u, delta, A, B, C, D, routes=self.routes, backend="cpu")

    inputs = {k: v.float() for k, v in _inputs(batch=2, dim=3, height=4, width=5, nstate=2).items()}
    args = tuple(inputs[k] for k in ("u", "delta", "A", "B", "C", "D"))
    for routes, per_route in (("cross", scan_2d_flops), (route_set("cross", "1d"), scan_1d_flops)):
        analysis = fvcore.FlopCountAnalysis(Mixer(routes), args).set_op_handle(**FVCORE_OP_HANDLES)
        analysis.unsupported_ops_warnings(False)
        assert analysis.total() == 4 * per_route(2, 3, 20, 2, with_d=True)


def test_four_route_ops_share_the_flop_handles_argument_positions():
    """The fvcore handle reads u, A, D and routes by position: every four-route op's schema has
    them there."""
    from vmamba2d.ops.flops import FVCORE_OP_HANDLES, cross_selective_scan_2d_flop_jit

    names = [name for name, handle in FVCORE_OP_HANDLES.items() if handle is cross_selective_scan_2d_flop_jit]
    assert len(names) == 2
    for name in names:
        namespace, op = name.split("::")
        arguments = [a.name for a in getattr(getattr(torch.ops, namespace), op).default._schema.arguments]
        assert [arguments[i] for i in (0, 2, 5, 8)] == ["u", "A", "D", "routes"], name


def test_channels_last_map_stays_channels_last_through_the_cpu_op():
    """The models' maps are channels-last: the op returns y (and du) in that layout, no copy, with the
    loops' values; the fake implementation reports the same layout (torch.compile / export)."""
    inputs = _inputs(height=5, width=6)
    inputs["u"] = inputs["u"].contiguous(memory_format=torch.channels_last)
    leaves = {k: v.requires_grad_() for k, v in inputs.items()}
    grad_out = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    expected = _loops_reference(**leaves, softplus=True, routes=CROSS_ROUTES)
    expected_grads = torch.autograd.grad(expected, list(leaves.values()), grad_out)
    got = cross_selective_scan_2d(**leaves, routes="cross", backend="cpu")
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    got_grads = torch.autograd.grad(got, list(leaves.values()), grad_out.contiguous(memory_format=torch.channels_last))
    assert got_grads[0].is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    for name, g, e in zip(leaves, got_grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9, msg=f"d{name}")
    op = torch.ops.vmamba2d.cross_selective_scan_2d_fwd.default
    args = tuple(inputs[k].detach() for k in ("u", "delta", "A", "B", "C", "D", "delta_bias"))
    torch.library.opcheck(op, args + (True, [r.code for r in CROSS_ROUTES], False),
                          test_utils=("test_schema", "test_faketensor"))
