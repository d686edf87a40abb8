"""The RS backward's launch module (vmamba2d/ops/compiled/rows_backward_launch.py) without a GPU: the
ctypes parameter block has the C struct's layout (the C++ compiler's offsetof), the plan rule, the
launches of the saving forward and of the backward pass their grid / block / parameter bytes on the
current stream (recording fake driver), for route 0 and the other 2D routes, bad carries / dy /
routes are refused, and NVRTC compiles the model's instances within the register budget."""
from __future__ import annotations

import ctypes

import pytest
import torch

from vmamba2d.ops.compiled import nvrtc, rows_launch
from vmamba2d.ops.compiled import rows_backward_launch as rbl

try:
    TOOLCHAIN = nvrtc.find_toolchain()
except nvrtc.NvrtcUnavailable as err:
    pytest.skip(f"no NVRTC toolchain: {err}", allow_module_level=True)

from support.c_layout import ctypes_layout, cxx_layout  # noqa: E402
from support.nvrtc_recording import recording_launcher, stub_kernel  # noqa: E402


def scan_inputs(batch, dim, height, width, dtype=torch.float32, groups=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    L = height * width
    u, delta, dy = (torch.randn(batch, dim, L, generator=g).to(dtype) for _ in range(3))
    B, C = (torch.randn(batch, groups, 1, L, generator=g).to(dtype) for _ in range(2))
    A = -torch.rand(dim, 1, generator=g)
    return u, delta, A, B, C, torch.randn(dim, generator=g), torch.randn(dim, generator=g), dy


def test_params_layout_equals_the_c_struct(tmp_path):
    assert cxx_layout(tmp_path, "scan2d_rows_backward.cuh", "vmamba2d::rows::RowsBackwardParams",
                      rbl.RowsBackwardParams) == ctypes_layout(rbl.RowsBackwardParams)


@pytest.mark.parametrize("width,elem,dy,aligned,expected", [
    (56, 4, 4, 16, (4, 4, 14, 2)),
    (28, 2, 2, 16, (4, 4, 7, 4)),
    (14, 2, 4, 16, (2, 2, 7, 4)),
    (7, 4, 4, 16, (1, 1, 7, 4)),
    (1, 4, 4, 16, (1, 1, 1, 32)),
    (13, 4, 4, 16, (1, 1, 13, 2)),
    (66, 4, 4, 16, (4, 1, 17, 1)),  # V = 2 would take 33 lanes: a ragged last lane at V = 4
    (56, 4, 4, 8, (4, 1, 14, 2)),  # misaligned for a 16-byte vector: scalar accesses
    (56, 2, 4, 8, (4, 1, 14, 2)),  # bf16 inputs, fp32 dy needs 16 bytes
])
def test_backward_plan(width, elem, dy, aligned, expected):
    plan = rbl.backward_plan(elem, dy, width, aligned)
    assert (plan.vec, plan.load, plan.seg_lanes, plan.maps_per_warp) == expected


def test_backward_plan_refuses_wide_rows():
    assert rbl.backward_plan(2, 2, 129) is None
    with pytest.raises(ValueError, match="elem_bytes"):
        rbl.backward_plan(8, 4, 56)


@pytest.fixture()
def launcher(tmp_path):
    return (*recording_launcher(tmp_path, TOOLCHAIN), tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saving_forward_launch(launcher, dtype):
    launcher, driver, folder = launcher
    u, delta, A, B, C, D, bias, _ = scan_inputs(3, 10, 28, 28, dtype)
    plan = rbl.backward_plan(u.element_size(), u.element_size(), 28)
    spec = rbl.save_spec(plan, dtype)
    stub_kernel(folder, spec, TOOLCHAIN)
    seen = driver.read_params(rows_launch.RowsParams, ctypes.c_void_p)
    y, carries = rbl.launch_forward_save(launcher, u, delta, A, B, C, D, bias, True, 28, 28, False, plan)
    assert y.shape == u.shape and y.dtype == dtype
    assert carries.shape == (30, 3, 28) and carries.dtype == torch.float32
    (launch,) = driver.of("launch")
    assert launch[1][2] == f"sym_{spec.file_stem}"
    assert launch[2:6] == ((-(-30 // (plan.maps_per_warp * 4)), 1, 1), 128, 0, 1000)
    ((p, carry_ptr),) = seen
    assert (p.u, p.y, p.seg_lanes, p.maps_per_warp, p.from_bottom) == (u.data_ptr(), y.data_ptr(), 7, 4, 0)
    assert carry_ptr.value == carries.data_ptr()
    assert dict(spec.defines)["VMAMBA2D_RSB_SAVE"] == "1"


@pytest.mark.parametrize("dtype,dy_fp32", [(torch.float32, False), (torch.bfloat16, True), (torch.float16, False)])
def test_backward_launch_passes_grid_block_and_parameter_block(launcher, dtype, dy_fp32):
    launcher, driver, folder = launcher
    batch, dim, groups, height, width = 3, 10, 2, 14, 14
    u, delta, A, B, C, D, bias, dy = scan_inputs(batch, dim, height, width, dtype, groups)
    if dy_fp32:
        dy = dy.float()
    plan = rbl.backward_plan(u.element_size(), dy.element_size(), width)
    spec = rbl.backward_spec(plan, dtype)
    stub_kernel(folder, spec, TOOLCHAIN)
    carries = torch.zeros(batch * dim, rbl.carry_rows(height), width)
    seen = driver.read_params(rbl.RowsBackwardParams)
    grads = rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, height, width, dy, carries, plan)
    du, ddelta, dA, dB, dC, dD, ddb = grads
    assert du.shape == u.shape and du.dtype == dtype and ddelta.shape == delta.shape
    assert dA.shape == (dim, 1) and dB.shape == B.shape and dB.dtype == dtype and dC.shape == C.shape
    assert dD.shape == (dim,) and ddb.shape == (dim,)
    (launch,) = driver.of("launch")
    assert launch[1][2] == f"sym_{spec.file_stem}"
    chunks = rbl.channel_chunks(dim, groups, plan.maps_per_warp)  # 5 channels a group, 4 maps a warp: 2
    assert chunks == 2
    assert launch[2:6] == ((-(-batch * groups * chunks // 4), 1, 1), 128, 0, 1000)
    ((p,),) = seen
    assert (p.u, p.delta, p.B, p.C, p.A, p.D, p.delta_bias, p.dy, p.carries, p.du, p.ddelta) == tuple(
        t.data_ptr() for t in (u, delta, B, C, A, D, bias, dy, carries, du, ddelta))
    assert (p.batch, p.dim, p.groups, p.height, p.width) == (batch, dim, groups, height, width)
    assert (p.seg_lanes, p.maps_per_warp, p.chunks, p.softplus, p.dy_fp32) == (7, 4, 2, 1, int(dy_fp32))
    assert all(v != 0 for v in (p.dBC_part, p.dA_part, p.dD_part, p.ddb_part))


@pytest.mark.parametrize("route,compiled,from_bottom", [(0, 0, 0), (3, 1, 1), (4, 4, 0), (7, 5, 1), (6, 4, 1)])
def test_routes_compile_their_passes_and_pass_from_bottom(launcher, route, compiled, from_bottom):
    # The saving forward takes from_bottom as a parameter (as the RS forward), the backward compiles
    # the whole code (its row direction too) and gets the matching parameter.
    launcher, driver, folder = launcher
    u, delta, A, B, C, D, bias, dy = scan_inputs(2, 4, 9, 14)
    plan = rbl.backward_plan(4, 4, 14)
    save, backward = rbl.save_spec(plan, torch.float32, route), rbl.backward_spec(plan, torch.float32, route)
    assert dict(save.defines)["VMAMBA2D_RSB_ROUTE"] == str(compiled) and save.name.endswith(f"r{compiled}")
    assert dict(backward.defines)["VMAMBA2D_RSB_ROUTE"] == str(route) and backward.name.endswith(f"r{route}")
    for spec in (save, backward):
        stub_kernel(folder, spec, TOOLCHAIN)
    seen_save = driver.read_params(rows_launch.RowsParams, ctypes.c_void_p)
    _, carries = rbl.launch_forward_save(launcher, u, delta, A, B, C, D, bias, True, 9, 14, False, plan, route)
    seen_backward = driver.read_params(rbl.RowsBackwardParams)
    rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, 9, 14, dy, carries, plan, route)
    (save_launch, backward_launch) = driver.of("launch")
    assert save_launch[1][2] == f"sym_{save.file_stem}" and backward_launch[1][2] == f"sym_{backward.file_stem}"
    ((p_save, _),) = seen_save
    ((p_backward,),) = seen_backward
    assert p_save.from_bottom == p_backward.from_bottom == from_bottom


def test_saving_forward_without_y_passes_a_null_y(launcher):
    launcher, driver, folder = launcher
    u, delta, A, B, C, D, bias, _ = scan_inputs(2, 4, 9, 14)
    plan = rbl.backward_plan(4, 4, 14)
    stub_kernel(folder, rbl.save_spec(plan, torch.float32, 4), TOOLCHAIN)
    seen = driver.read_params(rows_launch.RowsParams, ctypes.c_void_p)
    y, carries = rbl.launch_forward_save(launcher, u, delta, A, B, C, D, bias, True, 9, 14, False, plan, 4,
                                         store_y=False)
    assert y is None and carries.shape == (8, 1, 14)
    ((p, carry_ptr),) = seen
    assert p.y is None and p.u == u.data_ptr() and carry_ptr.value == carries.data_ptr()


@pytest.mark.parametrize("route", [8, -1, 12, True, 2.0])
def test_routes_without_an_rs_backward_are_refused(launcher, route):
    launcher, driver, _ = launcher
    u, delta, A, B, C, D, bias, dy = scan_inputs(2, 4, 9, 14)
    plan = rbl.backward_plan(4, 4, 14)
    with pytest.raises(ValueError, match="route: expected a 2D route code"):
        rbl.launch_forward_save(launcher, u, delta, A, B, C, D, bias, True, 9, 14, False, plan, route)
    with pytest.raises(ValueError, match="route: expected a 2D route code"):
        rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, 9, 14, dy, torch.zeros(8, 1, 14), plan,
                                 route)
    assert not driver.of("launch")


def stubbed_9x14_backward(launcher):
    """(launcher, the parameter blocks it will pass, fp32 inputs of a 2 x 4 x 9 x 14 call, their plan) with
    the route-0 backward's kernel stubbed."""
    launcher, driver, folder = launcher
    plan = rbl.backward_plan(4, 4, 14)
    stub_kernel(folder, rbl.backward_spec(plan, torch.float32), TOOLCHAIN)
    return launcher, driver.read_params(rbl.RowsBackwardParams), scan_inputs(2, 4, 9, 14), plan


def test_backward_writes_ddelta_into_the_given_buffer(launcher):
    launcher, seen, (u, delta, A, B, C, D, bias, dy), plan = stubbed_9x14_backward(launcher)
    routes = torch.zeros(3, *delta.shape)
    carries = torch.zeros(8, 1, 14)
    grads = rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, 9, 14, dy, carries, plan, 0, routes[1])
    ((p,),) = seen
    assert p.ddelta == routes[1].data_ptr() and grads[1].data_ptr() == routes[1].data_ptr()
    for bad in (routes[1].half(), routes[1][:, :2], torch.zeros(2, 126, 4).transpose(1, 2)):
        with pytest.raises(ValueError, match="ddelta_out: expected a contiguous"):
            rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, 9, 14, dy, carries, plan, 0, bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_adds_into_the_running_du_sum(launcher, dtype):
    # A multi-route op's middle route: du = the routes' fp32 sum so far + this route's, in place; a
    # 2-byte instance compiles du's fp32 type (the spec's "f"), an fp32 one has it either way.
    launcher, driver, folder = launcher
    u, delta, A, B, C, D, bias, dy = scan_inputs(2, 4, 9, 14, dtype)
    plan = rbl.backward_plan(u.element_size(), dy.element_size(), 14)
    spec = rbl.backward_spec(plan, dtype, 0, du_fp32=True)
    assert spec.name.endswith("r0f") == (dtype != torch.float32)
    assert dict(spec.defines)["VMAMBA2D_RSB_DU_F32"] == str(int(dtype != torch.float32))
    stub_kernel(folder, spec, TOOLCHAIN)
    seen = driver.read_params(rbl.RowsBackwardParams)
    running = torch.zeros(u.shape)
    du = rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, 9, 14, dy, torch.zeros(8, 1, 14), plan,
                                  0, None, running, True)[0]
    assert du is running
    ((p,),) = seen
    assert (p.du, p.du_sum, p.du_fp32) == (running.data_ptr(), running.data_ptr(), int(dtype != torch.float32))


def test_last_route_rounds_the_running_sum_into_a_new_du(launcher):
    launcher, driver, folder = launcher
    u, delta, A, B, C, D, bias, dy = scan_inputs(2, 4, 9, 14, torch.bfloat16)
    plan = rbl.backward_plan(2, 2, 14)
    spec = rbl.backward_spec(plan, torch.bfloat16, 0)
    assert dict(spec.defines)["VMAMBA2D_RSB_DU_F32"] == "0"
    stub_kernel(folder, spec, TOOLCHAIN)
    seen = driver.read_params(rbl.RowsBackwardParams)
    running = torch.zeros(u.shape)
    du = rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, 9, 14, dy, torch.zeros(8, 1, 14), plan,
                                  0, None, running, False)[0]
    assert du.dtype == torch.bfloat16 and du.shape == u.shape
    ((p,),) = seen
    assert (p.du, p.du_sum, p.du_fp32) == (du.data_ptr(), running.data_ptr(), 0)


def test_route_passes_read_and_write_their_planes_of_the_multi_route_layout(launcher):
    # Route 2 of 4: delta / ddelta at its dim planes of each batch entry, B / C at its group planes,
    # with the whole layout's planes as the batch stride (no copy of the route's planes).
    launcher, driver, folder = launcher
    batch, dim, groups, height, width, routes, index = 2, 4, 2, 9, 14, 4, 2
    u, _, A, _, _, D, bias, dy = scan_inputs(batch, dim, height, width, torch.bfloat16)
    L = height * width
    delta = torch.randn(batch, routes * dim, L).bfloat16()
    B, C = (torch.randn(batch, routes * groups, 1, L).bfloat16() for _ in range(2))
    plan = rbl.backward_plan(2, 2, width)
    save, backward = rbl.save_spec(plan, torch.bfloat16, 3), rbl.backward_spec(plan, torch.bfloat16, 3)
    stub_kernel(folder, save, TOOLCHAIN)
    seen_save = driver.read_params(rows_launch.RowsParams, ctypes.c_void_p)
    _, carries = rbl.launch_forward_save(launcher, u, delta, A, B, C, D, bias, True, height, width, False, plan, 3,
                                         False, routes, index)
    ((f, _),) = seen_save
    assert (f.delta, f.B, f.C) == (delta.data_ptr() + index * dim * L * 2, B.data_ptr() + index * groups * L * 2,
                                   C.data_ptr() + index * groups * L * 2)
    assert (f.delta_planes, f.bc_planes, f.dim, f.groups) == (routes * dim, routes * groups, dim, groups)
    stub_kernel(folder, backward, TOOLCHAIN)
    seen = driver.read_params(rbl.RowsBackwardParams)
    ddelta = torch.empty_like(delta)
    grads = rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, height, width, dy, carries, plan, 3,
                                     ddelta, None, False, routes, index)
    ((p,),) = seen
    assert (p.delta, p.ddelta) == (f.delta, ddelta.data_ptr() + index * dim * L * 2) and (p.B, p.C) == (f.B, f.C)
    assert (p.delta_planes, p.bc_planes, p.groups, p.chunks) == (routes * dim, routes * groups, groups, 1)
    assert grads[1] is ddelta and grads[3].shape == (batch, groups, 1, L)


@pytest.mark.parametrize("delta_planes,bc_planes,index,message", [
    (12, 8, 0, "delta: expected"), (16, 6, 0, "B, C: expected"), (16, 8, 4, "route_index: expected")])
def test_a_bad_multi_route_layout_is_refused(launcher, delta_planes, bc_planes, index, message):
    launcher, driver, _ = launcher
    u, _, A, _, _, D, bias, dy = scan_inputs(2, 4, 9, 14)
    delta = torch.zeros(2, delta_planes, 126)
    B = torch.zeros(2, bc_planes, 1, 126)
    plan = rbl.backward_plan(4, 4, 14)
    with pytest.raises(ValueError, match=message):
        rbl.launch_forward_save(launcher, u, delta, A, B, B, D, bias, True, 9, 14, False, plan, 0, False, 4, index)
    with pytest.raises(ValueError, match=message):
        rbl.launch_rows_backward(launcher, u, delta, A, B, B, D, bias, True, 9, 14, dy, torch.zeros(8, 1, 14), plan,
                                 0, None, None, False, 4, index)
    assert not driver.of("launch")


def test_cross_carries_launch_reads_the_four_route_layout(launcher):
    launcher, driver, folder = launcher
    batch, dim, groups, height, width = 2, 6, 2, 17, 28
    L = height * width
    u = torch.randn(batch, dim, L).bfloat16()
    delta = torch.randn(batch, 4 * dim, L).bfloat16()
    B, C = (torch.randn(batch, 4 * groups, 1, L).bfloat16() for _ in range(2))
    A, D, bias = -torch.rand(4 * dim, 1), torch.randn(4 * dim), torch.randn(4 * dim)
    plan = rbl.backward_plan(2, 2, width)
    spec = rbl.cross_save_spec(plan, torch.bfloat16)
    assert spec.name == "rows_cross_save.bf16.v4l4s3" and dict(spec.defines)["VMAMBA2D_RSB_SAVE"] == "2"
    stub_kernel(folder, spec, TOOLCHAIN)
    seen = driver.read_params(rows_launch.RowsParams, ctypes.c_void_p)
    carries = rbl.launch_cross_save(launcher, u, delta, A, B, C, D, bias, True, height, width, plan)
    assert carries.shape == (4, batch * dim, 2, width) and carries.dtype == torch.float32
    (launch,) = driver.of("launch")
    assert launch[2:6] == ((plan.blocks(batch, dim, 4), 1, 1), 128, 0, 1000)
    ((p, carry_ptr),) = seen
    assert (p.delta, p.B, p.C, p.A, p.y, p.D) == (delta.data_ptr(), B.data_ptr(), C.data_ptr(), A.data_ptr(), None, None)
    assert (p.delta_planes, p.bc_planes, p.dim, p.groups, p.softplus) == (4 * dim, 4 * groups, dim, groups, 1)
    assert carry_ptr.value == carries.data_ptr()


def test_cross_carries_refuse_a_ragged_plan_and_other_layouts(launcher):
    launcher, driver, _ = launcher
    u = torch.zeros(1, 2, 9 * 66)
    delta, B = torch.zeros(1, 8, 9 * 66), torch.zeros(1, 4, 1, 9 * 66)
    A = torch.zeros(8, 1)
    with pytest.raises(ValueError, match="plan: V = 4 must divide W = 66"):
        rbl.launch_cross_save(launcher, u, delta, A, B, B, None, None, True, 9, 66, rbl.backward_plan(4, 4, 66))
    plan = rbl.backward_plan(4, 4, 14)
    u = torch.zeros(1, 2, 126)
    with pytest.raises(ValueError, match="delta: expected"):
        rbl.launch_cross_save(launcher, u, torch.zeros(1, 6, 126), A, torch.zeros(1, 4, 1, 126),
                              torch.zeros(1, 4, 1, 126), None, None, True, 9, 14, plan)
    with pytest.raises(ValueError, match="A, delta_bias: expected"):
        rbl.launch_cross_save(launcher, u, torch.zeros(1, 8, 126), A[:2], torch.zeros(1, 4, 1, 126),
                              torch.zeros(1, 4, 1, 126), None, None, True, 9, 14, plan)
    assert not driver.of("launch")


def test_a_bad_running_du_sum_is_refused(launcher):
    launcher, seen, (u, delta, A, B, C, D, bias, dy), plan = stubbed_9x14_backward(launcher)
    for bad in (torch.zeros(u.shape, dtype=torch.float64), torch.zeros(2, 4, 125), torch.zeros(2, 126, 4).transpose(1, 2)):
        with pytest.raises(ValueError, match="du_sum: expected a contiguous float32 tensor"):
            rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, 9, 14, dy, torch.zeros(8, 1, 14),
                                     plan, 0, None, bad, True)
    assert seen == []


def test_backward_without_d_and_bias_passes_null(launcher):
    launcher, seen, (u, delta, A, B, C, _, _, dy), plan = stubbed_9x14_backward(launcher)
    grads = rbl.launch_rows_backward(launcher, u, delta, A, B, C, None, None, False, 9, 14, dy,
                                     torch.zeros(8, 1, 14), plan)
    assert grads[5] is None and grads[6] is None
    ((p,),) = seen
    assert (p.D, p.delta_bias, p.dD_part, p.ddb_part, p.softplus) == (None, None, None, None, 0)


def test_bad_carries_and_dy_are_refused(launcher):
    launcher, _, _ = launcher
    u, delta, A, B, C, D, bias, dy = scan_inputs(2, 4, 9, 14)
    plan = rbl.backward_plan(4, 4, 14)
    with pytest.raises(ValueError, match="carries: expected fp32 of shape"):
        rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, 9, 14, dy, torch.zeros(8, 2, 14), plan)
    with pytest.raises(ValueError, match="dy: expected"):
        rbl.launch_rows_backward(launcher, u, delta, A, B, C, D, bias, True, 9, 14, dy.half(), torch.zeros(8, 1, 14),
                                 plan)


def test_reduce_partials_sums_in_a_fixed_order():
    g = torch.Generator().manual_seed(0)
    parts = torch.randn(2, 3, 2, 5, 7, generator=g)
    dA = torch.randn(3, 6, generator=g)
    du = torch.zeros(1)
    _, _, rA, rB, rC, rD, rbias = rbl.reduce_partials(du, du, parts, dA, dA * 2, None, torch.bfloat16)
    assert torch.equal(rB, parts[0].sum(2, keepdim=True).bfloat16()) and rB.shape == (3, 2, 1, 7)
    assert torch.equal(rC, parts[1].sum(2, keepdim=True).bfloat16())
    assert torch.equal(rA, dA.sum(0)[:, None]) and torch.equal(rD, (dA * 2).sum(0)) and rbias is None


# sm_90 NVRTC spill stores (bytes) of the backward instances that spill at all, held as a ratchet
# (benchmarks/scan_cuda_v4_backward_static.md); every other instance: none. Empty since the running
# du sum moved the register allocation (fp32 56 / 28 and fp16 28 spilled 4 / 8 / 8 bytes before).
KNOWN_SPILLS: dict = {}


@pytest.mark.slow
@pytest.mark.parametrize("width", [56, 28, 14, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_model_instances_compile_within_the_register_budget(width, dtype):
    # V = 4 is compiled for 6 blocks an SM (80 registers; its band buffers allow no more on sm_90),
    # narrower lanes and the saving forward for 8 (64).
    plan = rbl.backward_plan(dtype.itemsize, dtype.itemsize, width)
    name = str(dtype).removeprefix("torch.").replace("float", "fp").replace("bfp16", "bf16")
    limit = 80 if plan.vec == 4 else 64
    instances = [(rbl.backward_spec(plan, dtype), limit, KNOWN_SPILLS.get((name, width), 0)),
                 (rbl.save_spec(plan, dtype), 64, 0)]
    if dtype != torch.float32:  # the fp32 running-sum form of a multi-route op's first routes
        instances.append((rbl.backward_spec(plan, dtype, du_fp32=True), limit, KNOWN_SPILLS.get((name, width), 0)))
    for spec, limit, spills in instances:
        r = nvrtc.compile_kernel(spec, 90, TOOLCHAIN).resources
        assert r.registers <= limit and r.spill_stores <= spills and r.barriers == 0, (spec.name, r)


@pytest.mark.slow
@pytest.mark.parametrize("route", [3, 4, 7])
@pytest.mark.parametrize("width,dtype", [(56, torch.bfloat16), (28, torch.float32), (14, torch.bfloat16)])
def test_other_routes_compile_within_the_register_budget(width, dtype, route):
    # The other pass order and column direction: the same budget as route 0; spills no more than
    # route 0's instance of the plan (KNOWN_SPILLS), 8 bytes more at most.
    plan = rbl.backward_plan(dtype.itemsize, dtype.itemsize, width)
    name = str(dtype).removeprefix("torch.").replace("float", "fp").replace("bfp16", "bf16")
    for spec, limit, spills in ((rbl.backward_spec(plan, dtype, route), 80 if plan.vec == 4 else 64,
                                 KNOWN_SPILLS.get((name, width), 0) + 8), (rbl.save_spec(plan, dtype, route), 64, 0)):
        r = nvrtc.compile_kernel(spec, 90, TOOLCHAIN).resources
        assert r.registers <= limit and r.spill_stores <= spills and r.barriers == 0, (spec.name, r)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 75])
def test_cross_carries_instances_compile_without_spills(arch):
    # 4 columns a lane hold both routes' state in 80 registers (6 blocks per SM), narrower lanes in 64.
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for width in (56, 28, 14, 7):
            plan = rbl.backward_plan(dtype.itemsize, dtype.itemsize, width)
            r = nvrtc.compile_kernel(rbl.cross_save_spec(plan, dtype), arch, TOOLCHAIN).resources
            limit = 80 if plan.vec == 4 else 64
            assert r.registers <= limit and r.spill_stores == 0 and r.stack_bytes == 0, (dtype, width, r)
