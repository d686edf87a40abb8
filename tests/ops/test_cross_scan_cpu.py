"""The CPU kernel's four-route scan (``cross_forward`` / ``cross_backward`` of the extension).

Every result is compared with an independent reference built from the single-route reference scan:
each route's inputs are reordered into the route's sequence (``to_route_order``), scanned on the
route's grid with ``selective_scan_2d_reference`` (fp64 loops), mapped back and summed over the
routes in order; gradients are autograd's through that reference.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from vmamba2d.ops import selective_scan_2d_reference
from vmamba2d.ops.compiled import extensions
from vmamba2d.ops.routes import CORNER_ROUTES, CROSS_ROUTES, Route, from_route_order, to_route_order

GRAD_NAMES = ("u", "delta", "A", "B", "C", "D", "delta_bias")


@pytest.fixture(scope="module")
def ext():
    module = extensions.cpu_extension()
    if module is None:
        pytest.skip("no CPU kernel (neither built nor JIT-compilable)")
    return module


def make_inputs(routes, batch, dim, nstate, height, width, *, use_d=True, use_bias=True, softplus=True,
                dtype=torch.float64, seed=0):
    """Inputs of the four-route op in map order: u (batch, dim, H, W), delta (batch, K, dim, H, W),
    A (K*dim, N), B / C (batch, K, N, H, W), D / delta_bias (K*dim,) or None."""
    g = torch.Generator().manual_seed(seed)
    k = len(routes)
    shape = (height, width)
    u = torch.randn(batch, dim, *shape, generator=g, dtype=dtype)
    if softplus:
        delta = 0.5 * torch.randn(batch, k, dim, *shape, generator=g, dtype=dtype)
    else:  # the step sizes themselves: positive, so that the decays stay below one
        delta = 0.05 + 0.5 * torch.rand(batch, k, dim, *shape, generator=g, dtype=dtype)
    return dict(
        u=u,
        delta=delta,
        A=-(0.2 + torch.rand(k * dim, nstate, generator=g, dtype=dtype)),
        B=torch.randn(batch, k, nstate, *shape, generator=g, dtype=dtype),
        C=torch.randn(batch, k, nstate, *shape, generator=g, dtype=dtype),
        D=torch.randn(k * dim, generator=g, dtype=dtype) if use_d else None,
        delta_bias=0.3 * torch.rand(k * dim, generator=g, dtype=dtype) if use_bias else None,
        delta_softplus=softplus,
    )


def reference_cross_scan(routes, u, delta, A, B, C, D, delta_bias, delta_softplus):
    """Sum over routes of the single-route reference scan of each route's reordered copy."""
    height, width = u.shape[-2:]
    dim = u.shape[1]
    y = torch.zeros_like(u)
    for k, route in enumerate(routes):
        rows = slice(k * dim, (k + 1) * dim)
        grid = route.grid(height, width)
        y_route = selective_scan_2d_reference(
            to_route_order(u, route), to_route_order(delta[:, k], route), A[rows],
            to_route_order(B[:, k], route).unsqueeze(1), to_route_order(C[:, k], route).unsqueeze(1),
            None if D is None else D[rows], None if delta_bias is None else delta_bias[rows],
            delta_softplus, height=grid[0], width=grid[1],
        )
        y = y + from_route_order(y_route, route, height, width)
    return y


def kernel_forward(ext, routes, inputs, out_fp32=False):
    return ext.cross_forward(**inputs, routes=[r.code for r in routes], out_fp32=out_fp32)


def kernel_grads(ext, routes, inputs, dy):
    grads = ext.cross_backward(**inputs, routes=[r.code for r in routes], dy=dy)
    return dict(zip(GRAD_NAMES, grads))


def reference_grads(routes, inputs, dy):
    leaves = {k: (v.detach().clone().requires_grad_(True) if isinstance(v, torch.Tensor) else v)
              for k, v in inputs.items()}
    y = reference_cross_scan(routes, **leaves)
    names = [n for n in GRAD_NAMES if leaves[n] is not None]
    grads = torch.autograd.grad(y, [leaves[n] for n in names], dy)
    return dict(zip(names, grads))


def check_against_reference(ext, routes, inputs, *, seed=1):
    expected_y = reference_cross_scan(routes, **inputs)
    torch.testing.assert_close(kernel_forward(ext, routes, inputs), expected_y, rtol=1e-10, atol=1e-10)
    dy = torch.randn(expected_y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    got = kernel_grads(ext, routes, inputs, dy)
    expected = reference_grads(routes, inputs, dy)
    for name in GRAD_NAMES:
        if name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-9, atol=1e-9, msg=name)
        else:
            assert got[name] is None, name


@pytest.mark.parametrize("code", range(16))
def test_every_route_matches_reference(ext, code):
    routes = (Route.from_code(code),)
    check_against_reference(ext, routes, make_inputs(routes, 2, 3, 2, 5, 7, seed=code))


ROUTE_SETS = {
    "cross_2d": CROSS_ROUTES,
    "corners_2d": CORNER_ROUTES,
    "cross_flat": tuple(r._replace(flat=True) for r in CROSS_ROUTES),
    "corners_flat": tuple(r._replace(flat=True) for r in CORNER_ROUTES),
}
SHAPES = [(5, 7), (7, 5), (1, 6), (6, 1), (1, 1)]
# Every route set on every shape; N, D, delta_bias and softplus vary along the cases.
SET_CASES = [
    (name, shape, nstate, use_d, use_bias, softplus)
    for (name, shape), (nstate, use_d, use_bias, softplus) in zip(
        itertools.product(ROUTE_SETS, SHAPES),
        itertools.cycle([(1, True, True, True), (3, False, False, True), (3, True, False, False),
                         (1, False, True, False)]),  # 4 configurations against 5 shapes: all pairs vary
    )
]


@pytest.mark.parametrize("case", SET_CASES, ids=lambda c: f"{c[0]}-{c[1][0]}x{c[1][1]}-N{c[2]}"
                         f"{'-D' if c[3] else ''}{'-bias' if c[4] else ''}{'-softplus' if c[5] else ''}")
def test_route_sets_match_reference(ext, case):
    name, (height, width), nstate, use_d, use_bias, softplus = case
    routes = ROUTE_SETS[name]
    inputs = make_inputs(routes, 2, 3, nstate, height, width, use_d=use_d, use_bias=use_bias,
                         softplus=softplus, seed=height * 10 + width)
    check_against_reference(ext, routes, inputs)


def test_mixed_2d_and_flat_routes_match_reference(ext):
    routes = (Route(flat=True), Route(from_right=True, columns_first=True), Route(from_bottom=True, flat=True),
              Route(from_bottom=True, from_right=True), Route(columns_first=True, flat=True))
    check_against_reference(ext, routes, make_inputs(routes, 1, 2, 2, 9, 10, seed=5))


# (5, 37): rows of two 16-float vectors and a tail, for the vectorised row passes of the AVX-512 build.
@pytest.mark.parametrize("height, width", [(11, 9), (5, 37)])
@pytest.mark.parametrize("scan", ["2d", "flat"])
def test_fp32_matches_fp64(ext, scan, height, width):
    routes = ROUTE_SETS[f"cross_{scan}"]
    inputs = make_inputs(routes, 2, 4, 3, height, width, seed=7)
    fp32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    dy = torch.randn(2, 4, height, width, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    y64 = kernel_forward(ext, routes, inputs)
    y32 = kernel_forward(ext, routes, fp32)
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y64, rtol=1e-5, atol=1e-5)
    got64 = kernel_grads(ext, routes, inputs, dy)
    got32 = kernel_grads(ext, routes, fp32, dy.float())
    for name in GRAD_NAMES:
        assert got32[name].dtype == torch.float32, name
        torch.testing.assert_close(got32[name].double(), got64[name], rtol=1e-4, atol=1e-4, msg=name)


def test_fp64_inputs_with_fp32_parameters_and_fp32_output(ext):
    routes = CROSS_ROUTES
    inputs = make_inputs(routes, 1, 2, 2, 4, 5, seed=9)
    mixed = dict(inputs, A=inputs["A"].float(), D=inputs["D"].float(), delta_bias=inputs["delta_bias"].float())
    y = kernel_forward(ext, routes, mixed, out_fp32=True)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), reference_cross_scan(routes, **mixed), rtol=1e-6, atol=1e-6)
    grads = kernel_grads(ext, routes, mixed, torch.ones(1, 2, 4, 5, dtype=torch.float64))
    assert [grads[n].dtype for n in GRAD_NAMES] == [torch.float64] * 2 + [torch.float32] + [torch.float64] * 2 + [
        torch.float32] * 2


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_every_instruction_set_build_matches_reference(ext, isa, monkeypatch):
    monkeypatch.setenv("VMAMBA2D_CPU_ISA", isa)
    if ext.isa() != isa:
        pytest.skip(f"this CPU (or compiler) has no {isa} build of the kernel")
    routes = (Route(), Route(from_bottom=True, from_right=True, columns_first=True), Route(from_right=True, flat=True),
              Route(from_bottom=True, columns_first=True, flat=True))
    inputs = make_inputs(routes, 2, 2, 3, 10, 17, seed=10)
    check_against_reference(ext, routes, inputs)
    fp32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    torch.testing.assert_close(kernel_forward(ext, routes, fp32).double(), reference_cross_scan(routes, **inputs),
                               rtol=1e-5, atol=1e-5)


def test_results_do_not_depend_on_the_thread_count(ext):
    routes = ROUTE_SETS["cross_2d"] + ROUTE_SETS["corners_flat"]
    inputs = make_inputs(routes, 3, 5, 2, 9, 11, dtype=torch.float32, seed=11)
    dy = torch.randn(3, 5, 9, 11, generator=torch.Generator().manual_seed(12))
    threads = torch.get_num_threads()
    runs = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            runs.append([kernel_forward(ext, routes, inputs), *kernel_grads(ext, routes, inputs, dy).values()])
    finally:
        torch.set_num_threads(threads)
    for name, one, two in zip(("y",) + GRAD_NAMES, *runs):
        assert torch.equal(one, two), name


@pytest.mark.parametrize("batch, dim", [(0, 3), (2, 0)])
def test_no_batch_or_no_channels_gives_empty_outputs_and_zero_grads(ext, batch, dim):
    routes = CROSS_ROUTES
    inputs = make_inputs(routes, batch, dim, 2, 4, 5)
    y = kernel_forward(ext, routes, inputs)
    assert y.shape == (batch, dim, 4, 5)
    grads = kernel_grads(ext, routes, inputs, torch.zeros_like(y))
    for name in GRAD_NAMES:
        assert torch.equal(grads[name], torch.zeros_like(inputs[name])), name


def _valid_inputs():
    return make_inputs(CROSS_ROUTES, 1, 2, 2, 3, 4)


@pytest.mark.parametrize("change, routes, message", [
    ({}, [0, 16], "route codes"),
    ({}, [], "at least one route"),
    ({}, [0, 1, 2], "delta must be"),
    ({"delta": torch.zeros(1, 4, 2, 3, 5, dtype=torch.float64)}, None, "delta must be"),
    ({"A": torch.zeros(6, 2, dtype=torch.float64)}, None, "A must be"),
    ({"B": torch.zeros(1, 4, 2, 4, 3, dtype=torch.float64)}, None, "B must be"),
    ({"C": torch.zeros(1, 4, 3, 3, 4, dtype=torch.float64)}, None, "C must be"),
    ({"D": torch.zeros(2, dtype=torch.float64)}, None, "D must be"),
    ({"delta_bias": torch.zeros(9, dtype=torch.float64)}, None, "delta_bias must be"),
    ({"u": torch.zeros(1, 2, 12, dtype=torch.float64)}, None, "u must be"),
    ({"B": torch.zeros(1, 4, 2, 3, 4, dtype=torch.float32)}, None, "share a dtype"),
    ({"C": torch.zeros(1, 4, 2, 3, 4, dtype=torch.int64)}, None, "C must be float32 or float64"),
])
def test_bad_inputs_raise_naming_the_argument(ext, change, routes, message):
    inputs = dict(_valid_inputs(), **change)
    codes = [r.code for r in CROSS_ROUTES] if routes is None else routes
    with pytest.raises(RuntimeError, match=message):
        ext.cross_forward(**inputs, routes=codes, out_fp32=False)
    with pytest.raises(RuntimeError, match=message):
        ext.cross_backward(**inputs, routes=codes, dy=torch.zeros(1, 2, 3, 4, dtype=torch.float64))


def test_backward_rejects_a_dy_of_another_shape(ext):
    with pytest.raises(RuntimeError, match="dy must match"):
        ext.cross_backward(**_valid_inputs(), routes=[r.code for r in CROSS_ROUTES],
                           dy=torch.zeros(1, 2, 4, 3, dtype=torch.float64))


@pytest.mark.parametrize("name", ["cross_2d", "corners_flat"])
def test_channels_last_maps_are_scanned_in_their_layout(ext, name):
    """u channels-last (the models' layout): y and du come out channels-last with the reference's
    values; dy is read channels-last too."""
    routes = ROUTE_SETS[name]
    inputs = make_inputs(routes, 2, 5, 2, 6, 7, seed=13)
    dy = torch.randn(2, 5, 6, 7, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    channels_last = dict(inputs, u=inputs["u"].contiguous(memory_format=torch.channels_last))
    y = kernel_forward(ext, routes, channels_last)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    torch.testing.assert_close(y, reference_cross_scan(routes, **inputs), rtol=1e-10, atol=1e-10)
    got = kernel_grads(ext, routes, channels_last, dy.contiguous(memory_format=torch.channels_last))
    assert got["u"].is_contiguous(memory_format=torch.channels_last)
    expected = reference_grads(routes, inputs, dy)
    for grad_name in GRAD_NAMES:
        torch.testing.assert_close(got[grad_name], expected[grad_name], rtol=1e-9, atol=1e-9, msg=grad_name)


def test_a_map_neither_contiguous_nor_channels_last_is_rejected(ext):
    inputs = dict(_valid_inputs())
    inputs["u"] = inputs["u"].transpose(2, 3).contiguous().transpose(2, 3)
    with pytest.raises(RuntimeError, match="u must be contiguous or channels-last"):
        ext.cross_forward(**inputs, routes=[r.code for r in CROSS_ROUTES], out_fp32=False)
