"""The v3 kernels' host emulation built by the C++ compiler alone (tests/support/cuda_emulation_build.py:
v3_emulation), the test-only extension that lets the emulation tests run without the nvcc-built
vmamba2d._C_cuda: its forward / backward against the pure-PyTorch reference, and, where _C_cuda is
built, bitwise against the same bindings there and with the same launch plans."""
from __future__ import annotations

import importlib

import pytest
import torch
from support.cuda_emulation_build import v3_emulation
from support.v3_cases import make_inputs

from vmamba2d.ops import selective_scan_2d

pytestmark = pytest.mark.slow  # the first build compiles every kernel variant for the host (minutes)

ORDER = ("u", "delta", "A", "B", "C", "D", "delta_bias")
# (batch, dim, groups, N, height, width): packed small maps, partial tiles, several tiles, N > 1.
SHAPES = [(5, 4, 2, 1, 7, 7), (2, 2, 1, 4, 13, 29), (1, 4, 1, 1, 40, 70), (3, 6, 3, 2, 33, 20)]


def _nvcc_module():
    try:
        return importlib.import_module("vmamba2d._C_cuda")
    except ImportError:
        return None


@pytest.fixture(scope="module")
def emulation():
    return v3_emulation()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_backward_match_the_reference(emulation, shape):
    batch, dim, groups, nstate, height, width = shape
    x = make_inputs(*shape)
    y, carry_h, carry_v = emulation._emulate_forward(*(x[k] for k in ORDER), True, height, width, True, True)
    leaves = {k: (v.double().requires_grad_(True) if v is not None else None) for k, v in x.items()}
    ref = selective_scan_2d(*(leaves[k] for k in ORDER), True, height=height, width=width, backend="torch")
    torch.testing.assert_close(y.double(), ref.detach(), rtol=1e-4, atol=1e-4)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    grads = emulation._emulate_backward(*(x[k] for k in ORDER), True, height, width, dy, carry_h, carry_v)
    ref.backward(dy.double())
    for got, name in zip(grads, ORDER):
        torch.testing.assert_close(got.double(), leaves[name].grad, rtol=1e-3, atol=1e-3, msg=name)


def test_same_results_and_plans_as_the_nvcc_extensions_bindings(emulation):
    nvcc = _nvcc_module()
    if nvcc is None:
        pytest.skip("vmamba2d._C_cuda is not built here")
    for shape in SHAPES:
        height, width = shape[-2:]
        x = make_inputs(*shape)
        for order in (0, 2):
            got = emulation._emulate_forward(*(x[k] for k in ORDER), True, height, width, False, True, order=order)
            want = nvcc._emulate_forward(*(x[k] for k in ORDER), True, height, width, False, True, order=order)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (shape, order)
        for arch in (75, 86, 90):
            args = (*shape, 132, 228 * 1024, 227 * 1024, -1, arch)
            assert emulation._launch_plan(*args) == nvcc._launch_plan(*args)
