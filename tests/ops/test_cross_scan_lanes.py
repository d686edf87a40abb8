"""The CPU four-route forward and backward with one channel per vector lane
(csrc/cpu/scan_2d_lanes_kernel.h).

They run for float32 channels-last maps with ``delta_proj_weight`` (the models' call) on the AVX-512
build. References: the projection as an explicit einsum, then the per-route ``reference`` backend
in float64 (its gradients by autograd); and the per-channel kernel (the AVX2 build, which has no
lane kernel, or ``VMAMBA2D_CPU_LANES=0``) on the same float32 inputs.
"""
from __future__ import annotations

import pytest
import torch

from vmamba2d.ops import backend_info, cross_selective_scan_2d, route_set
from vmamba2d.ops.compiled import extensions
from vmamba2d.ops.interface import cross_scan_per_route
from vmamba2d.ops.routes import resolve_routes


LANE_CHANNELS = 16  # channels per kernel call (kLaneChannels)

# The lane kernel runs where its 16-channel tasks give every thread one: on one thread, always.
pytestmark = [
    pytest.mark.skipif(not backend_info()["cpu_channel_lanes"],
                       reason="the CPU kernel has no channel-lane build here (needs AVX-512)"),
    pytest.mark.usefixtures("one_thread"),
]


def _inputs(batch, dim, height, width, rank=3, nstate=1, routes=4, seed=0, optional=True):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(
        u=rand(batch, dim, height, width).contiguous(memory_format=torch.channels_last),
        delta=rand(batch, routes, rank, height, width),
        A=-torch.rand(routes * dim, nstate, generator=gen) - 0.3,
        B=rand(batch, routes, nstate, height, width),
        C=rand(batch, routes, nstate, height, width),
        D=rand(routes * dim) if optional else None,
        delta_bias=rand(routes * dim) * 0.3 if optional else None,
        delta_proj_weight=rand(routes, dim, rank) * rank**-0.5,
    )


def _reference(inputs, softplus, routes):
    """float64: einsum projection, then the route-order copies scanned one by one in PyTorch."""
    x = {k: v.double() if v is not None else None for k, v in inputs.items()}
    full = torch.einsum("kdr,bkrhw->bkdhw", x["delta_proj_weight"], x["delta"])
    args = [x["u"].contiguous(), full] + [x[k] for k in ("A", "B", "C", "D", "delta_bias")]
    return cross_scan_per_route(*args, softplus, resolve_routes(routes), "reference", torch.float64)


def _lanes(inputs, softplus, routes):
    with torch.no_grad():
        return cross_selective_scan_2d(**inputs, delta_softplus=softplus, routes=routes, backend="cpu")


# Shapes of both kernels' reference tests. The backward's 196-cell map also has whole blocks of 16
# cells and a tail in its projection gradient.
LANE_SHAPES = pytest.mark.parametrize(
    "shape",
    [
        dict(batch=1, dim=16, height=5, width=7),  # one call, one vector per build register
        dict(batch=2, dim=19, height=9, width=11),  # a last call overlapping the one before
        dict(batch=1, dim=40, height=14, width=14),  # two calls + overlap; lines of 8 + 6 cells
        dict(batch=1, dim=16, height=1, width=13),  # one row
        dict(batch=1, dim=17, height=10, width=1),  # one column
        dict(batch=2, dim=24, height=3, width=2, nstate=3),  # several states (run-time N)
    ],
    ids=["one-call", "overlap", "two-calls", "one-row", "one-column", "three-states"],
)
LANE_ROUTES = pytest.mark.parametrize(
    "routes", ["cross", route_set("cross", "1d"), "corners"], ids=["cross-2d", "cross-flat", "corners"]
)


@LANE_SHAPES
@LANE_ROUTES
def test_lane_forward_matches_the_float64_reference(shape, routes):
    inputs = _inputs(seed=1, **shape)
    got = _lanes(inputs, True, routes)
    expected = _reference(inputs, True, routes)
    assert got.dtype == torch.float32 and got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.double(), expected, rtol=2e-5, atol=2e-5)


def test_lane_forward_without_softplus_d_and_bias():
    inputs = _inputs(batch=1, dim=21, height=6, width=9, rank=1, seed=2, optional=False)
    torch.testing.assert_close(_lanes(inputs, False, "cross").double(), _reference(inputs, False, "cross"),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("routes", ["cross", route_set("cross", "1d")], ids=["2d", "flat"])
def test_lane_forward_equals_the_per_channel_kernel(routes, monkeypatch):
    """Same sums in the same order, same exp / softplus: the two kernels differ only by where the
    compiler fuses a multiply and an add (2D routes) and by the per-channel kernel's carries
    between the lines of a flat route (added afterwards): far below 1e-6 relative."""
    inputs = _inputs(batch=2, dim=48, height=12, width=10, rank=6, seed=3)
    lanes = _lanes(inputs, True, routes)
    monkeypatch.setenv("VMAMBA2D_CPU_ISA", "avx2")
    per_channel = _lanes(inputs, True, routes)
    assert extensions.cpu_extension().isa() == "avx2"
    scale = per_channel.abs().max()
    assert (lanes - per_channel).abs().max() <= 1e-6 * scale


def test_the_lane_forward_leaves_other_calls_to_the_per_channel_kernel():
    """Contiguous maps, fewer than 16 channels, float64 and full-rank delta take the per-channel
    kernel; each still matches the reference."""
    cases = [
        (_inputs(batch=1, dim=16, height=4, width=5, seed=4), lambda x: x.update(u=x["u"].contiguous())),
        (_inputs(batch=1, dim=15, height=4, width=5, seed=4), lambda x: None),
        (_inputs(batch=1, dim=16, height=4, width=5, seed=4),
         lambda x: x.update({k: v.double() for k, v in x.items() if v is not None})),
    ]
    for inputs, change in cases:
        reference = _reference(inputs, True, "cross")
        change(inputs)
        torch.testing.assert_close(_lanes(inputs, True, "cross").double(), reference, rtol=2e-5, atol=2e-5)
    inputs = _inputs(batch=1, dim=16, height=4, width=5, seed=4)
    full = torch.einsum("kdr,bkrhw->bkdhw", inputs["delta_proj_weight"], inputs["delta"])
    reference = _reference(inputs, True, "cross")
    inputs.update(delta=full, delta_proj_weight=None)
    torch.testing.assert_close(_lanes(inputs, True, "cross").double(), reference, rtol=2e-5, atol=2e-5)


def _gradients(inputs, softplus, routes, reference=False):
    """Gradients of sum(y * weights) (fixed random weights) for every input that is given: by the
    CPU kernel, or by autograd through the float64 reference."""
    leaves = {k: (v.detach().double() if reference else v.detach().clone()).requires_grad_() if v is not None else None
              for k, v in inputs.items()}
    if reference:
        y = _reference(leaves, softplus, routes)
    else:
        y = cross_selective_scan_2d(**leaves, delta_softplus=softplus, routes=routes, backend="cpu")
    weights = torch.randn(y.shape, generator=torch.Generator().manual_seed(99), dtype=torch.float64).to(y.dtype)
    (y * weights).sum().backward()
    return {name: leaf.grad for name, leaf in leaves.items() if leaf is not None}


def _assert_gradients_match_reference(inputs, softplus, routes):
    got = _gradients(inputs, softplus, routes)
    expected = _gradients(inputs, softplus, routes, reference=True)
    assert set(got) == set(expected)
    for name, grad in got.items():
        assert grad.dtype == torch.float32, name
        scale = expected[name].abs().max().item()
        torch.testing.assert_close(grad.double(), expected[name], rtol=5e-5, atol=5e-5 * scale, msg=name)


@LANE_SHAPES
@LANE_ROUTES
def test_lane_backward_gradients_match_the_float64_reference(shape, routes):
    """Every input's gradient, the projection weight's and the low-rank step sizes' included (the
    kernel forms them from each route's full-rank ddelta)."""
    _assert_gradients_match_reference(_inputs(seed=5, **shape), True, routes)


def test_lane_backward_without_softplus_d_and_bias():
    inputs = _inputs(batch=1, dim=21, height=6, width=9, rank=1, seed=6, optional=False)
    _assert_gradients_match_reference(inputs, False, "cross")


@pytest.mark.parametrize("routes", ["cross", route_set("cross", "1d")], ids=["2d", "flat"])
def test_lane_backward_agrees_with_the_per_channel_kernel(routes, monkeypatch):
    """The same gradients in float32 from the per-channel kernel (its full-rank ddelta projected
    by matmuls), up to the order of float32 sums."""
    inputs = _inputs(batch=2, dim=48, height=12, width=10, rank=6, seed=7)
    lanes = _gradients(inputs, True, routes)
    monkeypatch.setenv("VMAMBA2D_CPU_LANES", "0")
    per_channel = _gradients(inputs, True, routes)
    for name, grad in lanes.items():
        scale = per_channel[name].abs().max()
        assert (grad - per_channel[name]).abs().max() <= 2e-6 * scale, name


def test_lane_backward_does_not_depend_on_the_thread_count():
    """Tasks are (sample, chunk of lane groups) fixed by the shapes, each summing into its own
    partial buffers: bitwise the same gradients on 1 and 2 threads (here 3 groups in 2 chunks)."""
    inputs = _inputs(batch=8, dim=48, height=6, width=5, rank=4, seed=8)
    one = _gradients(inputs, True, "cross")
    torch.set_num_threads(2)
    two = _gradients(inputs, True, "cross")
    for name, grad in one.items():
        assert torch.equal(grad, two[name]), name


def test_kernel_backward_returns_low_rank_and_weight_gradients():
    """The extension's cross_backward with delta_proj_weight: ddelta shaped like the low-rank delta
    and the weight's gradient appended, from the lane kernel and the per-channel one alike."""
    inputs = _inputs(batch=1, dim=20, height=4, width=6, rank=3, seed=9)
    codes = [r.code for r in resolve_routes("cross")]
    dy = torch.randn(inputs["u"].shape).contiguous(memory_format=torch.channels_last)
    weight = inputs.pop("delta_proj_weight")
    for lanes in (True, False):
        if not lanes:
            inputs["u"] = inputs["u"].contiguous()
            dy = dy.contiguous()
        grads = extensions.cpu_extension().cross_backward(**inputs, delta_softplus=True, routes=codes, dy=dy,
                                                           delta_proj_weight=weight)
        assert len(grads) == 8
        assert grads[1].shape == inputs["delta"].shape and grads[7].shape == weight.shape
        assert grads[0].is_contiguous(memory_format=torch.channels_last) == lanes


def test_the_lane_switch_runs_the_per_channel_kernel(monkeypatch):
    """VMAMBA2D_CPU_LANES=0 (A/B measurements): the per-channel kernel on the channels-last map,
    which gives the contiguous map's result bitwise (same kernel; the plane is gathered)."""
    inputs = _inputs(batch=1, dim=20, height=6, width=5, seed=6)
    contiguous = dict(inputs, u=inputs["u"].contiguous())
    monkeypatch.setenv("VMAMBA2D_CPU_LANES", "0")
    assert backend_info()["cpu_channel_lanes"] is False
    assert torch.equal(_lanes(inputs, True, "cross"), _lanes(contiguous, True, "cross"))
    monkeypatch.setenv("VMAMBA2D_CPU_LANES", "1")
    assert backend_info()["cpu_channel_lanes"] is True
    monkeypatch.setenv("VMAMBA2D_CPU_LANES", "yes")
    with pytest.raises(ValueError, match="VMAMBA2D_CPU_LANES must be '0' or '1'"):
        _lanes(inputs, True, "cross")


def test_fewer_lane_tasks_than_threads_take_the_per_channel_kernel(monkeypatch):
    """16 channels per task: one sample of 32 channels is 2 tasks, too few for 4 threads, so the
    per-channel kernel (4 tasks of 8 channels) runs: bitwise its result with the lanes off."""
    inputs = _inputs(batch=1, dim=32, height=5, width=6, seed=7)
    torch.set_num_threads(4)  # the fixture restores the count
    monkeypatch.setenv("VMAMBA2D_CPU_LANES", "0")
    per_channel = _lanes(inputs, True, "cross")
    monkeypatch.setenv("VMAMBA2D_CPU_LANES", "1")
    assert torch.equal(_lanes(inputs, True, "cross"), per_channel)
    torch.set_num_threads(2)
    lanes = _lanes(inputs, True, "cross")
    torch.testing.assert_close(lanes.double(), _reference(inputs, True, "cross"), rtol=2e-5, atol=2e-5)
