"""The v3 four-route (cross) kernels' test inputs, fp64 per-route reference and emulated runs the route tests share."""
from __future__ import annotations
import torch
from support.v3_cases import EMULATION, assert_close
from vmamba2d.ops.interface import cross_scan_per_route
from vmamba2d.ops.routes import Route


NAMES = ("u", "delta", "A", "B", "C", "D", "delta_bias")


CROSS_2D, CORNERS_2D = [0, 4, 3, 7], [0, 5, 3, 6]


def make_inputs(batch, dim, routes, nstate, height, width, dtype=torch.float32, seed=0):
    """Random inputs of the four-route op (A negative, delta around the softplus knee)."""
    g = torch.Generator().manual_seed(seed)
    k = len(routes)
    rand = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    inputs = {
        "u": rand(batch, dim, height, width),
        "delta": rand(batch, k, dim, height, width) * 0.5 - 1.0,
        "A": -(torch.rand(k * dim, nstate, generator=g) * 1.5 + 0.05),
        "B": rand(batch, k, nstate, height, width),
        "C": rand(batch, k, nstate, height, width),
        "D": rand(k * dim),
        "delta_bias": rand(k * dim) * 0.3,
    }
    return {n: t if n in ("A", "D", "delta_bias") else t.to(dtype) for n, t in inputs.items()}


def reference(inputs, routes, dy):
    """fp64 y and gradients of the per-route formulation (torch backend, autograd)."""
    leaves = {n: t.double().requires_grad_() for n, t in inputs.items()}
    y = cross_scan_per_route(*(leaves[n] for n in NAMES), True, tuple(Route.from_code(c) for c in routes),
                             "torch", torch.float64)
    y.backward(dy.double())
    return y.detach(), [leaves[n].grad for n in NAMES]


def run(inputs, routes, dy, *, order=2, out_fp32=False, **device):
    args = [inputs[n] for n in NAMES]
    y = EMULATION._emulate_cross_forward(*args, True, routes, out_fp32, order=order, **device)
    grads = EMULATION._emulate_cross_backward(*args, True, routes, dy, order=order + 1, **device)
    return y, grads


def forward_variants(inputs, routes, **device):
    """The kernel variants the forward blocks of cross_forward ran (enum order)."""
    EMULATION._emulate_cross_forward(*(inputs[n] for n in NAMES), True, routes, False, **device)
    return EMULATION._emulation_forward_variants()


def check(inputs, routes, *, rtol, seed=1, dy_fp32=False, out_fp32=False, **device):
    """The op's y and every gradient against the fp64 per-route reference; returns them."""
    u = inputs["u"]
    gen = torch.Generator().manual_seed(seed)
    dy = torch.randn(u.shape, generator=gen).to(torch.float32 if dy_fp32 else u.dtype)
    dy = dy.contiguous(memory_format=torch.channels_last) if not u.is_contiguous() else dy
    y, grads = run(inputs, routes, dy, order=2 + seed, out_fp32=out_fp32, **device)
    y_ref, grads_ref = reference(inputs, routes, dy)
    assert y.dtype == (torch.float32 if out_fp32 else u.dtype)
    assert_close("y", y, y_ref, rtol)
    for name, got, ref in zip(NAMES, grads, grads_ref):
        expected = torch.float32 if name in ("A", "D", "delta_bias") else u.dtype
        assert got.dtype == expected, f"d{name}: dtype {got.dtype}, expected {expected}"
        assert got.shape == inputs[name].shape
        assert_close("d" + name, got, ref, rtol)
    return y, grads
