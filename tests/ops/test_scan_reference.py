"""The public ops against their readable references, called with the same arguments
(``vmamba2d.ops.reference``: loops over rows and columns, an einsum projection, route-order copies)."""
from __future__ import annotations

import inspect

import pytest
import torch

from vmamba2d.ops import (
    cross_selective_scan_2d,
    cross_selective_scan_2d_reference,
    route_set,
    selective_scan_2d,
    selective_scan_2d_reference,
)

CPU_BACKENDS = ("cpu", "torch")


def _without_backend(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values() if p.name != "backend"]


@pytest.mark.parametrize("public, reference", [(selective_scan_2d, selective_scan_2d_reference),
                                               (cross_selective_scan_2d, cross_selective_scan_2d_reference)])
def test_reference_takes_the_public_ops_arguments(public, reference):
    assert _without_backend(public) == _without_backend(reference)


def _single(dtype, seed, groups=2, use_optional=True):
    gen = torch.Generator().manual_seed(seed)
    batch, dim, nstate, height, width = 2, 4, 3, 5, 7
    length = height * width

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    return dict(u=randn(batch, dim, length), delta=randn(batch, dim, length),
                A=-(0.2 + torch.rand(dim, nstate, generator=gen, dtype=torch.float64)),
                B=randn(batch, groups, nstate, length), C=randn(batch, groups, nstate, length),
                D=randn(dim) if use_optional else None, delta_bias=randn(dim) if use_optional else None,
                height=height, width=width)


def _cross(dtype, seed, rank=None, routes=4):
    gen = torch.Generator().manual_seed(seed)
    batch, dim, nstate, height, width = 2, 3, 2, 4, 6

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    inputs = dict(u=randn(batch, dim, height, width),
                  delta=randn(batch, routes, rank or dim, height, width),
                  A=-(0.2 + torch.rand(routes * dim, nstate, generator=gen, dtype=torch.float64)),
                  B=randn(batch, routes, nstate, height, width), C=randn(batch, routes, nstate, height, width),
                  D=randn(routes * dim), delta_bias=randn(routes * dim))
    if rank:
        inputs["delta_proj_weight"] = randn(routes, dim, rank) * rank**-0.5
    return inputs


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("softplus", [True, False])
def test_single_route_op_equals_its_reference(backend, softplus):
    inputs = _single(torch.float64, seed=1)
    if not softplus:
        inputs["delta"], inputs["delta_bias"] = inputs["delta"].abs(), inputs["delta_bias"].abs()
    got = selective_scan_2d(**inputs, delta_softplus=softplus, backend=backend)
    torch.testing.assert_close(got, selective_scan_2d_reference(**inputs, delta_softplus=softplus),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("rank", [None, 2], ids=["full-rank", "low-rank"])
@pytest.mark.parametrize("routes", ["cross", "corners", route_set("cross", "1d")], ids=["cross", "corners", "flat"])
def test_four_route_op_equals_its_reference(backend, rank, routes):
    inputs = _cross(torch.float64, seed=2, rank=rank)
    got = cross_selective_scan_2d(**inputs, routes=routes, backend=backend)
    torch.testing.assert_close(got, cross_selective_scan_2d_reference(**inputs, routes=routes), rtol=1e-12, atol=1e-12)


def test_references_cast_like_the_ops():
    """fp32 inputs with out_dtype=float64: computed in fp32 at least, returned in float64."""
    single = _single(torch.float32, seed=3, groups=1, use_optional=False)
    y = selective_scan_2d_reference(**single, out_dtype=torch.float64)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, selective_scan_2d(**single, backend="cpu", out_dtype=torch.float64),
                               rtol=1e-5, atol=1e-5)
    cross = _cross(torch.float32, seed=4, rank=2)
    y = cross_selective_scan_2d_reference(**cross)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, cross_selective_scan_2d(**cross, backend="cpu"), rtol=1e-4, atol=1e-4)


def test_references_validate_like_the_ops():
    inputs = _single(torch.float64, seed=5)
    inputs["delta"] = inputs["delta"][:, :, :-1]
    with pytest.raises(ValueError, match="delta must have shape"):
        selective_scan_2d_reference(**inputs)
    with pytest.raises(TypeError, match="out_dtype must be None or a floating torch.dtype"):
        cross_selective_scan_2d_reference(**_cross(torch.float64, seed=6), out_dtype=torch.int64)
