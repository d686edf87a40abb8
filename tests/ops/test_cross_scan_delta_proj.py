"""The four-route op with the step-size projection folded in (``delta_proj_weight``).

Reference: the projection written as an explicit einsum, then the per-route formulation on the
``reference`` backend (route-order copies scanned one by one in readable PyTorch).
"""
from __future__ import annotations

import pytest
import torch

from vmamba2d.ops import cross_selective_scan_2d, route_set
from vmamba2d.ops.interface import cross_scan_per_route
from vmamba2d.ops.routes import resolve_routes

NAMES = ("u", "delta", "A", "B", "C", "D", "delta_bias", "delta_proj_weight")


def _inputs(batch=2, dim=5, rank=3, height=5, width=7, nstate=2, routes=4, dtype=torch.float64, seed=0):
    """Keyword arguments of the op with a low-rank delta (batch, K, R, H, W) and its weight (K, dim, R)."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    return dict(
        u=rand(batch, dim, height, width),
        delta=rand(batch, routes, rank, height, width),
        A=-torch.rand(routes * dim, nstate, generator=gen, dtype=dtype) - 0.3,
        B=rand(batch, routes, nstate, height, width),
        C=rand(batch, routes, nstate, height, width),
        D=rand(routes * dim),
        delta_bias=rand(routes * dim) * 0.3,
        delta_proj_weight=rand(routes, dim, rank) * rank**-0.5,
    )


def _explicit(inputs, softplus, routes):
    """The independent reference: einsum projection, then the per-route reference scan."""
    full = torch.einsum("kdr,bkrhw->bkdhw", inputs["delta_proj_weight"], inputs["delta"])
    args = [inputs[k] for k in ("u",)] + [full] + [inputs[k] for k in ("A", "B", "C", "D", "delta_bias")]
    return cross_scan_per_route(*args, softplus, resolve_routes(routes), "reference", inputs["u"].dtype)


def _value_and_grads(fn, inputs, grad_out):
    leaves = {k: v.detach().clone().requires_grad_(v is not None) if v is not None else None for k, v in inputs.items()}
    y = fn(leaves)
    wrt = [v for v in leaves.values() if v is not None]
    return y, torch.autograd.grad(y, wrt, grad_out)


def _check_folded(backend, inputs, routes, softplus=True, tol=1e-10):
    grad_out = torch.randn(inputs["u"].shape, dtype=inputs["u"].dtype, generator=torch.Generator().manual_seed(5))
    expected, expected_grads = _value_and_grads(lambda x: _explicit(x, softplus, routes), inputs, grad_out)
    got, got_grads = _value_and_grads(
        lambda x: cross_selective_scan_2d(**x, delta_softplus=softplus, routes=routes, backend=backend), inputs, grad_out
    )
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    names = [k for k, v in inputs.items() if v is not None]
    for name, g, e in zip(names, got_grads, expected_grads):
        assert g.shape == inputs[name].shape and g.dtype == inputs[name].dtype, name
        torch.testing.assert_close(g, e, rtol=tol * 10, atol=tol * 10, msg=f"d{name}")
    return got


@pytest.mark.parametrize("backend", ["cpu", "torch", "reference"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("routes", ["cross", route_set("cross", "1d")], ids=["2d", "flat"])
def test_folded_projection_matches_the_explicit_projection(backend, dtype, routes):
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    _check_folded(backend, _inputs(dtype=dtype), routes, tol=tol)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_folded_projection_without_optional_inputs_and_softplus(backend):
    inputs = _inputs(rank=1, height=3, width=4, dim=2, seed=1)
    inputs.update(D=None, delta_bias=None)
    _check_folded(backend, inputs, "corners", softplus=False)


def test_channels_last_map_with_folded_projection_on_cpu():
    # 9 x 11 = 99 cells: the kernel projects whole blocks of 64 cells, then the rest one by one
    inputs = _inputs(height=9, width=11, rank=4, seed=2)
    inputs["u"] = inputs["u"].contiguous(memory_format=torch.channels_last)
    y = _check_folded("cpu", inputs, "cross")
    assert y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "shape",
    [
        # 2 whole groups of 8 + one overlapping the one before; channels-last u
        dict(batch=3, dim=19, height=5, width=7, channels_last=True),
        dict(batch=2, dim=11, height=3, width=3, channels_last=False),  # maps smaller than one vector
        dict(batch=1, dim=8, height=6, width=8, channels_last=False),  # one group, whole vectors
    ],
    ids=["groups-and-overlap", "tiny-map", "one-group"],
)
def test_channel_groups_of_the_cpu_projection(isa, dtype, shape, monkeypatch):
    """The CPU kernel projects 8 channels at a time in blocks of one vector of cells (the last group
    and block overlapping the ones before); the backward's channel chunks cut the groups (batch 3:
    6 chunks of 3-4 channels). Every instruction-set build the CPU has."""
    monkeypatch.setenv("VMAMBA2D_CPU_ISA", isa)
    shape = dict(shape)
    channels_last = shape.pop("channels_last")
    inputs = _inputs(rank=5, dtype=dtype, seed=6, **shape)
    if channels_last:
        inputs["u"] = inputs["u"].contiguous(memory_format=torch.channels_last)
    _check_folded("cpu", inputs, "cross", tol=1e-10 if dtype == torch.float64 else 2e-4)


def test_custom_op_projecting_first_equals_the_fold(monkeypatch):
    """The custom op's path for kernels that do not project delta themselves (the CUDA kernel:
    project, then the full-rank route kernel, gradients through project_delta_grads), run here on
    the CPU kernel, against the reference."""
    from vmamba2d.ops.compiled import cross_ops

    monkeypatch.setattr(cross_ops, "_kernel_projects", lambda u: False)
    _check_folded("cpu", _inputs(seed=3), "cross")


def test_one_batched_matmul_of_the_model_equals_the_fold():
    """Property: dts = bmm(W, low) per route, fed as the full-rank delta, gives the folded op's y."""
    inputs = _inputs(dtype=torch.float32, seed=4)
    batch, routes, rank, height, width = inputs["delta"].shape
    weight = inputs["delta_proj_weight"]
    full = torch.bmm(weight.repeat(batch, 1, 1), inputs["delta"].reshape(batch * routes, rank, height * width))
    unfolded = dict(inputs, delta=full.view(batch, routes, -1, height, width), delta_proj_weight=None)
    expected = cross_selective_scan_2d(**unfolded, backend="cpu")
    torch.testing.assert_close(cross_selective_scan_2d(**inputs, backend="cpu"), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(delta_proj_weight=torch.zeros(4, 5)), ValueError, r"delta_proj_weight must have shape \(K, dim, R\)"),
        (dict(delta_proj_weight=torch.zeros(3, 5, 3, dtype=torch.float64)), ValueError, "delta_proj_weight.*K=4"),
        (dict(delta_proj_weight=torch.zeros(4, 6, 3, dtype=torch.float64)), ValueError, "delta_proj_weight.*dim=5"),
        (dict(delta_proj_weight=torch.zeros(4, 5, 3, dtype=torch.int64)), TypeError, "delta_proj_weight must be a floating"),
        (dict(delta_proj_weight=torch.zeros(4, 5, 2, dtype=torch.float64)), ValueError, r"delta must have shape \(batch, K, R, H, W\)"),
        (dict(delta_proj_weight=torch.zeros(4, 5, 3, device="meta")), ValueError, "delta_proj_weight is on meta"),
    ],
)
def test_bad_projection_arguments_name_the_argument(change, error, match):
    inputs = dict(_inputs(), **change)
    with pytest.raises(error, match=match):
        cross_selective_scan_2d(**inputs, backend="cpu")


def test_full_rank_delta_with_a_projection_is_refused():
    inputs = _inputs()
    inputs["delta"] = torch.zeros(2, 4, 5, 5, 7, dtype=torch.float64)  # (batch, K, dim, H, W): not low-rank
    inputs["delta_proj_weight"] = torch.zeros(4, 5, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"delta must have shape \(batch, K, R, H, W\) with delta_proj_weight"):
        cross_selective_scan_2d(**inputs, backend="torch")


def test_custom_ops_fake_implementations_with_projection():
    """The fakes give the kernel's shapes (torch.compile / torch.export trace through them): y like
    u, and the backward's ddelta low-rank like delta, with the weight's gradient last."""
    inputs = _inputs()
    args = tuple(inputs[k] for k in NAMES[:7])
    codes = [r.code for r in resolve_routes("cross")]
    fwd = torch.ops.vmamba2d.cross_selective_scan_2d_fwd.default
    torch.library.opcheck(fwd, args + (True, codes, False, inputs["delta_proj_weight"]),
                          test_utils=("test_schema", "test_faketensor"))
    meta = tuple(t.to("meta") for t in args)
    weight = inputs["delta_proj_weight"].to("meta")
    y = torch.ops.vmamba2d.cross_selective_scan_2d_fwd(*meta, True, codes, False, weight)
    assert y.shape == (2, 5, 5, 7) and y.device.type == "meta"
    grads = torch.ops.vmamba2d.cross_selective_scan_2d_bwd(*meta, True, codes, meta[0], weight)
    assert grads[1].shape == (2, 4, 3, 5, 7) and grads[7].shape == (4, 5, 3)
    real = torch.ops.vmamba2d.cross_selective_scan_2d_bwd(*args, True, codes, torch.ones_like(args[0]),
                                                           inputs["delta_proj_weight"])
    assert [tuple(g.shape) for g in real] == [tuple(g.shape) for g in grads]


def test_fvcore_counts_the_folded_projection():
    from vmamba2d.ops.flops import FVCORE_OP_HANDLES, scan_2d_flops

    fvcore = pytest.importorskip("fvcore.nn")

    class Mixer(torch.nn.Module):
        def forward(self, u, delta, A, B, C, D, weight):
            return cross_selective_scan_2d(u, delta, A, B, C, D, backend="cpu", delta_proj_weight=weight)

    inputs = {k: v.float() for k, v in _inputs().items()}
    args = tuple(inputs[k] for k in ("u", "delta", "A", "B", "C", "D", "delta_proj_weight"))
    analysis = fvcore.FlopCountAnalysis(Mixer(), args).set_op_handle(**FVCORE_OP_HANDLES)
    analysis.unsupported_ops_warnings(False)
    batch, dim, rank, length, routes = 2, 5, 3, 35, 4
    assert analysis.total() == routes * scan_2d_flops(batch, dim, length, 2, with_d=True) + batch * routes * dim * rank * length
