"""The v4 one-plane-per-lane forward (PL, csrc/cuda/scan2d_planes.cuh) on the host emulation: CTAs and
threads in shuffled orders, asynchronous copies that land only at their wait, every shared and global
access checked (races between barriers, reads before a copy's wait, copies into a buffer still being
read), against the fp64 reference of the 2D selective scan (selective_scan_2d_reference on the route's
order, test_cuda_emulation_rows.reference)."""
from __future__ import annotations

import pytest
import torch

from support.cuda_emulation_build import planes_emulation
from support.rows_cases import four_route_inputs, make_inputs, reference, route_part

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Largest |y - reference| / max |reference| per y type (as for RS).
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# Injected staging bugs (scan2d_planes.cuh: kBugNoWait, kBugNoBarrierAfterWait, kBugRefillWhileRead).
BUG_NO_WAIT, BUG_NO_BARRIER_AFTER_WAIT, BUG_REFILL_WHILE_READ = 1, 2, 3


@pytest.fixture(scope="module")
def planes():
    return planes_emulation()


def run(planes, x, height, width, route=0, y_fp32=False, order=2, chunk=16, grid=2, copy_bytes=16, bug=0,
        softplus=True, compiled_geometry=True):
    return planes.planes_forward(x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["delta_bias"], softplus,
                                 height, width, route, y_fp32, order, chunk, grid, copy_bytes, bug,
                                 compiled_geometry=compiled_geometry)


def check(y, x, height, width, route=0, y_fp32=False, softplus=True):
    expected = reference(x, height, width, route, softplus)
    assert not torch.isnan(y).any()
    assert y.dtype == (torch.float32 if y_fp32 else x["u"].dtype)
    tol = TOLERANCE[torch.float32 if y_fp32 else x["u"].dtype]
    err = ((y.double() - expected).abs().max() / expected.abs().max()).item()
    assert err <= tol, f"relative error {err:.3g} > {tol}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 7), (1, 1), (8, 8), (3, 5), (64, 1), (1, 64)], ids=str)
def test_maps(planes, dtype, shape):
    # 2 x 37 maps in chunks of 16 (a tail of 10) over 2 persistent CTAs: both buffers, the tail and a
    # chunk straddling the batch entries; 16-byte copies of planes that start anywhere in a piece.
    height, width = shape
    x = make_inputs(2, 37, 1, height, width, dtype, seed=height * 100 + width)
    first = run(planes, x, height, width, order=0)
    check(first, x, height, width)
    for order in (1, 5):
        assert torch.equal(run(planes, x, height, width, order=order), first)


@pytest.mark.parametrize("route", range(16))
def test_every_route(planes, route):
    # Every route code, 2D and flat, rows or columns first, on a wide, a tall and the model's plane.
    for (height, width), dtype in (((3, 5), torch.float32), ((9, 2), torch.bfloat16), ((7, 7), torch.float32)):
        x = make_inputs(1, 21, 3, height, width, dtype, seed=route)
        check(run(planes, x, height, width, route=route, order=route + 2, chunk=8, grid=2), x, height, width, route)


# The GPU entry compiles the plane's shape and route in (VMAMBA2D_PL_HEIGHT / _WIDTH / _ROUTE / _COPY);
# the emulation runs those instances for the model's 7 x 7 plane in every route code and copy width
# and for one shape of each scan form (column by column, line by line), against the reference and bit
# for bit against the run-time geometry.
COMPILED_IN = ([(7, 7, route, 16) for route in range(16)] + [(7, 7, 0, 8), (7, 7, 0, 4)]
               + [(1, 64, 0, 16), (64, 1, 0, 16), (8, 8, 0, 16)])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_in_geometries_equal_the_run_time_one(planes, dtype):
    for height, width, route, copy_bytes in COMPILED_IN:
        x = make_inputs(2, 24, 2, height, width, dtype, seed=route + copy_bytes)
        options = dict(route=route, copy_bytes=copy_bytes, chunk=32, order=route + 2)
        fixed = run(planes, x, height, width, **options)
        check(fixed, x, height, width, route)
        runtime = run(planes, x, height, width, **options, compiled_geometry=False)
        assert torch.equal(fixed, runtime), (height, width, route, copy_bytes)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fp32_output_of_half_inputs(planes, dtype):
    # fp32 y has its own staging region; the y stores are 4-byte elements.
    x = make_inputs(3, 10, 5, 7, 7, dtype, seed=11)
    for route in (0, 5, 15):
        y = run(planes, x, 7, 7, route=route, y_fp32=True, chunk=8, grid=3)
        check(y, x, 7, 7, route, y_fp32=True)


@pytest.mark.parametrize("copy_bytes", [4, 8, 16])
def test_copy_widths_and_chunk_sizes(planes, copy_bytes):
    height, width = 5, 3
    x = make_inputs(1, 50, 2, height, width, torch.bfloat16, seed=copy_bytes)
    first = run(planes, x, height, width, route=6, copy_bytes=copy_bytes, chunk=32, grid=1)
    check(first, x, height, width, 6)
    for chunk, grid in ((7, 3), (64, 1), (1, 4)):
        assert torch.equal(run(planes, x, height, width, route=6, copy_bytes=copy_bytes, chunk=chunk, grid=grid),
                           first)


def test_groups_of_one_channel_and_batch_entries_within_a_chunk(planes):
    # groups == dim: a chunk needs a B / C plane per map; dim 3 < chunk: a chunk spans 6 batch entries.
    x = make_inputs(7, 3, 3, 4, 6, torch.float32, seed=8)
    check(run(planes, x, 4, 6, route=9, chunk=16, grid=1), x, 4, 6, 9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_route_planes_of_the_four_route_layout(planes, dtype):
    # delta with 4 routes x dim planes and B / C with 4 routes x groups planes per batch entry: a chunk
    # stages one contiguous run per batch entry (dim 6 < chunk 16: several).
    batch, dim, groups, routes, height, width = 5, 8, 2, 4, 7, 7
    x = four_route_inputs(batch, dim, groups, height, width, dtype, seed=21)
    for index, code in enumerate((0, 4, 3, 7)):
        part = route_part(x, index, dim, groups)
        y = planes.planes_forward(x["u"], x["delta"], part["A"], x["B"], x["C"], part["D"], part["delta_bias"], True,
                                  height, width, code, False, index + 2, 16, 2, 4, 0, routes, index)
        check(y, part, height, width, code)


def test_without_softplus_d_and_bias(planes):
    x = make_inputs(1, 9, 3, 6, 4, torch.float32, seed=12, use_d=False, use_bias=False, softplus=False)
    for route in (0, 3, 6, 13):
        check(run(planes, x, 6, 4, route=route, softplus=False, chunk=4), x, 6, 4, route, softplus=False)


def test_a_nan_in_one_map_leaves_every_other_map_bit_equal(planes):
    # Each plane is scanned by its own thread: a NaN / inf in one map's delta or u changes that map only.
    x = make_inputs(2, 20, 2, 7, 7, torch.bfloat16, seed=9)
    clean = run(planes, x, 7, 7, chunk=8)
    bad = dict(x, delta=x["delta"].clone(), u=x["u"].clone())
    bad["delta"][0, 3, 17] = float("nan")
    bad["u"][1, 11, 0] = float("inf")
    y = run(planes, bad, 7, 7, chunk=8)
    others = torch.ones(2, 20, dtype=torch.bool)
    others[0, 3] = others[1, 11] = False
    assert torch.equal(y[others], clean[others])
    assert torch.isnan(y[0, 3]).any() and not torch.isfinite(y[1, 11]).all()


def _pieces(begin: int, end: int, copy: int) -> int:
    """copy-byte pieces from the one holding byte ``begin`` to the one holding byte ``end - 1``."""
    return -(-(end - begin // copy * copy) // copy)


@pytest.mark.parametrize("size,dtype", [(7, torch.bfloat16), (8, torch.float32)], ids=str)
def test_every_input_byte_is_staged_once_and_y_leaves_in_wide_stores(planes, size, dtype):
    # 7 x 7 bf16 (98-byte planes, packed) and 8 x 8 fp32 (256-byte planes, staged 272 bytes apart),
    # 3 x 41 maps in chunks of 32 (tail 27), contiguous tensors, one group: per chunk, u and delta as
    # the 16-byte pieces covering the chunk's bytes, B and C the pieces of the batch entries' planes it
    # spans; y stores 16 bytes wherever a piece lies wholly inside.
    batch, dim, chunk = 3, 41, 32
    plane = size * size * dtype.itemsize
    x = make_inputs(batch, dim, 1, size, size, dtype, seed=4)
    check(run(planes, x, size, size, chunk=chunk, grid=2), x, size, size)
    copies = wide = 0
    for first in range(0, batch * dim, chunk):
        last = min(first + chunk, batch * dim) - 1
        copies += 2 * _pieces(first * plane, (last + 1) * plane, 16)
        keys = (first // dim, last // dim)
        copies += 2 * _pieces(keys[0] * plane, (keys[1] + 1) * plane, 16)
        wide += ((last + 1) * plane) // 16 - -(-(first * plane) // 16)
    assert planes.planes_counters() == (copies, wide)


@pytest.mark.parametrize("bug,message", [
    (BUG_NO_WAIT, "before its cp.async .* was waited for"),
    (BUG_NO_BARRIER_AFTER_WAIT, "shared-memory race: .* with no barrier between"),
    (BUG_REFILL_WHILE_READ, "an overwrite of a buffer still being read"),
])
def test_the_checker_catches_staging_bugs(planes, bug, message):
    x = make_inputs(2, 20, 1, 7, 7, torch.bfloat16, seed=2)
    with pytest.raises(RuntimeError, match=message):
        run(planes, x, 7, 7, chunk=8, grid=2, bug=bug)
    check(run(planes, x, 7, 7, chunk=8, grid=2), x, 7, 7)


@pytest.mark.parametrize("scenario", ["copy_tail", "never_written"])
def test_the_checker_refuses_reads_of_undefined_shared_bytes(planes, scenario):
    """A copy's bytes past its source bytes are zero after cp.async but stale after sm_75's load and
    shared store; the kernel must never read them (nor memory nothing wrote): the emulation fails such
    a read instead of returning its own zeros or poison, so both device paths are held to it."""
    planes.planes_checker_self_check("copied_bytes")
    with pytest.raises(RuntimeError, match="which no store and no copied source byte defined"):
        planes.planes_checker_self_check(scenario)


def test_rejects_what_it_cannot_run(planes):
    x = make_inputs(1, 2, 1, 9, 8, torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="1 .. 64 cells"):
        run(planes, x, 9, 8)
    x = make_inputs(1, 2, 1, 4, 4, torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="copy_bytes"):
        run(planes, x, 4, 4, copy_bytes=2)
    with pytest.raises(RuntimeError, match="route"):
        run(planes, x, 4, 4, route=16)
