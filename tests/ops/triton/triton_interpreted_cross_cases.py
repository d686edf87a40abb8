"""The Triton four-route kernels run by Triton's interpreter on CPU tensors (no GPU needed).

Run with tests/ops/triton/triton_interpreted_cases.py by
``tests/ops/triton/test_scan_triton.py::test_kernels_in_the_interpreter`` (one child process with
``TRITON_INTERPRET=1``; see that file). Compared with the per-route formulation on fp64 loops
(``cross_scan_per_route(..., backend="reference")``: route-order copies scanned one by one):
forward and every gradient for the 2D and flat route sets, multi-tile maps with edge tiles,
1 x W / H x 1 / 1 x 1 maps, N = 1 and N > 1, partial channel blocks, without D / delta_bias /
softplus; half and fp32 inputs; the public op's dispatch; bitwise-repeatable gradients;
torch.compile and the custom ops' fake implementations.
"""
from __future__ import annotations

import pytest

from support.triton_interpreter import record_kernel_launches, require_interpreter

require_interpreter("tests/ops/triton/test_scan_triton.py")

import torch  # noqa: E402
import triton_interpreted_cases  # noqa: E402,F401  (installs the fast interpreter scan)

from support.scan_cases import assert_half_precision_close  # noqa: E402
from vmamba2d.ops import cross_selective_scan_2d, route_set  # noqa: E402
from vmamba2d.ops.triton import cross_ops as triton_cross  # noqa: E402
from vmamba2d.ops.triton import launch as triton_launch  # noqa: E402
from vmamba2d.ops.interface import cross_scan_mode, cross_scan_per_route  # noqa: E402

TENSORS = ("u", "delta", "A", "B", "C", "D", "delta_bias")


def make_cross_inputs(batch, dim, nstate, height, width, num_routes, *, use_d=True, use_bias=True,
                      softplus=True, seed=0):
    """fp64 inputs of the four-route op (dict of keyword arguments)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    rows = num_routes * dim
    delta = randn(batch, num_routes, dim, height, width)
    if not softplus:  # dt = delta (+ bias) must stay positive
        delta = 0.1 + 0.9 * torch.rand(delta.shape, generator=gen, dtype=torch.float64)
    return dict(
        u=randn(batch, dim, height, width),
        delta=delta,
        A=-(0.2 + torch.rand(rows, nstate, generator=gen, dtype=torch.float64)),
        B=randn(batch, num_routes, nstate, height, width),
        C=randn(batch, num_routes, nstate, height, width),
        D=randn(rows) if use_d else None,
        delta_bias=(0.5 * randn(rows) if softplus else 0.1 * torch.rand(rows, generator=gen, dtype=torch.float64))
        if use_bias else None,
        delta_softplus=softplus,
    )


def reference(routes, **kw):
    return cross_scan_per_route(kw["u"], kw["delta"], kw["A"], kw["B"], kw["C"], kw["D"], kw["delta_bias"],
                                kw["delta_softplus"], routes, "reference", torch.float64)


def triton_op(routes, out_dtype=None, **kw):
    return cross_selective_scan_2d(**kw, routes=routes, backend="triton", out_dtype=out_dtype)


def grads(fn, inputs, dy):
    """(y, {name: gradient}) of ``fn(**inputs)`` for the output gradient dy."""
    names = [k for k in TENSORS if inputs[k] is not None]
    leaves = {k: inputs[k].clone().requires_grad_() for k in names}
    y = fn(**dict(inputs, **leaves))
    return y.detach(), dict(zip(names, torch.autograd.grad(y, list(leaves.values()), dy)))


# (route set, scan, H, W, batch, dim, N, D, bias, softplus, tile or None for the default)
CASES = [
    ("cross", "2d", 5, 7, 1, 3, 2, True, True, True, "2x4"),  # 3 x 2 tiles, edge tiles, 3 channel blocks
    ("corners", "2d", 4, 6, 1, 3, 1, False, False, False, "2x4"),  # no D / bias
    ("cross", "1d", 5, 7, 1, 3, 2, True, False, True, "2x4"),  # 5 chunks of 8 steps, the last partial
    ("corners", "1d", 3, 6, 2, 2, 1, False, True, True, None),
    ("cross", "2d", 6, 9, 1, 2, 3, True, True, True, None),  # N = 3 padded to 4, one tile
    ("corners", "2d", 1, 9, 1, 2, 1, True, True, True, "1x4"),  # 1 x W
    ("cross", "2d", 9, 1, 1, 2, 2, True, True, True, "4x1"),  # H x 1
    ("corners", "1d", 1, 1, 1, 2, 2, True, True, True, None),  # 1 x 1
    ("cross", "1d", 7, 1, 1, 2, 1, False, True, True, "2x2"),  # column-major chunks on H x 1
]


def _case_id(case):
    name, scan, h, w, b, d, n, use_d, use_bias, sp, tile = case
    return (f"{name}-{scan}-{h}x{w}-b{b}-d{d}-N{n}" + "-D" * use_d + "-bias" * use_bias + "-softplus" * sp
            + (f"-tile{tile}" if tile else ""))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_forward_and_gradients_match_the_per_route_reference(case, monkeypatch):
    name, scan, height, width, batch, dim, nstate, use_d, use_bias, softplus, tile = case
    if tile:
        monkeypatch.setenv(triton_launch.TILE_ENV_VAR, tile)
    routes = route_set(name, scan)
    inputs = make_cross_inputs(batch, dim, nstate, height, width, len(routes), use_d=use_d, use_bias=use_bias,
                               softplus=softplus, seed=height * 10 + width)
    dy = torch.randn(batch, dim, height, width, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    y_ref, expected = grads(lambda **kw: reference(routes, **kw), inputs, dy)
    y, got = grads(lambda **kw: triton_op(routes, **kw), inputs, dy)
    assert y.dtype == torch.float64 and y.shape == (batch, dim, height, width)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    assert set(got) == set(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-9, atol=1e-9, msg=key)


def test_the_public_op_runs_the_native_kernel(monkeypatch):
    assert cross_scan_mode("triton") == "native"
    inputs = make_cross_inputs(1, 2, 1, 2, 3, 4, seed=1)
    calls = []
    original = triton_launch.kernels
    monkeypatch.setattr(triton_launch, "kernels", lambda: calls.append(1) or original())
    y = triton_op("cross", **inputs)
    assert calls == [1]  # one forward launch for all four routes
    torch.testing.assert_close(y, reference(route_set("cross"), **inputs), rtol=1e-10, atol=1e-10)


def test_folded_step_size_projection_matches_the_explicit_projection():
    """delta_proj_weight: the low-rank delta projected by the op equals the explicit einsum fed
    to the per-route reference, forward and every gradient (the weight's and the low-rank delta's)."""
    inputs = make_cross_inputs(1, 3, 2, 3, 5, 4, seed=7)
    gen = torch.Generator().manual_seed(8)
    low = torch.randn(1, 4, 2, 3, 5, generator=gen, dtype=torch.float64).requires_grad_()
    weight = (0.5 * torch.randn(4, 3, 2, generator=gen, dtype=torch.float64)).requires_grad_()
    leaves = {k: inputs[k].clone().requires_grad_() for k in TENSORS if k != "delta"}
    dy = torch.randn(1, 3, 3, 5, generator=gen, dtype=torch.float64)
    wrt = list(leaves.values()) + [low, weight]
    full = torch.einsum("kdr,bkrhw->bkdhw", weight, low)
    expected = reference(route_set("cross"), **dict(inputs, **leaves, delta=full))
    y = triton_op("cross", **dict(inputs, **leaves, delta=low, delta_proj_weight=weight))
    torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-10)
    for name, g, e in zip([*leaves, "delta", "delta_proj_weight"], torch.autograd.grad(y, wrt, dy),
                          torch.autograd.grad(expected, wrt, dy)):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9, msg=name)


def test_the_backward_launches_no_forward_sweep(monkeypatch):
    """The forward saves the tile carries; the backward op launches only the backward kernel."""
    inputs = make_cross_inputs(1, 2, 1, 3, 4, 4, seed=2)
    launched = record_kernel_launches(monkeypatch)
    names = [k for k in TENSORS if inputs[k] is not None]
    leaves = {k: inputs[k].clone().requires_grad_() for k in names}
    y = triton_op("cross", **dict(inputs, **leaves))
    assert launched == ["scan2d_fwd_kernel"]
    y.sum().backward()
    assert launched == ["scan2d_fwd_kernel", "scan2d_bwd_kernel"]


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_fp32(half, monkeypatch):
    """Also: 2x4 tiles and programs of 2 channel blocks, where 2-byte C is read once per set."""
    monkeypatch.setenv(triton_launch.TILE_ENV_VAR, "2x4")
    monkeypatch.setattr(triton_launch, "MAX_SETS", 2)
    routes = route_set("cross")
    inputs = make_cross_inputs(1, 2, 2, 3, 5, 4, seed=11)
    for key in ("u", "delta", "B", "C"):
        inputs[key] = inputs[key].to(half)
    for key in ("A", "D", "delta_bias"):
        inputs[key] = inputs[key].float()
    exact = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    dy = torch.randn(1, 2, 3, 5, generator=torch.Generator().manual_seed(12)).to(half)
    y_ref, expected = grads(lambda **kw: reference(routes, **kw), exact, dy.double())
    y_fp32 = triton_op(routes, out_dtype=torch.float32, **inputs)
    assert y_fp32.dtype == torch.float32
    torch.testing.assert_close(y_fp32.double(), y_ref, rtol=2e-5, atol=2e-5)
    y, got = grads(lambda **kw: triton_op(routes, **kw), inputs, dy)
    assert y.dtype == half
    assert_half_precision_close(y, y_ref, got, expected, inputs)


def test_fp32_inputs_and_repeatable_gradients(monkeypatch):
    """Also: programs of 2 channel blocks each, 2 programs per batch element."""
    monkeypatch.setenv(triton_launch.TILE_ENV_VAR, "2x4")
    monkeypatch.setattr(triton_launch, "MAX_SETS", 2)
    routes = route_set("corners", "1d")[:2] + route_set("cross")[2:]  # flat and 2D routes in one op
    inputs = make_cross_inputs(1, 4, 2, 5, 6, len(routes), seed=13)  # N = 2: 4 blocks of 1 channel
    dy = torch.randn(1, 4, 5, 6, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    y_ref, expected = grads(lambda **kw: reference(routes, **kw), inputs, dy)
    fp32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    runs = [grads(lambda **kw: triton_op(routes, **kw), fp32, dy.float()) for _ in range(2)]
    torch.testing.assert_close(runs[0][0].double(), y_ref, rtol=1e-5, atol=1e-5)
    for key in expected:
        assert runs[0][1][key].dtype == torch.float32, key
        torch.testing.assert_close(runs[0][1][key].double(), expected[key], rtol=1e-4, atol=1e-4, msg=key)
        assert torch.equal(runs[0][1][key], runs[1][1][key]), key


def test_programs_of_several_channels(monkeypatch):
    """A larger register block: 4 channels per program, the last one past dim."""
    monkeypatch.setattr(triton_launch, "BLOCK_ELEMENTS", 1024)
    assert triton_launch.cross_tiling(3, 1, 5, 6).block_d == 4
    routes = route_set("cross")[:2] + route_set("corners", "1d")[2:]
    inputs = make_cross_inputs(1, 3, 1, 5, 6, len(routes), seed=21)
    dy = torch.randn(1, 3, 5, 6, generator=torch.Generator().manual_seed(22), dtype=torch.float64)
    y_ref, expected = grads(lambda **kw: reference(routes, **kw), inputs, dy)
    y, got = grads(lambda **kw: triton_op(routes, **kw), inputs, dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-9, atol=1e-9, msg=key)


def test_empty_batch():
    batch, dim, nstate, height, width = 0, 2, 1, 3, 4
    inputs = make_cross_inputs(batch, dim, nstate, height, width, 4)
    y, got = grads(lambda **kw: triton_op("cross", **kw), inputs, torch.zeros(batch, dim, height, width,
                                                                               dtype=torch.float64))
    assert y.shape == (batch, dim, height, width)
    for key, grad in got.items():
        assert grad.shape == inputs[key].shape and not grad.any(), key


def test_an_empty_map_is_the_value_error_of_every_backend():
    inputs = make_cross_inputs(1, 2, 1, 0, 4, 4)
    with pytest.raises(ValueError, match=r"u's map must not be empty \(H >= 1 and W >= 1\), got shape \(1, 2, 0, 4\)"):
        triton_op("cross", **inputs)


def test_more_routes_than_the_kernel_packs_raise():
    inputs = make_cross_inputs(1, 1, 1, 2, 2, 16, seed=23)
    with pytest.raises(ValueError, match="at most 15 routes"):
        triton_op([r for r in route_set("cross") for _ in range(4)], **inputs)


def test_carries_are_saved_only_for_a_backward():
    inputs = make_cross_inputs(1, 2, 1, 3, 4, 4, seed=15)
    args = [inputs[k] for k in TENSORS]
    codes = [r.code for r in route_set("cross")]
    y_saved, vcarry, hcarry = triton_cross.cross_selective_scan_2d_triton_fwd(*args, True, codes, False, True)
    y_plain, no_v, no_h = triton_cross.cross_selective_scan_2d_triton_fwd(*args, True, codes, False, False)
    assert vcarry.numel() > 0 and hcarry.numel() > 0 and no_v.numel() == 0 and no_h.numel() == 0
    assert torch.equal(y_saved, y_plain)
    dy = torch.ones(1, 2, 3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="save_carries=True"):
        triton_cross.cross_selective_scan_2d_triton_bwd(*args, True, codes, no_v, no_h, dy)


def test_torch_compile_fullgraph_traces_the_op():
    import torch._dynamo

    inputs = make_cross_inputs(1, 2, 1, 3, 4, 4, seed=17)
    inputs = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}

    def layer(u, delta, A, B, C, D, delta_bias):
        y = cross_selective_scan_2d(u, delta, A, B, C, D, delta_bias, True, routes="cross", backend="triton")
        return torch.tanh(y) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    eager_leaves = [inputs[k].clone().requires_grad_() for k in TENSORS]
    compiled_leaves = [inputs[k].clone().requires_grad_() for k in TENSORS]
    expected, got = layer(*eager_leaves), compiled(*compiled_leaves)
    torch.testing.assert_close(got, expected)
    expected.sum().backward()
    got.sum().backward()
    for key, a, b in zip(TENSORS, eager_leaves, compiled_leaves):
        torch.testing.assert_close(b.grad, a.grad, msg=key)
    torch._dynamo.reset()


def test_custom_op_fake_implementations_pass_opcheck():
    inputs = make_cross_inputs(1, 2, 2, 3, 2, 4, seed=19)
    args = [inputs[k].float() for k in TENSORS]
    codes = [r.code for r in route_set("cross")]
    torch.library.opcheck(triton_cross.cross_selective_scan_2d_triton_fwd, (*args, True, codes, False, True),
                          test_utils=("test_schema", "test_faketensor"))
    _, vcarry, hcarry = triton_cross.cross_selective_scan_2d_triton_fwd(*args, True, codes, False, True)
    dy = torch.randn(1, 2, 3, 2)
    torch.library.opcheck(triton_cross.cross_selective_scan_2d_triton_bwd,
                          (*args, True, codes, vcarry, hcarry, dy), test_utils=("test_schema", "test_faketensor"))
