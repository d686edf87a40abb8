"""The CUDA extension's four-route op (cross_forward / cross_backward) through the host emulation.

The route kernels (Variant::kRoute) run on the CPU with the race detector and shuffled thread /
warp / lane / block orders (``_emulate_cross_forward`` / ``_emulate_cross_backward``), against
the per-route formulation of :func:`vmamba2d.ops.cross_scan.cross_scan_per_route` on the
``torch`` backend in fp64 with autograd (route-order copies: independent of the kernels' in-place
addressing): every route code (the "cross" and "corners" sets, 2D and flat, and the codes with a
single flip), packed small maps, maps of several tiles in the sequential and the tile-parallel
plan, N = 1 and N > 1, fp32 / bf16 / fp16, the vector path (incl. the reversed route's) and the
scalar path (misaligned base pointers, widths that are not a multiple of 4).
"""
from __future__ import annotations

import pytest
import torch

from test_scan_cuda import CUDA_MODULE, assert_close, needs_gpu, needs_module
from vmamba2d.ops import backend_info
from vmamba2d.ops.cross_scan import cross_scan_mode, cross_scan_per_route, cross_selective_scan_2d
from vmamba2d.ops.routes import Route

pytestmark = needs_module

NAMES = ("u", "delta", "A", "B", "C", "D", "delta_bias")
CROSS_2D, CORNERS_2D = [0, 4, 3, 7], [0, 5, 3, 6]
CROSS_1D, CORNERS_1D = [8, 12, 11, 15], [8, 13, 11, 14]
SINGLE_FLIPS = [1, 2, 9, 10]  # from_right or from_bottom alone, 2D and flat
H100 = dict(sm_count=132, smem_per_block=227 * 1024, smem_per_sm=228 * 1024)
# One T4-sized SM: too few block slots for the tile-parallel passes to pay off.
SEQUENTIAL = dict(sm_count=1, smem_per_block=64 * 1024, smem_per_sm=64 * 1024)


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
    y = CUDA_MODULE._emulate_cross_forward(*args, True, routes, out_fp32, order=order, **device)
    grads = CUDA_MODULE._emulate_cross_backward(*args, True, routes, dy, order=order + 1, **device)
    return y, grads


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


@pytest.mark.parametrize("routes", [CROSS_2D, CORNERS_2D, CROSS_1D, CORNERS_1D, SINGLE_FLIPS],
                         ids=["cross", "corners", "cross-1d", "corners-1d", "single-flips"])
def test_every_route_on_packed_odd_maps(routes):
    # 5 x 7 maps, several per tile (packed: 4 x 6 maps of a tile, batch 3); N = 2: warps share states.
    check(make_inputs(3, 2, routes, 2, 5, 7, seed=len(routes) + routes[1]), routes, rtol=5e-5, **H100)


@pytest.mark.parametrize("plan", ["sequential", "tile-parallel"])
def test_map_of_several_tiles(plan):
    # 37 x 41: 2 x 2 tiles (3 x 2 on the columns-first routes), partial edges; N = 1 with two channels.
    device = SEQUENTIAL if plan == "sequential" else H100
    for code in CROSS_2D:
        launch = CUDA_MODULE._launch_plan(2, 2, 1, 1, 37, 41, **device, route=code)
        assert launch["fwd_tile_parallel"] == (plan == "tile-parallel")
        # N = 1, sequential: the one-state route forward and backward; tile-parallel: the route variant.
        assert launch["fwd_variant"] == ("kOneStateRoute" if plan == "sequential" else "kRoute")
        assert launch["bwd_variant"] == ("kOneStateRoute" if plan == "sequential" else "kRoute")
    check(make_inputs(2, 2, CROSS_2D, 1, 37, 41, dtype=torch.bfloat16, seed=3), CROSS_2D, rtol=3e-2,
          out_fp32=True, **device)
    # fp32 at N = 1 (its sequential forward runs kRoute: forward_variant_for).
    check(make_inputs(1, 2, CROSS_1D, 1, 37, 41, seed=12), CROSS_1D, rtol=5e-5, **device)
    # fp16: its backward parks dt in the scratch map the recording forwards write their y into.
    check(make_inputs(1, 2, CORNERS_2D, 1, 37, 41, dtype=torch.float16, seed=15), CORNERS_2D, rtol=3e-2,
          **device)


def test_channel_slices_and_mixed_plans():
    # dim 8 in blocks of 4 channels: two backward slices (dB / dC partials summed in slice order);
    # a 6 x 40 map: the 2D routes walk their two tiles in order (one-state route forward), the flat
    # ones (1 x 240) run tile-parallel.
    routes = [0, 4, 8, 12]
    for code, tile_parallel in zip(routes, (False, False, True, True)):
        launch = CUDA_MODULE._launch_plan(2, 8, 1, 1, 6, 40, **H100, route=code)
        assert launch["bwd_slices"] == 2 and launch["fwd_tile_parallel"] == tile_parallel
    check(make_inputs(2, 8, routes, 1, 6, 40, dtype=torch.bfloat16, seed=13), routes, rtol=3e-2, **H100)


def test_several_state_rounds_on_a_small_device():
    # N = 16 on a T4-sized device: two warps per channel, eight state rounds (dt / u / y tiles kept
    # between rounds); rows of 13 (no vector path).
    t4 = dict(sm_count=40, smem_per_block=64 * 1024, smem_per_sm=64 * 1024)
    check(make_inputs(1, 2, CORNERS_2D, 16, 9, 13, seed=11), CORNERS_2D, rtol=5e-5, **t4)


def test_half_types_flat_routes():
    check(make_inputs(2, 2, CORNERS_1D, 3, 9, 13, dtype=torch.float16, seed=4), CORNERS_1D, rtol=3e-2,
          dy_fp32=True, **H100)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_vector_path_on_aligned_maps_incl_reversed_routes(dtype):
    # 8 x 12 (rows of whole quads): the identity and the reversed routes take vector accesses,
    # the columns-first ones the per-cell path.
    # 2-byte types, N = 1, one tile: the one-state route forward (fp32 runs kRoute for that plan).
    inputs = make_inputs(2, 4, CROSS_2D, 1, 8, 12, dtype=dtype, seed=5)
    for code in CROSS_2D:
        assert CUDA_MODULE._launch_plan(2, 4, 1, 1, 8, 12, **H100, route=code)["fwd_variant"] == "kOneStateRoute"
    check(inputs, CROSS_2D, rtol=3e-2, **H100)
    one = {n: (t[:, 2:3] if n in ("delta", "B", "C") else t) for n, t in inputs.items()}
    one = {n: t.contiguous() for n, t in one.items()}
    one["A"], one["D"], one["delta_bias"] = (inputs[n][8:12].contiguous() for n in ("A", "D", "delta_bias"))
    dy = torch.randn(one["u"].shape, generator=torch.Generator().manual_seed(9)).to(dtype)
    args = [one[n] for n in NAMES]
    for code, vector in ((3, True), (11, True), (4, False)):
        CUDA_MODULE._emulate_cross_forward(*args, True, [code], False, **H100)
        forward = CUDA_MODULE._emulation_vector_accesses()
        CUDA_MODULE._emulate_cross_backward(*args, True, [code], dy, **H100)
        backward = CUDA_MODULE._emulation_vector_accesses()
        assert (forward > 0 and backward > 0) == vector, (code, forward, backward)
    y, grads = run(one, [3], dy, **H100)
    y_ref, grads_ref = reference(one, [3], dy)
    assert_close("y (reversed route alone)", y, y_ref, 3e-2)
    for name, got, ref in zip(NAMES, grads, grads_ref):
        assert_close("d" + name, got, ref, 3e-2)


ALL_CODES = list(range(16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_state_route_backward_every_route_code(dtype):
    # N = 1 on 4 channels (one block of four one-warp channels): the backward runs the one-state
    # route variant, which parks dt in the route's ddelta cells (fp32) or in the scratch map (2-byte
    # types). All 16 route codes as one op on packed odd 5 x 7 maps (per-cell path; the flat routes'
    # 1 x 35 maps take two tiles each).
    for code in ALL_CODES:
        launch = CUDA_MODULE._launch_plan(3, 4, 1, 1, 5, 7, **H100, route=code)
        assert (launch["bwd_variant"], launch["bwd_channels"], launch["bwd_tile_parallel"]) == (
            "kOneStateRoute", 4, False), code
    rtol = 5e-5 if dtype == torch.float32 else 3e-2
    check(make_inputs(3, 4, ALL_CODES, 1, 5, 7, dtype=dtype, seed=21), ALL_CODES, rtol=rtol, **H100)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_state_route_backward_vector_path_and_thread_orders(dtype):
    # 8 x 12 maps: the identity and reversed routes park and read back dt with vector accesses (a
    # reversed route's at the mirrored address); gradients bitwise equal over thread orders.
    routes = CROSS_2D + CROSS_1D
    inputs = make_inputs(2, 4, routes, 1, 8, 12, dtype=dtype, seed=22)
    for code in routes:
        assert CUDA_MODULE._launch_plan(2, 4, 1, 1, 8, 12, **H100, route=code)["bwd_variant"] == "kOneStateRoute"
    rtol = 5e-5 if dtype == torch.float32 else 3e-2
    check(inputs, routes, rtol=rtol, **H100)
    # The reversed route (code 3, route 2 of the op) alone: its backward takes the vector path.
    reversed_only = {n: t[:, 2:3].contiguous() if n in ("delta", "B", "C") else t for n, t in inputs.items()}
    for n in ("A", "D", "delta_bias"):
        reversed_only[n] = inputs[n][8:12].contiguous()
    check(reversed_only, [3], rtol=rtol, **H100)
    assert CUDA_MODULE._emulation_vector_accesses() > 0
    args = [inputs[n] for n in NAMES]
    dy = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    first = CUDA_MODULE._emulate_cross_backward(*args, True, routes, dy, order=1, **H100)
    second = CUDA_MODULE._emulate_cross_backward(*args, True, routes, dy, order=23, **H100)
    for name, a, b in zip(NAMES, first, second):
        assert torch.equal(a, b), name


def test_empty_batch_gives_empty_outputs_and_zero_parameter_gradients():
    inputs = make_inputs(0, 3, CROSS_2D, 2, 5, 7)
    y, grads = run(inputs, CROSS_2D, torch.zeros(0, 3, 5, 7), **H100)
    assert y.shape == (0, 3, 5, 7)
    for name, got in zip(NAMES, grads):
        assert got.shape == inputs[name].shape, name
        assert not got.any(), name


def test_misaligned_inputs_take_the_scalar_path():
    # Every input one element past an aligned address: no vector access, same results.
    inputs = make_inputs(2, 2, CORNERS_2D, 2, 8, 12, dtype=torch.bfloat16, seed=6)
    shifted = {}
    for name, t in inputs.items():
        flat = torch.empty(t.numel() + 1, dtype=t.dtype)
        flat[1:] = t.flatten()
        shifted[name] = flat[1:].view(t.shape)
    check(shifted, CORNERS_2D, rtol=3e-2, **H100)
    assert CUDA_MODULE._emulation_vector_accesses() == 0


def test_channels_last_map():
    inputs = make_inputs(2, 3, CROSS_2D, 1, 6, 10, seed=7)
    inputs["u"] = inputs["u"].contiguous(memory_format=torch.channels_last)
    y, grads = check(inputs, CROSS_2D, rtol=5e-5, **H100)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert grads[0].is_contiguous(memory_format=torch.channels_last)


def test_gradients_bitwise_equal_across_thread_orders():
    inputs = make_inputs(2, 4, CORNERS_2D, 2, 11, 9, seed=8)
    dy = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(2))
    first = run(inputs, CORNERS_2D, dy, order=1, **H100)
    second = run(inputs, CORNERS_2D, dy, order=17, **H100)
    assert torch.equal(first[0], second[0])
    for a, b in zip(first[1], second[1]):
        assert torch.equal(a, b)


def test_without_skip_and_bias_and_softplus():
    # D and delta_bias None (no dD / ddelta_bias), delta used as the step size directly.
    routes = CORNERS_2D
    inputs = make_inputs(2, 2, routes, 2, 7, 6, seed=14)
    inputs["delta"] = inputs["delta"].abs() * 0.2 + 0.02
    args = [None if n in ("D", "delta_bias") else inputs[n] for n in NAMES]
    dy = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(5))
    y = CUDA_MODULE._emulate_cross_forward(*args, False, routes, False, order=3, **H100)
    grads = CUDA_MODULE._emulate_cross_backward(*args, False, routes, dy, order=4, **H100)
    leaves = [None if t is None else t.double().requires_grad_() for t in args]
    y_ref = cross_scan_per_route(*leaves, False, tuple(Route.from_code(c) for c in routes), "torch", torch.float64)
    y_ref.backward(dy.double())
    assert_close("y", y, y_ref.detach(), 5e-5)
    for name, got, leaf in zip(NAMES, grads, leaves):
        if leaf is None:
            assert got is None, name
        else:
            assert_close("d" + name, got, leaf.grad, 5e-5)


def test_bad_routes_are_rejected():
    inputs = make_inputs(1, 1, [0, 4], 1, 4, 4)
    args = [inputs[n] for n in NAMES]
    with pytest.raises(ValueError, match="route codes"):
        CUDA_MODULE._emulate_cross_forward(*args, True, [0, 16], False)
    with pytest.raises(ValueError, match="delta"):
        CUDA_MODULE._emulate_cross_forward(*args, True, [0, 4, 3], False)


@needs_gpu
@pytest.mark.cuda
def test_public_op_runs_the_native_cuda_route_kernel():
    """On a GPU: cross_selective_scan_2d(backend="cuda") takes the route kernel (backend_info says
    so) and matches the per-route reference, gradients included."""
    assert cross_scan_mode("cuda") == "native"
    if backend_info()["auto_cuda"] == "cuda":
        assert backend_info()["cross_scan"]["cuda"] == "native"
    routes = CORNERS_2D + CROSS_1D
    inputs = make_inputs(2, 3, routes, 2, 19, 23, seed=10)
    leaves = {n: t.cuda().requires_grad_() for n, t in inputs.items()}
    y = cross_selective_scan_2d(*(leaves[n] for n in NAMES), routes=[Route.from_code(c) for c in routes],
                                backend="cuda")
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    y.backward(dy.cuda())
    y_ref, grads_ref = reference(inputs, routes, dy)
    assert_close("y", y, y_ref, 5e-5)
    for name, ref in zip(NAMES, grads_ref):
        assert_close("d" + name, leaves[name].grad, ref, 5e-5)
