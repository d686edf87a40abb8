"""The v4 row-streaming forward (RS) on the NVRTC path without a GPU: the ctypes parameter block has
the C struct's layout (checked against the C++ compiler's offsetof), the launch passes the plan's
grid / block and the parameter bytes on the current stream (recording fake driver), and the rule
that picks PL, RS or v3 for the single-route op, with the dispatch launching what it picks."""
from __future__ import annotations

import pytest
import torch

from vmamba2d.ops.compiled import cuda_launch, nvrtc, planes_launch, rows_launch, rows_plan
from vmamba2d.ops.compiled.cuda_kernels import KERNELS, MODEL_ROWS_PLANS_BY_DTYPE

try:
    TOOLCHAIN = nvrtc.find_toolchain()
except nvrtc.NvrtcUnavailable as err:
    pytest.skip(f"no NVRTC toolchain: {err}", allow_module_level=True)

from support.c_layout import ctypes_layout, cxx_layout  # noqa: E402
from support.nvrtc_recording import recording_launcher, stub_kernel, stub_kernels  # noqa: E402


def scan_inputs(batch, dim, height, width, dtype=torch.float32, nstate=1, groups=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    L = height * width
    u, delta = (torch.randn(batch, dim, L, generator=g).to(dtype) for _ in range(2))
    B, C = (torch.randn(batch, groups, nstate, L, generator=g).to(dtype) for _ in range(2))
    A = -torch.rand(dim, nstate, generator=g)
    return u, delta, A, B, C, torch.randn(dim, generator=g), torch.randn(dim, generator=g)


def test_params_layout_equals_the_c_struct(tmp_path):
    assert cxx_layout(tmp_path, "scan2d_rows_common.h", "vmamba2d::rows::RowsParams",
                      rows_launch.RowsParams) == ctypes_layout(rows_launch.RowsParams)


@pytest.fixture()
def launcher(tmp_path):
    stub_kernels(tmp_path, {90}, TOOLCHAIN)
    return recording_launcher(tmp_path, TOOLCHAIN)


@pytest.mark.parametrize("dtype,out_fp32", [(torch.float32, False), (torch.bfloat16, True), (torch.float16, False)])
def test_launch_passes_plan_grid_and_parameter_block(launcher, dtype, out_fp32):
    launcher, driver = launcher
    u, delta, A, B, C, D, bias = scan_inputs(5, 24, 14, 14, dtype)
    design, plan, _ = rows_launch.forward_design(u, delta, A, B, C, D, bias, 14, out_fp32, False)
    assert design == "rs" and (plan.vec, plan.seg_lanes, plan.maps_per_warp) == (2, 7, 4)
    seen = driver.read_params(rows_launch.RowsParams)
    y = rows_launch.launch_rows_forward(launcher, u, delta, A, B, C, D, bias, True, 14, 14, out_fp32, plan)
    assert y.shape == u.shape and y.dtype == (torch.float32 if out_fp32 else dtype)
    (launch,) = driver.of("launch")
    spec = rows_launch.plan_spec(plan, dtype)
    assert spec.name in KERNELS  # a model width: precompiled
    assert launch[1][2] == f"sym_{spec.file_stem}"
    maps_per_block = plan.maps_per_warp * 4  # 128 threads: 4 warps
    assert launch[2:6] == ((-(-5 * 24 // maps_per_block), 1, 1), 128, 0, 1000)
    ((p,),) = seen
    pointers = (p.u, p.delta, p.B, p.C, p.A, p.D, p.delta_bias, p.y)
    assert pointers == tuple(t.data_ptr() for t in (u, delta, B, C, A, D, bias, y))
    assert (p.delta_planes, p.bc_planes, p.batch, p.dim, p.groups, p.height, p.width) == (24, 1, 5, 24, 1, 14, 14)
    assert (p.seg_lanes, p.maps_per_warp, p.softplus, p.y_fp32, p.from_bottom) == (7, 4, 1, int(y.dtype == torch.float32), 0)


@pytest.mark.parametrize("width", [56, 28, 14, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_model_widths_take_rs_with_a_precompiled_plan(width, dtype):
    # (7 x 7 takes PL on a GPU -- below --; without a GPU's limits PL is passed over and RS is next.)
    u, delta, A, B, C, D, bias = scan_inputs(2, 8, width, width, dtype)
    for out_fp32 in (False, True):
        design, plan, why = rows_launch.forward_design(u, delta, A, B, C, D, bias, width, out_fp32, False)
        assert design == "rs"
        assert (plan.vec, plan.load, plan.prefetch, plan.scan_steps) in MODEL_ROWS_PLANS_BY_DTYPE[
            {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]]
        assert plan.seg_lanes * plan.vec >= width and plan.seg_lanes <= 32
        assert why.startswith("PL (L = 49 <= 64): no GPU limits given; RS: ") == (width == 7)


@pytest.mark.parametrize("dtype,out_fp32", [(torch.bfloat16, False), (torch.float32, False), (torch.float16, True)])
def test_dispatch_launches_pl_on_small_maps(launcher, tmp_path, dtype, out_fp32):
    launcher, driver = launcher
    device = launcher.device_info(0)
    batch, dim = 3, 40
    u, delta, A, B, C, D, bias = scan_inputs(batch, dim, 7, 7, dtype, groups=2)
    design, plan, why = rows_launch.forward_design(u, delta, A, B, C, D, bias, 7, out_fp32, False, device)
    assert (design, why) == ("pl", "PL: L = 49 <= 64")
    assert plan == planes_launch.planes_plan(u.element_size(), out_fp32, batch, dim, 2, 7, 7, 0,
                                             planes_launch.copy_width(u, delta, B, C), device.smem_per_block,
                                             device.smem_per_sm, device.reserved_smem_per_block)
    stub_kernel(tmp_path, plan.spec(dtype), TOOLCHAIN)
    seen = driver.read_params(planes_launch.PlanesParams)
    y = rows_launch.launch_forward(launcher, device, u, delta, A, B, C, D, bias, True, 7, 7, out_fp32, False)
    assert y.shape == u.shape and y.dtype == (torch.float32 if out_fp32 else dtype)
    (launch,) = driver.of("launch")
    assert launch[1][2] == f"sym_{plan.spec(dtype).file_stem}"
    assert launch[2:6] == ((plan.grid(batch, dim, device.sm_count), 1, 1), plan.chunk, plan.smem, 1000)
    ((p,),) = seen
    assert (p.u, p.delta, p.B, p.C, p.A, p.D, p.delta_bias, p.y) == tuple(
        t.data_ptr() for t in (u, delta, B, C, A, D, bias, y))
    assert (p.batch, p.dim, p.groups, p.height, p.width, p.route, p.chunk, p.copy_bytes, p.y_fp32) == (
        batch, dim, 2, 7, 7, 0, plan.chunk, plan.copy_bytes, int(y.dtype == torch.float32))


def test_dispatch_launches_rs_on_wider_maps_and_nothing_for_v3(launcher):
    launcher, driver = launcher
    device = launcher.device_info(0)
    u, delta, A, B, C, D, bias = scan_inputs(5, 24, 14, 14, torch.bfloat16)
    design, plan, _ = rows_launch.forward_design(u, delta, A, B, C, D, bias, 14, False, False, device)
    assert design == "rs"
    seen = driver.read_params(rows_launch.RowsParams)
    y = rows_launch.launch_forward(launcher, device, u, delta, A, B, C, D, bias, True, 14, 14, False, False)
    (launch,) = driver.of("launch")
    assert launch[1][2] == f"sym_{rows_launch.plan_spec(plan, torch.bfloat16).file_stem}"
    assert launch[2:5] == ((plan.blocks(5, 24), 1, 1), 128, 0)
    p = seen[0][0]
    assert p.y == y.data_ptr() and (p.seg_lanes, p.maps_per_warp) == (plan.seg_lanes, plan.maps_per_warp)
    # v3's calls launch nothing here (the host driver runs them): N = 4, a forward saving carries
    u, delta, A, B, C, D, bias = scan_inputs(2, 8, 7, 7, nstate=4)
    assert rows_launch.launch_forward(launcher, device, u, delta, A, B, C, D, bias, True, 7, 7, False, False) is None
    u, delta, A, B, C, D, bias = scan_inputs(2, 8, 7, 7)
    assert rows_launch.launch_forward(launcher, device, u, delta, A, B, C, D, bias, True, 7, 7, False, True) is None
    assert len(driver.of("launch")) == 1


def test_pl_without_a_plan_passes_the_call_to_rs(launcher):
    launcher, _ = launcher
    device = launcher.device_info(0)
    u, delta, A, B, C, D, bias = scan_inputs(2, 8, 7, 7, torch.bfloat16)
    odd = torch.empty(u.numel() + 1, dtype=u.dtype)[1:].view(u.shape).copy_(u)  # 2-byte aligned: no copy width
    design, plan, why = rows_launch.forward_design(odd, delta, A, B, C, D, bias, 7, False, False, device)
    assert design == "rs" and plan.load == 1
    assert why == ("PL (L = 49 <= 64): no plan for these tensors' alignment or this GPU's shared memory; "
                   "RS: N = 1, width 7 <= 256")
    small = cuda_launch.DeviceInfo(0, 75, 75, 40, 16384, 16384, 0)  # 16 KiB: no chunk of 32 fp32 planes fits
    u, delta, A, B, C, D, bias = scan_inputs(2, 8, 8, 8)
    assert rows_launch.forward_design(u, delta, A, B, C, D, bias, 8, False, False, small)[0] == "rs"
    assert rows_launch.forward_design(u, delta, A, B, C, D, bias, 8, False, False, device)[0] == "pl"


def test_other_calls_stay_on_v3(monkeypatch):
    u, delta, A, B, C, D, bias = scan_inputs(2, 8, 14, 14, nstate=4)
    assert rows_launch.forward_design(u, delta, A, B, C, D, bias, 14, False, False)[0] == "v3"  # N = 4
    u, delta, A, B, C, D, bias = scan_inputs(1, 4, 2, 200)
    assert rows_launch.forward_design(u, delta, A, B, C, D, bias, 200, False, False)[0] == "v3"  # too wide
    u, delta, A, B, C, D, bias = scan_inputs(2, 8, 14, 14)
    design, _, why = rows_launch.forward_design(u, delta, A, B, C, D, bias, 14, False, True)
    assert design == "v3" and "backward" in why  # gradients: the v3 backward needs its carries
    monkeypatch.setenv(rows_launch.PLAN_ENV, "v3")
    assert rows_launch.forward_design(u, delta, A, B, C, D, bias, 14, False, False)[:2] == ("v3", None)
    monkeypatch.setenv(rows_launch.PLAN_ENV, "fastest")
    with pytest.raises(ValueError, match="VMAMBA2D_SCAN_PLAN: expected one of auto, v3"):
        rows_launch.forward_design(u, delta, A, B, C, D, bias, 14, False, False)


def test_grid_covers_every_map():
    plan = rows_plan.rows_plan(4, 4, 56, 0)
    blocks = plan.blocks(128, 192)
    assert blocks * 4 * plan.maps_per_warp >= 128 * 192 > (blocks - 1) * 4 * plan.maps_per_warp
