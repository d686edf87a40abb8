"""The v4 one-plane-per-lane forward (PL) on the NVRTC path without a GPU: the entry compiles with NVRTC
for sm_75 / sm_80 / sm_90 within 64 registers and without spills, the ctypes parameter block has the
C struct's layout (the C++ compiler's offsetof), the shared-memory mirror equals planes_layout (the
host emulation's), and the launch passes the plan's grid / block / shared memory and the parameter
bytes on the current stream (recording fake driver)."""
from __future__ import annotations

import pytest
import torch

from vmamba2d.ops.compiled import cuda_launch, nvrtc, planes_launch, rows_launch
from vmamba2d.ops.compiled.cuda_kernels import KERNELS, MODEL_MAP_SIDES, planes_kernel

try:
    TOOLCHAIN = nvrtc.find_toolchain()
except nvrtc.NvrtcUnavailable as err:
    pytest.skip(f"no NVRTC toolchain: {err}", allow_module_level=True)

from support.c_layout import ctypes_layout, cxx_layout  # noqa: E402
from support.nvrtc_recording import ATTRIBUTES, recording_launcher, stub_kernel  # noqa: E402

H200 = cuda_launch.DeviceInfo(index=0, arch=90, code_arch=90, sm_count=ATTRIBUTES["MULTIPROCESSOR_COUNT"],
                              smem_per_block=ATTRIBUTES["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"],
                              smem_per_sm=ATTRIBUTES["MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"],
                              reserved_smem_per_block=ATTRIBUTES["RESERVED_SHARED_MEMORY_PER_BLOCK"])


def _compile(spec, arch):
    compiled = nvrtc.compile_kernel(spec, arch, TOOLCHAIN)
    r = compiled.resources
    return compiled, (r.registers, r.spill_stores + r.spill_loads, r.stack_bytes)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [75, 80, 90])
def test_model_entry_compiles_within_64_registers_without_spills(arch):
    # The 7 x 7 model plane, route 0, 16-byte copies, bf16 (the fp32 / fp16 instances: the slow test).
    compiled, (registers, spills, stack) = _compile(planes_kernel("bf16", 7, 7), arch)
    assert compiled.target == nvrtc.Target(arch, "cubin") and compiled.lowered_name == "vmamba2d_planes_forward"
    assert registers <= 64 and spills == 0 and stack == 0


@pytest.mark.slow
@pytest.mark.parametrize("arch", [75, 80, 90])
def test_other_entries_compile_within_64_registers_without_spills(arch):
    specs = [planes_kernel("fp32", 7, 7), planes_kernel("fp16", 7, 7), planes_kernel("fp32", 8, 8, 8, 8),
             planes_kernel("bf16", 1, 64, 5, 4), planes_kernel("fp32", 64, 1, 15), planes_kernel("bf16", 3, 5, 7),
             planes_kernel("fp16", 1, 1, 3)]
    figures = {spec.name: _compile(spec, arch)[1] for spec in specs}
    assert all(r <= 64 and s == 0 and st == 0 for r, s, st in figures.values()), figures


@pytest.mark.slow
def test_params_layout_equals_the_c_struct(tmp_path):
    assert cxx_layout(tmp_path, "scan2d_planes_common.h", "vmamba2d::planes::PlanesParams",
                      planes_launch.PlanesParams) == ctypes_layout(planes_launch.PlanesParams)


def test_shared_memory_mirror_equals_the_layout():
    from support.cuda_emulation_build import planes_emulation

    emulation = planes_emulation()
    cases = [(128, 3072, 1, 7, 7, 3072, 1), (128, 3072, 1, 7, 7, 4 * 3072, 4), (5, 3, 3, 8, 8, 3, 3),
             (2, 200, 8, 1, 64, 800, 32), (9, 70, 7, 3, 5, 70, 7), (1, 1, 1, 1, 1, 1, 1)]
    for batch, dim, groups, height, width, delta_planes, bc_planes in cases:
        for chunk in (128, 64, 32, 7):
            for copy in (16, 8, 4):
                for elem, y_fp32 in ((4, False), (2, False), (2, True)):
                    args = (batch, dim, groups, height, width, delta_planes, bc_planes, chunk, copy, elem, y_fp32)
                    assert planes_launch.smem_bytes(*args) == emulation.planes_smem_bytes(*args), args


def test_plan_rule():
    plan = planes_launch.planes_plan(2, False, 128, 3072, 1, 7, 7, 0, 16, H200.smem_per_block, H200.smem_per_sm,
                                     H200.reserved_smem_per_block)
    # bf16 7 x 7: 2 x (u, delta: 128 x 98 B + 32 B; B, C: 2 planes + 32 B) = 51,264 B, 4 CTAs an SM.
    assert (plan.chunk, plan.copy_bytes, plan.smem, plan.ctas_per_sm) == (128, 16, 51264, 4)
    fp32 = planes_launch.planes_plan(4, False, 128, 3072, 1, 7, 7, 0, 16, H200.smem_per_block, H200.smem_per_sm,
                                     H200.reserved_smem_per_block)
    assert (fp32.chunk, fp32.smem, fp32.ctas_per_sm) == (128, 102208, 2)
    # 64 KiB per CTA (sm_75): fp32 halves the chunk.
    assert planes_launch.planes_plan(4, False, 128, 3072, 1, 7, 7, 0, 16, 65536, 65536).chunk == 64
    assert planes_launch.planes_plan(2, False, 8, 16, 1, 9, 8, 0, 16, 2 ** 20, 2 ** 20) is None  # 72 cells
    assert planes_launch.planes_plan(2, False, 8, 16, 1, 7, 7, 0, 2, 2 ** 20, 2 ** 20) is None  # 2-byte aligned
    assert planes_launch.planes_plan(4, False, 8, 16, 1, 7, 7, 16, 16, 2 ** 20, 2 ** 20) is None  # route 16
    assert planes_launch.planes_plan(4, False, 0, 16, 1, 7, 7, 0, 16, 2 ** 20, 2 ** 20) is None  # no maps
    assert planes_launch.planes_plan(4, False, 8, 0, 1, 7, 7, 0, 16, 2 ** 20, 2 ** 20) is None
    assert plan.grid(128, 3072, 132) == 132 * 4 and plan.grid(2, 64, 132) == 1


def test_copy_width_of_tensors():
    t = torch.zeros(64)
    assert planes_launch.copy_width(t, None) == (16 if t.data_ptr() % 16 == 0 else 4)
    assert planes_launch.copy_width(t[1:], t) == 4
    assert planes_launch.copy_width(t.view(torch.int16)[1:]) == 0


@pytest.fixture()
def launcher(tmp_path):
    return (*recording_launcher(tmp_path, TOOLCHAIN), tmp_path)


@pytest.mark.parametrize("dtype,out_fp32,route", [(torch.bfloat16, False, 0), (torch.float32, False, 7),
                                                  (torch.float16, True, 12)])
def test_launch_passes_plan_grid_and_parameter_block(launcher, dtype, out_fp32, route):
    launcher, driver, folder = launcher
    g = torch.Generator().manual_seed(0)
    batch, dim, groups, height, width = 3, 40, 2, 7, 7
    u, delta = (torch.randn(batch, dim, 49, generator=g).to(dtype) for _ in range(2))
    B, C = (torch.randn(batch, groups, 1, 49, generator=g).to(dtype) for _ in range(2))
    A, D, bias = -torch.rand(dim, 1, generator=g), torch.randn(dim, generator=g), torch.randn(dim, generator=g)
    elem = u.element_size()
    expected = planes_launch.planes_plan(elem, out_fp32, batch, dim, groups, height, width, route,
                                         planes_launch.copy_width(u, delta, B, C), H200.smem_per_block,
                                         H200.smem_per_sm, H200.reserved_smem_per_block)
    stub_kernel(folder, expected.spec(dtype), TOOLCHAIN)
    seen = driver.read_params(planes_launch.PlanesParams)
    y = planes_launch.launch_planes_forward(launcher, H200, u, delta, A, B, C, D, bias, True, height, width, route,
                                            out_fp32)
    assert y.shape == u.shape and y.dtype == (torch.float32 if out_fp32 else dtype)
    (launch,) = driver.of("launch")
    assert launch[1][2] == f"sym_{expected.spec(dtype).file_stem}"
    chunks = -(-batch * dim // expected.chunk)
    assert launch[2:6] == ((chunks, 1, 1), expected.chunk, expected.smem, 1000)
    assert driver.of("smem")[0][2] == H200.smem_per_block  # opted into the device's shared memory
    ((p,),) = seen
    assert (p.u, p.delta, p.B, p.C, p.A, p.D, p.delta_bias, p.y) == tuple(
        t.data_ptr() for t in (u, delta, B, C, A, D, bias, y))
    assert (p.delta_planes, p.bc_planes, p.batch, p.dim, p.groups, p.height, p.width, p.route) == (
        dim, groups, batch, dim, groups, height, width, route)
    assert (p.chunk, p.copy_bytes, p.softplus, p.y_fp32) == (expected.chunk, expected.copy_bytes, 1,
                                                           int(y.dtype == torch.float32))


def test_launch_rejects_what_pl_cannot_run(launcher):
    launcher, _, _ = launcher
    u = torch.zeros(1, 4, 72)
    B = torch.zeros(1, 1, 1, 72)
    with pytest.raises(ValueError, match="9 x 8 map"):
        planes_launch.launch_planes_forward(launcher, H200, u, u, torch.zeros(4, 1), B, B, None, None, True, 9, 8, 0,
                                            False)
    with pytest.raises(ValueError, match="one of fp32"):
        planes_launch.launch_planes_forward(launcher, H200, u.double(), u, torch.zeros(4, 1), B, B, None, None, True,
                                            9, 8, 0, False)


def test_model_maps_launch_exactly_the_precompiled_planes_instances():
    # The PL entries of the precompile table are the instances the single-route op launches for the
    # model's maps with contiguous tensors (7 x 7, route 0, 16-byte copies; the larger maps take RS).
    launched = set()
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for side in MODEL_MAP_SIDES:
            u, delta = (torch.randn(2, 8, side * side, generator=g).to(dtype) for _ in range(2))
            B, C = (torch.randn(2, 1, 1, side * side, generator=g).to(dtype) for _ in range(2))
            A, D, bias = -torch.rand(8, 1, generator=g), torch.randn(8, generator=g), torch.randn(8, generator=g)
            for out_fp32 in (False, True):
                design, plan, why = rows_launch.forward_design(u, delta, A, B, C, D, bias, side, out_fp32, False,
                                                               H200)
                assert design == ("pl" if side * side <= planes_launch.MAX_CELLS else "rs"), why
                if design == "pl":
                    assert KERNELS.get(plan.spec(dtype).name) == plan.spec(dtype)
                    launched.add(plan.spec(dtype).name)
    assert launched == {name for name in KERNELS if name.startswith("planes_forward.")}
