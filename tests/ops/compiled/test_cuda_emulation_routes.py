"""The CUDA extension's four-route op (cross_forward / cross_backward) through the host emulation.

The route kernels (Variant::kRoute) run on the CPU with the race detector and shuffled thread /
warp / lane / block orders (``_emulate_cross_forward`` / ``_emulate_cross_backward``), against
the per-route formulation of :func:`vmamba2d.ops.interface.cross_scan_per_route` on the
``torch`` backend in fp64 with autograd (route-order copies: independent of the kernels' in-place
addressing): every route code (the "cross" and "corners" sets, 2D and flat, and the codes with a
single flip), packed small maps, one-row / one-column / single-cell maps, maps of several tiles in
the sequential and the tile-parallel plan, N = 1 and N > 1 (incl. a last state round with fewer
states than warps), fp32 / bf16 / fp16, the vector path (incl. the reversed route's) and the
scalar path (misaligned base pointers, widths that are not a multiple of 4); and every input check
by the argument it names. The one-state route forward (Variant::kOneStateRoute: N = 1, sequential
plan) runs for every dtype; the tests check that the emulation ran the variant ``_launch_plan``
reports (``_emulation_forward_variants``). tests/ops/compiled/test_cuda_emulation_plans.py runs the route
kernels on every device profile's plans.
"""
from __future__ import annotations

import pytest
import torch

from support.v3_cases import EMULATION, assert_close, needs_gpu
from vmamba2d.ops import backend_info
from vmamba2d.ops.interface import cross_scan_mode, cross_scan_per_route, cross_selective_scan_2d
from vmamba2d.ops.routes import Route
from support.route_cases import CORNERS_2D, CROSS_2D, NAMES, check, forward_variants, make_inputs, reference, run


CROSS_1D, CORNERS_1D = [8, 12, 11, 15], [8, 13, 11, 14]
SINGLE_FLIPS = [1, 2, 9, 10]  # from_right or from_bottom alone, 2D and flat
H100 = dict(sm_count=132, smem_per_block=227 * 1024, smem_per_sm=228 * 1024)
# One T4-sized SM: too few block slots for the tile-parallel passes to pay off.
SEQUENTIAL = dict(sm_count=1, smem_per_block=64 * 1024, smem_per_sm=64 * 1024)












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
        launch = EMULATION._launch_plan(2, 2, 1, 1, 37, 41, **device, route=code)
        assert launch["fwd_tile_parallel"] == (plan == "tile-parallel")
        # N = 1, sequential: the one-state route forward and backward; tile-parallel: the route variant.
        assert launch["fwd_variant"] == ("kOneStateRoute" if plan == "sequential" else "kRoute")
        assert launch["bwd_variant"] == ("kOneStateRoute" if plan == "sequential" else "kRoute")
    check(make_inputs(2, 2, CROSS_2D, 1, 37, 41, dtype=torch.bfloat16, seed=3), CROSS_2D, rtol=3e-2,
          out_fp32=True, **device)
    # fp32 at N = 1 runs the one-state route forward too (its 16-byte loads in two batches in the
    # second block phase).
    inputs = make_inputs(1, 2, CROSS_2D, 1, 37, 41, seed=12)
    assert forward_variants(inputs, CROSS_2D, **device) == [launch["fwd_variant"]]
    check(inputs, CROSS_2D, rtol=5e-5, **device)
    # fp16: its backward parks dt in the scratch map the recording forwards write their y into.
    check(make_inputs(1, 2, CORNERS_2D, 1, 37, 41, dtype=torch.float16, seed=15), CORNERS_2D, rtol=3e-2,
          **device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_channel_slices_and_mixed_plans(dtype):
    # dim 8 in blocks of 4 channels: two backward slices (dB / dC partials summed in slice order);
    # a 6 x 40 map: the 2D routes walk their two tiles in order (one-state route forward), the flat
    # ones (1 x 240) run tile-parallel.
    routes = [0, 4, 8, 12]
    for code, tile_parallel in zip(routes, (False, False, True, True)):
        launch = EMULATION._launch_plan(2, 8, 1, 1, 6, 40, **H100, route=code)
        assert launch["bwd_slices"] == 2 and launch["fwd_tile_parallel"] == tile_parallel
        assert launch["fwd_variant"] == ("kRoute" if tile_parallel else "kOneStateRoute")
    inputs = make_inputs(2, 8, routes, 1, 6, 40, dtype=dtype, seed=13)
    assert forward_variants(inputs, routes, **H100) == ["kRoute", "kOneStateRoute"]
    check(inputs, routes, rtol=5e-5 if dtype == torch.float32 else 3e-2, **H100)


def test_several_state_rounds_on_a_small_device():
    # N = 16 on a T4-sized device: two warps per channel, eight state rounds (dt / u / y tiles kept
    # between rounds); rows of 13 (no vector path).
    t4 = dict(sm_count=40, smem_per_block=64 * 1024, smem_per_sm=64 * 1024)
    check(make_inputs(1, 2, CORNERS_2D, 16, 9, 13, seed=11), CORNERS_2D, rtol=5e-5, **t4)


def test_half_types_flat_routes():
    check(make_inputs(2, 2, CORNERS_1D, 3, 9, 13, dtype=torch.float16, seed=4), CORNERS_1D, rtol=3e-2,
          dy_fp32=True, **H100)


@pytest.mark.parametrize("dim", [4, 3, 1])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_vector_path_on_aligned_maps_incl_reversed_routes(dtype, dim):
    # 8 x 12 (rows of whole quads): the identity and the reversed routes take vector accesses,
    # the columns-first ones the per-cell path. N = 1, one tile: the one-state route forward, with
    # a block of 4 channels, of 3 (an empty channel slot in each of its phases) or of 1.
    rtol = 5e-5 if dtype == torch.float32 else 3e-2
    inputs = make_inputs(2, dim, CROSS_2D, 1, 8, 12, dtype=dtype, seed=5)
    for code in CROSS_2D:
        launch = EMULATION._launch_plan(2, dim, 1, 1, 8, 12, **H100, route=code)
        assert (launch["fwd_variant"], launch["fwd_channels"]) == ("kOneStateRoute", dim)
    assert forward_variants(inputs, CROSS_2D, **H100) == ["kOneStateRoute"]
    check(inputs, CROSS_2D, rtol=rtol, **H100)
    one = {n: (t[:, 2:3] if n in ("delta", "B", "C") else t) for n, t in inputs.items()}
    one = {n: t.contiguous() for n, t in one.items()}
    one["A"], one["D"], one["delta_bias"] = (inputs[n][2 * dim:3 * dim].contiguous() for n in ("A", "D", "delta_bias"))
    dy = torch.randn(one["u"].shape, generator=torch.Generator().manual_seed(9)).to(dtype)
    args = [one[n] for n in NAMES]
    for code, vector in ((3, True), (11, True), (4, False)):
        EMULATION._emulate_cross_forward(*args, True, [code], False, **H100)
        forward = EMULATION._emulation_vector_accesses()
        EMULATION._emulate_cross_backward(*args, True, [code], dy, **H100)
        backward = EMULATION._emulation_vector_accesses()
        assert (forward > 0 and backward > 0) == vector, (code, forward, backward)
    y, grads = run(one, [3], dy, **H100)
    y_ref, grads_ref = reference(one, [3], dy)
    assert_close("y (reversed route alone)", y, y_ref, rtol)
    for name, got, ref in zip(NAMES, grads, grads_ref):
        assert_close("d" + name, got, ref, rtol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_general_route_kernels_take_the_vector_path_with_half_types(dtype):
    # N = 2 runs the general route variant (kRoute) in both passes; on 8 x 12 maps (rows of whole
    # quads) the identity route and the reversed one (its vector quads mirrored in the backward)
    # take 16-byte accesses with 2-byte inputs too.
    for code, seed in ((0, 31), (3, 32)):
        launch = EMULATION._launch_plan(2, 4, 1, 2, 8, 12, **H100, route=code)
        assert (launch["fwd_variant"], launch["bwd_variant"]) == ("kRoute", "kRoute")
        inputs = make_inputs(2, 4, [code], 2, 8, 12, dtype=dtype, seed=seed)
        args = [inputs[n] for n in NAMES]
        dy = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
        EMULATION._emulate_cross_forward(*args, True, [code], False, **H100)
        assert EMULATION._emulation_vector_accesses() > 0, code
        EMULATION._emulate_cross_backward(*args, True, [code], dy, **H100)
        assert EMULATION._emulation_vector_accesses() > 0, code
        check(inputs, [code], rtol=3e-2, seed=seed, **H100)
    # Several tiles walked by one block (sequential plan): the backward's later phases find the
    # vector quads by the anchors its first phase recorded.
    one_sm = dict(H100, sm_count=1)
    assert not EMULATION._launch_plan(1, 4, 1, 2, 36, 40, **one_sm, route=3)["bwd_tile_parallel"]
    check(make_inputs(1, 4, [3], 2, 36, 40, dtype=dtype, seed=33), [3], rtol=3e-2, seed=33, **one_sm)
    # N = 1 in the tile-parallel plan: kRoute with no dt tile, its last phase finds the vector quads
    # by the anchors its first phase recorded (a reversed route's mirrored); dy in both dtypes.
    for code, dy_fp32 in ((0, True), (3, False), (3, True)):
        launch = EMULATION._launch_plan(1, 4, 1, 1, 36, 40, **H100, route=code)
        assert launch["bwd_tile_parallel"] and launch["bwd_variant"] == "kRoute"
        check(make_inputs(1, 4, [code], 1, 36, 40, dtype=dtype, seed=34 + code), [code], rtol=3e-2, seed=34,
              dy_fp32=dy_fp32, **H100)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("height, width", [(9, 13), (8, 14)])
def test_one_state_route_forward_on_whole_quads_off_the_vector_path(dtype, height, width):
    # One tile, N = 1: the one-state route forward (2-byte types). 9 x 13: H * W is not a multiple
    # of 4, so y's planes are not aligned and no quad is a vector one; 8 x 14: the whole quads of odd
    # rows start 2 cells past an aligned position. Either way the quads off the vector path that are
    # whole map rows still test y's own alignment for their store / add (the first route stores,
    # the later ones add; y is fp32), and the backward sees quads that are not whole rows.
    for code in CROSS_2D:
        launch = EMULATION._launch_plan(2, 4, 1, 1, height, width, **H100, route=code)
        assert launch["fwd_variant"] == "kOneStateRoute"
    check(make_inputs(2, 4, CROSS_2D, 1, height, width, dtype=dtype, seed=15), CROSS_2D, rtol=3e-2, **H100)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_last_state_round_with_fewer_states_than_warps(dtype):
    # N = 5 on one channel: in both passes a number of warps per channel that does not divide 5 (four
    # on an H100), so the last state round has fewer states than warps.
    for code in CORNERS_2D:
        launch = EMULATION._launch_plan(1, 1, 1, 5, 9, 13, **H100, route=code)
        assert 5 % launch["fwd_warps_per_channel"] != 0 and 5 % launch["bwd_warps_per_channel"] != 0, launch
    half = dtype != torch.float32
    check(make_inputs(1, 1, CORNERS_2D, 5, 9, 13, dtype=dtype, seed=16), CORNERS_2D, rtol=3e-2 if half else 5e-5,
          **H100)


@pytest.mark.parametrize("height, width", [(1, 1), (1, 100), (100, 1)])
@pytest.mark.parametrize("plan", ["sequential", "tile-parallel"])
def test_line_and_single_cell_maps(height, width, plan):
    # A row map is a column map on the columns-first routes (and the other way round): packed maps
    # of one row / column, 100 cells long (four tiles: walked in order or run in parallel), a single
    # cell; 2D and flat routes, N = 1 (bf16: the one-state route forward in the sequential plan) and 3.
    routes = [0, 4, 3, 7, 8, 13]
    device = SEQUENTIAL if plan == "sequential" else H100
    for nstate, dtype, rtol in ((1, torch.bfloat16, 3e-2), (3, torch.float32, 5e-5)):
        for code in routes:
            launch = EMULATION._launch_plan(3, 2, 1, nstate, height, width, **device, route=code)
            parallel = height * width > 1 and plan == "tile-parallel"
            assert launch["fwd_tile_parallel"] == launch["bwd_tile_parallel"] == parallel, (code, launch)
        check(make_inputs(3, 2, routes, nstate, height, width, dtype=dtype, seed=17 + nstate), routes, rtol=rtol,
              **device)


ALL_CODES = list(range(16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_state_route_backward_every_route_code(dtype):
    # N = 1 on 4 channels (one block of four one-warp channels): the backward runs the one-state
    # route variant, which parks dt in the route's ddelta cells (fp32) or in the scratch map (2-byte
    # types). All 16 route codes as one op on packed odd 5 x 7 maps (per-cell path; the flat routes'
    # 1 x 35 maps take two tiles each).
    for code in ALL_CODES:
        launch = EMULATION._launch_plan(3, 4, 1, 1, 5, 7, **H100, route=code)
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
        assert EMULATION._launch_plan(2, 4, 1, 1, 8, 12, **H100, route=code)["bwd_variant"] == "kOneStateRoute"
    rtol = 5e-5 if dtype == torch.float32 else 3e-2
    check(inputs, routes, rtol=rtol, **H100)
    # The reversed route (code 3, route 2 of the op) alone: its backward takes the vector path.
    reversed_only = {n: t[:, 2:3].contiguous() if n in ("delta", "B", "C") else t for n, t in inputs.items()}
    for n in ("A", "D", "delta_bias"):
        reversed_only[n] = inputs[n][8:12].contiguous()
    check(reversed_only, [3], rtol=rtol, **H100)
    assert EMULATION._emulation_vector_accesses() > 0
    args = [inputs[n] for n in NAMES]
    dy = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    first = EMULATION._emulate_cross_backward(*args, True, routes, dy, order=1, **H100)
    second = EMULATION._emulate_cross_backward(*args, True, routes, dy, order=23, **H100)
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
    assert EMULATION._emulation_vector_accesses() == 0


def test_channels_last_map():
    inputs = make_inputs(2, 3, CROSS_2D, 1, 6, 10, seed=7)
    inputs["u"] = inputs["u"].contiguous(memory_format=torch.channels_last)
    y, grads = check(inputs, CROSS_2D, rtol=5e-5, **H100)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert grads[0].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("nstate", [1, 2])
def test_gradients_bitwise_equal_across_thread_orders(nstate):
    # N = 1: the one-state route forward (fp32); N = 2: the route variant.
    inputs = make_inputs(2, 4, CORNERS_2D, nstate, 11, 9, seed=8)
    expected = "kOneStateRoute" if nstate == 1 else "kRoute"
    assert forward_variants(inputs, CORNERS_2D, **H100) == [expected]
    dy = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(2))
    first = run(inputs, CORNERS_2D, dy, order=1, **H100)
    second = run(inputs, CORNERS_2D, dy, order=17, **H100)
    assert torch.equal(first[0], second[0])
    for a, b in zip(first[1], second[1]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("nstate, height, width, dtype, variants", [
    (2, 7, 6, torch.float32, ("kRoute", "kRoute")),
    (1, 7, 6, torch.float32, ("kOneStateRoute", "kOneStateRoute")),
    (1, 7, 6, torch.bfloat16, ("kOneStateRoute", "kOneStateRoute")),
    (1, 7, 6, torch.float16, ("kOneStateRoute", "kOneStateRoute")),
    (1, 36, 40, torch.float16, ("kRoute", "kRoute")),  # tile-parallel
], ids=["n2", "n1-fp32", "n1-bf16", "n1-fp16", "n1-fp16-tile-parallel"])
def test_without_skip_and_bias_and_softplus(nstate, height, width, dtype, variants):
    # D and delta_bias None (no dD / ddelta_bias), delta used as the step size directly; two
    # channels per block (fewer than the block's channel slots).
    routes = CORNERS_2D
    for code in routes:
        launch = EMULATION._launch_plan(2, 2, 1, nstate, height, width, **H100, route=code)
        assert (launch["fwd_variant"], launch["bwd_variant"]) == variants
    inputs = make_inputs(2, 2, routes, nstate, height, width, dtype=dtype, seed=14)
    inputs["delta"] = (inputs["delta"].float().abs() * 0.2 + 0.02).to(dtype)
    args = [None if n in ("D", "delta_bias") else inputs[n] for n in NAMES]
    dy = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    y = EMULATION._emulate_cross_forward(*args, False, routes, False, order=3, **H100)
    grads = EMULATION._emulate_cross_backward(*args, False, routes, dy, order=4, **H100)
    leaves = [None if t is None else t.double().requires_grad_() for t in args]
    y_ref = cross_scan_per_route(*leaves, False, tuple(Route.from_code(c) for c in routes), "torch", torch.float64)
    y_ref.backward(dy.double())
    rtol = 5e-5 if dtype == torch.float32 else 3e-2
    assert_close("y", y, y_ref.detach(), rtol)
    for name, got, leaf in zip(NAMES, grads, leaves):
        if leaf is None:
            assert got is None, name
        else:
            assert_close("d" + name, got, leaf.grad, rtol)


def test_bad_routes_are_rejected():
    inputs = make_inputs(1, 1, [0, 4], 1, 4, 4)
    args = [inputs[n] for n in NAMES]
    with pytest.raises(ValueError, match="route codes"):
        EMULATION._emulate_cross_forward(*args, True, [0, 16], False)
    with pytest.raises(ValueError, match="delta"):
        EMULATION._emulate_cross_forward(*args, True, [0, 4, 3], False)


def _empty_inputs(batch, dim, routes, nstate, height, width):
    """Inputs of the right shapes holding no map cells (batch 0 or an empty map): no memory."""
    k = len(routes)
    return {"u": torch.zeros(batch, dim, height, width), "delta": torch.zeros(batch, k, dim, height, width),
            "A": -torch.ones(k * dim, nstate), "B": torch.zeros(batch, k, nstate, height, width),
            "C": torch.zeros(batch, k, nstate, height, width), "D": torch.zeros(k * dim),
            "delta_bias": torch.zeros(k * dim)}


def _with(**changes):
    """A bad-input case: the valid 2-route inputs (batch 1, dim 2, N 2, 4 x 5) with these entries
    replaced (a callable gets the valid inputs)."""
    def build():
        inputs = dict(make_inputs(1, 2, [0, 4], 2, 4, 5), routes=[0, 4])
        inputs["dy"] = torch.zeros(1, 2, 4, 5)
        for name, value in changes.items():
            inputs[name] = value(inputs) if callable(value) else value
        return inputs
    return build


def _bf16_with_dy(dy):
    inputs = _with(dy=dy)()
    return {n: t.bfloat16() if n in ("u", "delta", "B", "C") else t for n, t in inputs.items()}


# name: (inputs, exception, message): each check of check_cross_inputs (scan2d_routes.h) and of the
# bindings names the argument and what it expected.
BAD_INPUTS = {
    "no-routes": (_with(routes=[]), ValueError, "routes must name at least one route"),
    "route-code": (_with(routes=[0, -1]), ValueError, r"routes must be route codes in \[0, 16\), got -1"),
    "u-rank": (_with(u=lambda i: i["u"].flatten(2)), ValueError,
               r"u must be \(batch, dim, H, W\), got \[1, 2, 20\]"),
    "A-rank": (_with(A=lambda i: i["A"].flatten()), ValueError, r"A must be \(routes \* dim, N\), got \[8\]"),
    "empty-map": (lambda: dict(_empty_inputs(1, 2, [0, 4], 2, 0, 5), routes=[0, 4], dy=torch.zeros(1, 2, 0, 5)),
                  ValueError, r"u's map must not be empty, got \[1, 2, 0, 5\]"),
    "map-size": (lambda: dict(_empty_inputs(0, 1, [0, 4], 1, 50000, 50000), routes=[0, 4],
                              dy=torch.zeros(0, 1, 50000, 50000)),
                 ValueError, r"u's map must have H \* W < 2\^31 - 1 cells, got H \* W = 2500000000"),
    "u-dtype": (_with(u=lambda i: i["u"].double()), TypeError, "u must be float32, float16 or bfloat16, got Double"),
    "delta-dtype": (_with(delta=lambda i: i["delta"].half()), TypeError, "delta must be Float, got Half"),
    "delta-layout": (_with(delta=lambda i: i["delta"].transpose(-1, -2).contiguous().transpose(-1, -2)),
                     RuntimeError, "delta must be contiguous"),
    "A-rows": (_with(A=lambda i: i["A"][:-1]), ValueError, r"A must have shape \[4, 2\], got \[3, 2\]"),
    "A-dtype": (_with(A=lambda i: i["A"].double()), TypeError, "A must be Float, got Double"),
    "N-0": (_with(A=torch.ones(4, 0), B=torch.zeros(1, 2, 0, 4, 5), C=torch.zeros(1, 2, 0, 4, 5)), ValueError,
            r"N = 0 states, supported 1..64"),
    "N-65": (_with(A=-torch.ones(4, 65), B=torch.zeros(1, 2, 65, 4, 5), C=torch.zeros(1, 2, 65, 4, 5)),
             ValueError, r"N = 65 states, supported 1..64"),
    "B-shape": (_with(B=lambda i: i["B"][:, :, :1].contiguous()), ValueError,
                r"B must have shape \[1, 2, 2, 4, 5\], got \[1, 2, 1, 4, 5\]"),
    "C-dtype": (_with(C=lambda i: i["C"].half()), TypeError, "C must be Float, got Half"),
    "D-shape": (_with(D=lambda i: i["D"][:3]), ValueError, r"D must have shape \[4\], got \[3\]"),
    "delta_bias-dtype": (_with(delta_bias=lambda i: i["delta_bias"].half()), TypeError,
                         "delta_bias must be Float, got Half"),
    "dim-limit": (lambda: dict(_empty_inputs(0, 65536, [0, 4], 1, 1, 1), routes=[0, 4],
                               dy=torch.zeros(0, 65536, 1, 1)),
                  ValueError, r"dim <= 65535 \(the launch grid's limits\), got batch = 0, dim = 65536"),
}
BAD_DY = {  # the backward's own checks
    "dy-dtype": (lambda: _bf16_with_dy(torch.zeros(1, 2, 4, 5, dtype=torch.half)), TypeError,
                 "dy must be BFloat16 or float32, got Half"),
    "dy-shape": (_with(dy=torch.zeros(1, 2, 5, 4)), ValueError,
                 r"dy must have shape \[1, 2, 4, 5\], got \[1, 2, 5, 4\]"),
}


@pytest.mark.parametrize("entry, case, error, message", [
    pytest.param(entry, *bad, id=f"{entry}-{name}")
    for cases, entries in ((BAD_INPUTS, ("forward", "backward")), (BAD_DY, ("backward",)))
    for name, bad in cases.items() for entry in entries])
def test_bad_inputs_are_rejected_by_name(entry, case, error, message):
    inputs = case()
    args = [inputs[n] for n in NAMES]
    with pytest.raises(error, match=message):
        if entry == "forward":
            EMULATION._emulate_cross_forward(*args, True, inputs["routes"], False, **H100)
        else:
            EMULATION._emulate_cross_backward(*args, True, inputs["routes"], inputs["dy"], **H100)


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
