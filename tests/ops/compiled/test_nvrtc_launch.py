"""The NVRTC kernels' launcher against a recording fake CUDA driver, without a GPU: the right image
per arch, loaded once per device, the planner's grid / threads / shared memory, the parameter
bytes in order, torch's current stream of the launching device."""
from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import pytest

from vmamba2d.ops.compiled import cuda_launch, nvrtc
from support.nvrtc_recording import RecordingDriver, stub_kernels

try:
    TOOLCHAIN = nvrtc.find_toolchain()
except nvrtc.NvrtcUnavailable as err:
    pytest.skip(f"no NVRTC toolchain: {err}", allow_module_level=True)







@pytest.fixture()
def setup(tmp_path):
    newest = max(TOOLCHAIN.archs)
    archs = {0: 90, 1: 86, 2: newest + 10}
    stub_kernels(tmp_path, set(archs.values()), TOOLCHAIN)
    driver = RecordingDriver()
    state = {"device": 0}
    launcher = cuda_launch.KernelLauncher(driver, tmp_path, TOOLCHAIN, current_device=lambda: state["device"],
                                          stream_of=lambda d: 1000 + d, device_arch=archs.__getitem__)
    return launcher, driver, state, newest


def test_launch_passes_plan_and_parameter_bytes_in_order(setup):
    launcher, driver, _, _ = setup
    params, scan = bytes(range(200)) + b"\xff" * 56, b"\x01\x00" + bytes(range(30))
    seen = []
    record = driver.launch

    def read_back(function, grid, threads, smem, stream, pointers):
        array = (ctypes.c_void_p * 2).from_address(pointers)
        seen.append([ctypes.string_at(array[0], len(params)), ctypes.string_at(array[1], len(scan))])
        record(function, grid, threads, smem, stream, pointers)

    driver.launch = read_back
    launcher("carry_scan", "fp32", "kGeneral", (37, 1, 1), 128, 0, [params, scan])
    assert seen == [[params, scan]]
    (launch,) = driver.of("launch")
    assert launch[1] == ("function", ("module", 1), "sym_carry_scan")
    assert launch[2:6] == ((37, 1, 1), 128, 0, 1000)


def test_image_per_device_arch_loaded_once(setup):
    launcher, driver, state, newest = setup
    for device in (0, 0, 1, 2):
        state["device"] = device
        launcher("forward", "bf16", "kOneStateSequential", (8, 24, 1), 128, 33792, [b"p" * 64])
    images = [c[1] for c in driver.of("load")]
    assert images == [b"image forward.bf16.kOneStateSequential cubin 90",
                      b"image forward.bf16.kOneStateSequential cubin 86",
                      f"image forward.bf16.kOneStateSequential ptx {newest}".encode()]
    assert [c[5] for c in driver.of("launch")] == [1000, 1000, 1001, 1002]  # each device's current stream
    assert [c[2] for c in driver.of("smem")] == [232448] * 3  # opted into the device's maximum once each


def test_kernel_name_from_kind_dtype_variant():
    assert cuda_launch.spec_for_launch("backward", "fp16", "kRoute").name == "backward.fp16.kRoute"
    assert cuda_launch.spec_for_launch("carry_scan", "fp32", "kGeneral").name == "carry_scan"
    with pytest.raises(KeyError, match="kernel must be one of"):
        cuda_launch.spec_for_launch("forward", "fp64", "kGeneral")


def test_device_info_for_the_planner(setup):
    launcher, driver, _, newest = setup
    info = launcher.device_info(2)
    assert (info.arch, info.code_arch) == (newest + 10, newest)  # PTX of NVRTC's newest arch
    assert (info.sm_count, info.smem_per_block, info.smem_per_sm, info.reserved_smem_per_block) == (
        132, 232448, 233472, 1024)
    launcher.device_info(2)
    assert len(driver.of("attribute")) == 4  # queried once per device


def test_compile_error_reaches_the_caller(tmp_path):
    toolchain = dataclasses.replace(TOOLCHAIN, kernel_dir=tmp_path / "kernels")
    (tmp_path / "kernels" / "nvrtc_std").mkdir(parents=True)
    (tmp_path / "kernels" / "scan2d_kernels.cuh").write_text("#error the kernel source is broken\n")
    launcher = cuda_launch.KernelLauncher(RecordingDriver(), tmp_path / "cache", toolchain, current_device=lambda: 0,
                                          stream_of=lambda d: 0, device_arch=lambda d: 90)
    with pytest.raises(nvrtc.NvrtcCompileError, match="the kernel source is broken"):
        launcher("carry_scan", "fp32", "kGeneral", (1, 1, 1), 128, 0, [b"x"])


def test_real_driver_adapter_checks_status():
    check = cuda_launch.Driver._check
    assert check((0, "value"), "x") == "value"
    with pytest.raises(RuntimeError, match="cuModuleLoadData failed"):
        check((1, None), "cuModuleLoadData")


@pytest.fixture()
def no_nvcc_extension(monkeypatch):
    """extensions.cuda_extension() as on an install without the nvcc-built vmamba2d._C_cuda."""
    from vmamba2d.ops.compiled import extensions, nvrtc_backend

    built = extensions._import_built
    monkeypatch.setattr(extensions, "_import_built", lambda name: None if name == "vmamba2d._C_cuda" else built(name))
    monkeypatch.setattr(extensions, "_sources", dict(extensions._sources))
    monkeypatch.setattr(extensions, "_failure_reasons", dict(extensions._failure_reasons))
    caches = (extensions.cuda_extension, nvrtc.find_toolchain, nvrtc_backend.nvrtc_kernels)
    for cache in caches:
        cache.cache_clear()
    yield extensions
    for cache in caches:
        cache.cache_clear()


def test_cuda_extension_without_nvcc_build_is_the_nvrtc_path(no_nvcc_extension):
    from vmamba2d.ops.compiled.nvrtc_backend import NvrtcKernels

    extensions = no_nvcc_extension
    assert isinstance(extensions.cuda_extension(), NvrtcKernels)
    assert extensions.extension_source("cuda") == "nvrtc"


@pytest.fixture()
def fake_nvcc_extension(no_nvcc_extension, monkeypatch):
    """extensions.cuda_extension() beside an nvcc-built vmamba2d._C_cuda (a stand-in module)."""
    import types

    extensions = no_nvcc_extension
    built = types.ModuleType("vmamba2d._C_cuda")
    original = extensions._import_built
    monkeypatch.setattr(extensions, "_import_built", lambda name: built if name == "vmamba2d._C_cuda" else original(name))
    return extensions, built


def test_nvcc_build_runs_by_default_and_nvrtc_when_asked(fake_nvcc_extension, monkeypatch):
    from vmamba2d.ops.compiled.nvrtc_backend import NvrtcKernels

    extensions, built = fake_nvcc_extension
    monkeypatch.delenv("VMAMBA2D_CUDA_KERNELS", raising=False)
    assert extensions.cuda_extension() is built and extensions.extension_source("cuda") == "built"
    extensions.cuda_extension.cache_clear()
    monkeypatch.setenv("VMAMBA2D_CUDA_KERNELS", "nvrtc")
    assert isinstance(extensions.cuda_extension(), NvrtcKernels)
    assert extensions.extension_source("cuda") == "nvrtc"
    extensions.cuda_extension.cache_clear()
    monkeypatch.setenv("VMAMBA2D_CUDA_KERNELS", " Built ")
    assert extensions.cuda_extension() is built


def test_built_setting_without_an_nvcc_build_says_so(no_nvcc_extension, monkeypatch):
    extensions = no_nvcc_extension
    monkeypatch.setenv("VMAMBA2D_CUDA_KERNELS", "built")
    assert extensions.cuda_extension() is None
    reason = extensions.failure_reason("cuda")
    assert "VMAMBA2D_CUDA_KERNELS=built" in reason and "VMAMBA2D_NVCC_BUILD=1" in reason


def test_unknown_cuda_kernels_setting_is_refused(no_nvcc_extension, monkeypatch):
    monkeypatch.setenv("VMAMBA2D_CUDA_KERNELS", "ptx")
    with pytest.raises(ValueError, match=r"VMAMBA2D_CUDA_KERNELS: expected one of auto, nvrtc, built, got 'ptx'"):
        no_nvcc_extension.cuda_extension()


def test_missing_headers_name_what_to_install(no_nvcc_extension, monkeypatch):
    extensions = no_nvcc_extension
    monkeypatch.setattr(nvrtc, "cuda_include_candidates", lambda: [Path("/nonexistent/include")])
    assert extensions.cuda_extension() is None
    reason = extensions.failure_reason("cuda")
    assert "no CUDA headers (cuda_fp16.h, cuda_bf16.h) found" in reason and "install a CUDA build of torch" in reason


@pytest.mark.slow
def test_host_driver_launch_shapes_equal_the_emulated_planner():
    """The JIT-built host driver (C++ compiler only) plans and shapes launches as the planner the
    kernels' host emulation runs (tests/support/cuda_emulation_build.py, the nvcc build's _launch_plan)."""
    from support.cuda_emulation_build import v3_emulation

    from vmamba2d.ops.compiled import nvrtc_backend

    planner = v3_emulation()
    host = nvrtc_backend.host_extension()
    sms, per_block, per_sm, reserved = 132, 232448, 233472, 1024
    host.set_device_limits(0, sms, per_block, per_sm, 90, reserved)
    for shape in [(8, 96, 1, 1, 56, 56), (2, 192, 1, 1, 28, 28), (1, 64, 4, 16, 200, 200), (16, 384, 1, 4, 7, 7)]:
        got = host.launch_shapes(*shape, 0)
        plan = planner._launch_plan(*shape, sms, per_sm, per_block, -1, 90)
        for role, key in (("forward", "fwd"), ("backward", "bwd")):
            grid, threads, smem, variant = got[role]
            assert threads == plan[f"{key}_threads"] and smem == plan[f"{key}_smem_bytes"], (shape, role)
            assert grid[0] * grid[1] * grid[2] == plan[f"{key}_blocks"], (shape, role)
            assert variant == plan[f"{key}_variant"], (shape, role)


def test_host_driver_build_failure_is_a_reason_not_a_crash(setup):
    from vmamba2d.ops.compiled.nvrtc_backend import NvrtcKernels

    launcher, _, _, _ = setup

    def no_compiler():
        raise OSError("g++: command not found")

    kernels = NvrtcKernels(launcher, host=no_compiler)
    with pytest.raises(RuntimeError, match="host driver .* could not be built: g\\+\\+: command not found"):
        kernels.kernel_image_available(0)
    assert kernels.kernel_image_arch(1) == 86


def test_host_driver_gets_launcher_and_device_limits_once(setup):
    from vmamba2d.ops.compiled.nvrtc_backend import NvrtcKernels

    launcher, _, _, _ = setup
    calls = []

    class Host:
        def set_launcher(self, fn):
            calls.append(("launcher", fn))

        def set_device_limits(self, *limits):
            calls.append(("limits", limits))

    kernels = NvrtcKernels(launcher, host=Host)
    assert kernels.kernel_image_available(0) and kernels.kernel_image_available(0)
    assert calls == [("launcher", launcher), ("limits", (0, 132, 232448, 233472, 90, 1024))]
